// Package webhooks delivers the outbox of signed webhook events: a job,
// like the reaper, that claims due deliveries from the store (FOR UPDATE
// SKIP LOCKED on PostgreSQL, the writer slot on SQLite), posts each to its
// endpoint signed per the Standard Webhooks convention, and records the
// outcome with full-jitter retries. Delivery is at least once: a replica
// that dies mid-attempt leaves the delivery to be claimed again after the
// claim's lease, with the same webhook-id, so receivers deduplicate on it.
package webhooks

import (
	"fmt"
	"time"

	"github.com/idem-dev/idem/client/stdwebhooks"
)

// Sign returns the webhook-signature header value for a message: "v1," and
// the base64 HMAC-SHA256, keyed by the secret's decoded key, of
// "<id>.<unix seconds>.<body>".
// The signature is package stdwebhooks', the one the SDK verifies with.
func Sign(secret, id string, at time.Time, body []byte) (string, error) {
	key, err := stdwebhooks.DecodeSecret(secret)
	if err != nil {
		return "", fmt.Errorf("decode webhook secret: %w", err)
	}
	return stdwebhooks.Sign(key, id, at, body), nil
}
