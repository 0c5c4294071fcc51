package client

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
)

// MaxKeyBytes is the longest key the service accepts.
const MaxKeyBytes = 255

// keySeparator joins the parts of a key built by Key.
const keySeparator = ':'

// ValidateKey checks a key the way the service does: 1–255 bytes, each
// printable ASCII (0x21–0x7E). It returns an *Error matching ErrInvalidKey,
// or nil.
func ValidateKey(key string) error {
	if key == "" {
		return invalidKey("the key is empty")
	}
	if len(key) > MaxKeyBytes {
		return invalidKey(fmt.Sprintf("the key is %d bytes long; at most %d are allowed", len(key), MaxKeyBytes))
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; c < 0x21 || c > 0x7E {
			return invalidKey(fmt.Sprintf("byte %d of the key (0x%02X) is outside printable ASCII 0x21-0x7E", i, c))
		}
	}
	return nil
}

// invalidKey returns the *Error matching ErrInvalidKey with detail.
func invalidKey(detail string) *Error {
	return &Error{Code: CodeInvalidKey, Title: "Invalid key", Detail: detail}
}

// Key builds an idempotency key from the parts that identify one business
// intent, e.g. Key("order-confirm", orderID) gives "order-confirm:ord_42".
// Derive keys from the event being handled (an order id, a message id, the
// caller's own Idempotency-Key), never from a random value minted per
// attempt: a retry must send the same key, or the service cannot recognise
// it.
//
// Parts are joined with ':'. Inside a part, ':', '%' and every byte outside
// printable ASCII are percent-encoded, so different part lists never give
// the same key. A result longer than 255 bytes is shortened
// deterministically: its first 183 bytes, then ":sha256=" and the
// hex SHA-256 of the whole unshortened key. An empty part or no part at all
// is an error (an empty order id is a bug that would merge intents).
func Key(parts ...string) (string, error) {
	if len(parts) == 0 {
		return "", invalidKey("a key needs at least one part")
	}
	var b strings.Builder
	for i, p := range parts {
		if p == "" {
			return "", invalidKey(fmt.Sprintf("part %d of the key is empty", i))
		}
		if i > 0 {
			b.WriteByte(keySeparator)
		}
		for j := 0; j < len(p); j++ {
			c := p[j]
			if c < 0x21 || c > 0x7E || c == keySeparator || c == '%' {
				fmt.Fprintf(&b, "%%%02X", c)
				continue
			}
			b.WriteByte(c)
		}
	}
	key := b.String()
	if len(key) > MaxKeyBytes {
		sum := sha256.Sum256([]byte(key))
		const suffix = ":sha256="
		keep := MaxKeyBytes - len(suffix) - 2*sha256.Size
		key = key[:keep] + suffix + hex.EncodeToString(sum[:])
	}
	return key, nil
}
