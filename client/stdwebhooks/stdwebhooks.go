// Package stdwebhooks is the one implementation of the Standard Webhooks
// signature (https://www.standardwebhooks.com) in idem: the server signs
// its webhook deliveries and its completer's resume calls with Sign, and
// the SDK's resume handler checks them with Verify. It lives in the SDK
// module, beside errcode, because both modules use it and the SDK must not
// import the server. It imports nothing but the standard library.
//
// Tests that receive idem's webhooks check them with code of their own
// (testkit/webhookreceiver), so a wrong signature cannot agree with itself.
package stdwebhooks

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// SecretPrefix starts every secret: "whsec_" and the base64 of the key.
const SecretPrefix = "whsec_"

// Tolerance is how far a message's webhook-timestamp may be from now (the
// convention's recommendation); older or newer messages are refused.
const Tolerance = 5 * time.Minute

// DecodeSecret returns the key of a secret, "whsec_<base64>" (the prefix
// may be left out).
func DecodeSecret(secret string) ([]byte, error) {
	return base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, SecretPrefix))
}

// Sign returns the webhook-signature header value of a message: "v1," and
// the base64 HMAC-SHA256, keyed by key, of "<id>.<unix seconds>.<body>".
func Sign(key []byte, id string, at time.Time, body []byte) string {
	return "v1," + base64.StdEncoding.EncodeToString(mac(key, id, strconv.FormatInt(at.Unix(), 10), body))
}

// Verify checks a message's signature: the webhook-signature header holds,
// among space-separated "v1,<base64>" entries, the HMAC-SHA256 keyed by
// key of "<webhook-id>.<webhook-timestamp>.<body>", and the timestamp is
// within Tolerance of now. It returns why not.
func Verify(key []byte, h http.Header, body []byte, now time.Time) error {
	id, ts, sigs := h.Get("webhook-id"), h.Get("webhook-timestamp"), h.Get("webhook-signature")
	if id == "" || ts == "" || sigs == "" {
		return errors.New("missing webhook-id, webhook-timestamp or webhook-signature")
	}
	secs, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return errors.New("webhook-timestamp is not unix seconds")
	}
	if d := now.Sub(time.Unix(secs, 0)); d > Tolerance || d < -Tolerance {
		return errors.New("webhook-timestamp is too far from now")
	}
	want := mac(key, id, ts, body)
	for _, s := range strings.Fields(sigs) {
		v, sig, ok := strings.Cut(s, ",")
		if !ok || v != "v1" {
			continue
		}
		got, err := base64.StdEncoding.DecodeString(sig)
		if err == nil && hmac.Equal(got, want) {
			return nil
		}
	}
	return errors.New("no valid signature")
}

// mac is the HMAC-SHA256 keyed by key of "<id>.<ts>.<body>".
func mac(key []byte, id, ts string, body []byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(id + "." + ts + "."))
	m.Write(body)
	return m.Sum(nil)
}
