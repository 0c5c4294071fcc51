// Package webhooks delivers the outbox of signed webhook events: a job,
// like the reaper, that claims due deliveries from the store (FOR UPDATE
// SKIP LOCKED on PostgreSQL, the writer slot on SQLite), posts each to its
// endpoint signed per the Standard Webhooks convention, and records the
// outcome with full-jitter retries. Delivery is at least once: a replica
// that dies mid-attempt leaves the delivery to be claimed again after the
// claim's lease, with the same webhook-id, so receivers deduplicate on it.
package webhooks

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/idem-dev/idem"
)

// Sign returns the webhook-signature header value for a message: "v1," and
// the base64 HMAC-SHA256, keyed by the secret's decoded key, of
// "<id>.<unix seconds>.<body>".
func Sign(secret, id string, at time.Time, body []byte) (string, error) {
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, idem.WebhookSecretPrefix))
	if err != nil {
		return "", fmt.Errorf("decode webhook secret: %w", err)
	}
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(id))
	mac.Write([]byte{'.'})
	mac.Write([]byte(strconv.FormatInt(at.Unix(), 10)))
	mac.Write([]byte{'.'})
	mac.Write(body)
	return "v1," + base64.StdEncoding.EncodeToString(mac.Sum(nil)), nil
}
