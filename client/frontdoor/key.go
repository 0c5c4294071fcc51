// Package frontdoor holds the rules every idem "front door" follows: the
// pieces that give an existing HTTP handler Stripe-style Idempotency-Key
// semantics (draft-ietf-httpapi-idempotency-key-header). The gateway
// (`server gateway`) and the net/http middleware client/idemhttp both use
// it, so the two cannot drift; the Python and Node middleware follow the
// same rules, proven by the shared vectors in testvectors/frontdoor/ of the
// repository. The rules are written down, numbered, in docs/frontdoor.md of
// the repository.
//
// The package decides, it does not store: parsing the Idempotency-Key
// header (RFC 8941 sf-string or the bare Stripe form), which requests need
// a key, key scope, the operation label and the fingerprint document, which
// answers are stored and which headers with them, and the RFC 9457 problem
// bodies of every refusal. The fingerprint itself is
// idem.FingerprintJSON(document) (RFC 8785 JCS + SHA-256): the gateway
// computes it locally, the SDK middleware send the document as a claim's
// "request" and let the server compute it. The package uses the standard
// library only, so the client module never depends on the server.
package frontdoor

import (
	"fmt"
	"strings"
)

// Header names of the front door.
const (
	// HeaderKey carries the caller's idempotency key.
	HeaderKey = "Idempotency-Key"
	// HeaderReplayed is set to "true" on every replayed response.
	HeaderReplayed = "Idempotent-Replayed"
	// HeaderRequestID carries the request id named in problem instances.
	HeaderRequestID = "X-Request-Id"
)

// MaxKeyBytes is the longest record key idem accepts, scope included.
const MaxKeyBytes = 255

// ParseKey parses the Idempotency-Key field values of a request (all of
// them, as http.Header.Values returns them) into the key. It returns
// ("", nil) when there is no field at all, and an *Error with
// CodeInvalidKey for two fields, an empty value, a malformed sf-string, a
// list, or a key that is not 1–255 bytes of printable ASCII (0x21–0x7E).
//
// The draft defines the field as an RFC 8941 sf-string ("…"); Stripe
// clients send the bare value. Both are accepted and `"k"` and `k` are the
// same key, so a client that switches form cannot run the work twice.
func ParseKey(values []string) (string, error) {
	switch len(values) {
	case 0:
		return "", nil
	case 1:
	default:
		return "", invalidKey("the request carries %d %s fields; send exactly one", len(values), HeaderKey)
	}
	v := strings.Trim(values[0], " \t")
	if v == "" {
		return "", invalidKey("the %s field is empty", HeaderKey)
	}
	var key string
	if v[0] == '"' {
		k, err := parseSFString(v)
		if err != nil {
			return "", err
		}
		key = k
	} else {
		for i := 0; i < len(v); i++ {
			switch c := v[i]; {
			case c == ',':
				return "", invalidKey("the %s field holds a list (a comma); send one key", HeaderKey)
			case c == '"':
				return "", invalidKey("byte %d of the %s field is a stray quote; quote the whole key or none of it", i, HeaderKey)
			case c < 0x21 || c > 0x7E:
				return "", invalidKey("byte %d of the %s field (0x%02X) is outside printable ASCII 0x21-0x7E", i, HeaderKey, c)
			}
		}
		key = v
	}
	if err := ValidateKey(key); err != nil {
		return "", err
	}
	return key, nil
}

// parseSFString parses an RFC 8941 sf-string that must fill the whole value.
func parseSFString(v string) (string, error) {
	var b strings.Builder
	for i := 1; i < len(v); i++ {
		c := v[i]
		switch {
		case c == '\\':
			i++
			if i == len(v) || (v[i] != '"' && v[i] != '\\') {
				return "", invalidKey("the quoted %s has a backslash that escapes neither '\"' nor '\\'", HeaderKey)
			}
			b.WriteByte(v[i])
		case c == '"':
			if i != len(v)-1 {
				return "", invalidKey("the quoted %s has characters after its closing quote", HeaderKey)
			}
			return b.String(), nil
		case c < 0x20 || c > 0x7E:
			return "", invalidKey("byte %d of the quoted %s (0x%02X) is outside 0x20-0x7E", i, HeaderKey, c)
		default:
			b.WriteByte(c)
		}
	}
	return "", invalidKey("the quoted %s has no closing quote", HeaderKey)
}

// ValidateKey checks a record key the way the idem service does: 1–255
// bytes, each printable ASCII (0x21–0x7E).
func ValidateKey(key string) error {
	if key == "" {
		return invalidKey("the key is empty")
	}
	if len(key) > MaxKeyBytes {
		return invalidKey("the key is %d bytes long; at most %d are allowed", len(key), MaxKeyBytes)
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; c < 0x21 || c > 0x7E {
			return invalidKey("byte %d of the key (0x%02X) is outside printable ASCII 0x21-0x7E", i, c)
		}
	}
	return nil
}

// ScopedKey returns the record key of key within scope: key itself when
// scope is empty, else EscapeScope(scope) + ":" + key, which must still be
// a valid key. A scope (the caller's account, say) keeps the keys of
// different callers of one API apart inside one idem tenant.
//
// An unscoped key must not contain ":" (CodeInvalidKey): every record key
// with a ":" belongs to a scope, and an unscoped "alice:sq" would be
// alice's key "sq", written by anyone (without her token, from a route or
// front door that is not scoped): her own request would then answer 422,
// or get the squatter's answer. Refusing such keys, rather than encoding
// them anew, keeps the meaning of every key claimed before this rule: a
// scoped key and an unscoped key without ":" are the record keys they
// were, so no retry across the upgrade runs twice; an unscoped key with
// ":" retried across it is refused, not run again.
func ScopedKey(scope, key string) (string, error) {
	if scope == "" {
		if i := strings.IndexByte(key, ':'); i >= 0 {
			return "", invalidKey("byte %d of the unscoped key is ':', which only a scoped record key (scope:key) may hold: an unscoped key with ':' could be another caller's scoped key; use a key without ':' (a UUID, say)", i)
		}
		return key, nil
	}
	k := EscapeScope(scope) + ":" + key
	if err := ValidateKey(k); err != nil {
		return "", invalidKey("the key scoped to the caller is invalid: %s", err.(*Error).Detail)
	}
	return k, nil
}

// EscapeScope returns scope with "%" written "%25" and ":" written "%3A",
// so that the first ":" of a scoped key ends the scope: without it the
// scope "acct" with the key "b:k1" and the scope "acct:b" with the key
// "k1" were one record key, and one caller got the other's stored
// response. A scope with neither character is kept as it is.
func EscapeScope(scope string) string {
	if !strings.ContainsAny(scope, "%:") {
		return scope
	}
	return strings.NewReplacer("%", "%25", ":", "%3A").Replace(scope)
}

func invalidKey(format string, args ...any) *Error {
	return &Error{Code: CodeInvalidKey, Detail: fmt.Sprintf(format, args...)}
}
