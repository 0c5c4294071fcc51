package idem

import (
	"fmt"
	"maps"
	"slices"
	"unicode/utf8"
)

// The text a caller sends is stored and shown again: operation,
// fingerprint, recovery point, tenant name and the headers of a stored
// response. The rules below keep it printable and storable on every engine:
// PostgreSQL refuses NUL in text and jsonb (a 500 if it reached the store),
// SQLite would keep it, and control characters in labels only confuse the
// logs and pages that show them. They are checked here, once, before any
// store call.

// invalidField is the invalid_request *Error naming one field.
func invalidField(field, message string) *Error {
	return &Error{
		Code:   CodeInvalidRequest,
		Detail: field + " " + message,
		Fields: []FieldError{{Field: field, Message: message}},
	}
}

// controlChar returns the first control character of s: C0 (U+0000-U+001F),
// DEL (U+007F) and, unless c1 is false, C1 (U+0080-U+009F).
func controlChar(s string, c1 bool) (rune, bool) {
	for _, r := range s {
		if r < 0x20 || r == 0x7F || c1 && r >= 0x80 && r <= 0x9F {
			return r, true
		}
	}
	return 0, false
}

// checkLabel checks a label: valid UTF-8, no control character, at most
// maxBytes bytes.
func checkLabel(field, s string, maxBytes int) error {
	if len(s) > maxBytes {
		return invalidField(field, fmt.Sprintf("must be at most %d bytes", maxBytes))
	}
	if !utf8.ValidString(s) {
		return invalidField(field, "must be valid UTF-8")
	}
	if r, ok := controlChar(s, true); ok {
		return invalidField(field, fmt.Sprintf("must not contain control characters (found U+%04X)", r))
	}
	return nil
}

// ValidateOperation checks an operation label: at most 128 bytes of UTF-8
// without control characters. It returns an invalid_request *Error naming
// "operation", or nil.
func ValidateOperation(op string) error {
	return checkLabel("operation", op, MaxOperationBytes)
}

// ValidateFingerprint checks a caller-computed fingerprint: 1-256 characters
// of UTF-8 without control characters. It returns an invalid_request *Error
// naming "fingerprint", or nil.
func ValidateFingerprint(fp string) error {
	if n := utf8.RuneCountInString(fp); n < 1 || n > MaxFingerprintChars {
		return invalidField("fingerprint", fmt.Sprintf("must be 1-%d characters", MaxFingerprintChars))
	}
	return checkLabel("fingerprint", fp, 4*MaxFingerprintChars)
}

// ValidateRecoveryPoint checks a checkpoint's phase name: required, at most
// 128 bytes of UTF-8 without control characters. It returns an
// invalid_request *Error naming "recovery_point", or nil.
func ValidateRecoveryPoint(rp string) error {
	if rp == "" {
		return invalidField("recovery_point", "is required")
	}
	return checkLabel("recovery_point", rp, MaxRecoveryPointBytes)
}

// ValidateAttemptID checks a claim's client-chosen attempt id: 1-64 bytes,
// each printable ASCII (0x21-0x7E), like a key: a UUID or any opaque token
// the client keeps for one attempt. It returns an invalid_request *Error
// naming "attempt_id", or nil.
func ValidateAttemptID(id string) error {
	if id == "" || len(id) > MaxAttemptIDBytes {
		return invalidField("attempt_id", fmt.Sprintf("must be 1-%d bytes", MaxAttemptIDBytes))
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; c < 0x21 || c > 0x7E {
			return invalidField("attempt_id", fmt.Sprintf("byte %d (0x%02X) is outside printable ASCII 0x21-0x7E", i, c))
		}
	}
	return nil
}

// ValidateTenantName checks a tenant's display name: at most 256 bytes of
// UTF-8 without control characters. It returns an invalid_request *Error
// naming "name", or nil.
func ValidateTenantName(name string) error {
	return checkLabel("name", name, MaxTenantNameBytes)
}

// ValidateResponseStatus checks the status of a response to store:
// 100–599 (openapi.yaml, StoredResponse.status), the statuses a replay can
// send and the API can show. It returns an invalid_request *Error naming
// "response.status", or nil. The API and the CLI check it first; both
// stores check it again on every completion (CompleteParams.Validate,
// ResolveParams.Validate), so no caller that talks to a store directly
// (the gateway) can store a status the API would not serve.
func ValidateResponseStatus(status int) error {
	if status < 100 || status > 599 {
		return invalidField("response.status", "must be between 100 and 599")
	}
	return nil
}

// ValidateResponseHeaders checks the headers of a response to store: every
// name an HTTP token (RFC 9110 §5.1), every value valid UTF-8 without
// control characters other than horizontal tab (RFC 9110 §5.5 forbids NUL,
// CR and LF; a replayed header must be sendable as it was stored). It
// returns an invalid_request *Error naming "response.headers", or nil.
func ValidateResponseHeaders(h map[string]string) error {
	bad := false
	for name, v := range h {
		if headerProblem(name, v) != "" {
			bad = true
			break
		}
	}
	if !bad {
		return nil
	}
	// Name the first bad header in name order, so the answer does not
	// depend on the map's order.
	for _, name := range slices.Sorted(maps.Keys(h)) {
		if problem := headerProblem(name, h[name]); problem != "" {
			return invalidField("response.headers", problem)
		}
	}
	return nil
}

// headerProblem says what is wrong with the header name: v, or "".
func headerProblem(name, v string) string {
	if !validHeaderName(name) {
		return fmt.Sprintf("%q is not a valid header name", name)
	}
	if !utf8.ValidString(v) {
		return fmt.Sprintf("the value of %s must be valid UTF-8", name)
	}
	for _, r := range v {
		if r != '\t' && (r < 0x20 || r == 0x7F) {
			return fmt.Sprintf("the value of %s must not contain control characters (found U+%04X)", name, r)
		}
	}
	return ""
}

// validHeaderName reports whether name is an HTTP token: one or more
// visible ASCII characters other than the delimiters.
func validHeaderName(name string) bool {
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if c <= ' ' || c >= 0x7F || c == '"' || c == '(' || c == ')' || c == ',' || c == '/' ||
			c == ':' || c == ';' || c == '<' || c == '=' || c == '>' || c == '?' || c == '@' ||
			c == '[' || c == '\\' || c == ']' || c == '{' || c == '}' {
			return false
		}
	}
	return true
}

// ValidateKey checks an idempotency key: 1–255 bytes, each in 0x21–0x7E. It
// returns an invalid_key *Error or nil.
func ValidateKey(key string) error {
	if key == "" {
		return Errorf(CodeInvalidKey, "the key is empty")
	}
	if len(key) > MaxKeyBytes {
		return Errorf(CodeInvalidKey, "the key is %d bytes long; at most %d are allowed", len(key), MaxKeyBytes)
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; c < 0x21 || c > 0x7E {
			return Errorf(CodeInvalidKey, "byte %d of the key (0x%02X) is outside printable ASCII 0x21-0x7E", i, c)
		}
	}
	return nil
}
