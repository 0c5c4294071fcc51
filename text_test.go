package idem_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem"
)

// requireFieldError asserts err is an invalid_request naming field.
func requireFieldError(t *testing.T, err error, field string) {
	t.Helper()
	var e *idem.Error
	require.True(t, errors.As(err, &e), "want *idem.Error, got %v", err)
	require.Equal(t, idem.CodeInvalidRequest, e.Code)
	require.Len(t, e.Fields, 1)
	require.Equal(t, field, e.Fields[0].Field)
}

func TestTextRules(t *testing.T) {
	t.Parallel()
	bad := []string{"a\x00b", "\x00", "tab\there", "line\nbreak", "del\x7f", "c1\u0085", "\xff"}
	for _, s := range bad {
		requireFieldError(t, idem.ValidateOperation(s), "operation")
		requireFieldError(t, idem.ValidateFingerprint(s), "fingerprint")
		requireFieldError(t, idem.ValidateRecoveryPoint(s), "recovery_point")
		requireFieldError(t, idem.ValidateTenantName(s), "name")
	}
	for _, s := range []string{"charge.create", "Zahlung anlegen €", "日本語", "sha256:0a"} {
		require.NoError(t, idem.ValidateOperation(s))
		require.NoError(t, idem.ValidateFingerprint(s))
		require.NoError(t, idem.ValidateRecoveryPoint(s))
		require.NoError(t, idem.ValidateTenantName(s))
	}
	require.NoError(t, idem.ValidateOperation(""))
	requireFieldError(t, idem.ValidateRecoveryPoint(""), "recovery_point")
	requireFieldError(t, idem.ValidateFingerprint(""), "fingerprint")
	require.NoError(t, idem.ValidateFingerprint(strings.Repeat("é", idem.MaxFingerprintChars)))
	requireFieldError(t, idem.ValidateFingerprint(strings.Repeat("é", idem.MaxFingerprintChars+1)), "fingerprint")
	requireFieldError(t, idem.ValidateOperation(strings.Repeat("a", idem.MaxOperationBytes+1)), "operation")
	requireFieldError(t, idem.ValidateTenantName(strings.Repeat("a", idem.MaxTenantNameBytes+1)), "name")
}

func TestResponseHeaderRules(t *testing.T) {
	t.Parallel()
	require.NoError(t, idem.ValidateResponseHeaders(map[string]string{
		"Content-Type": "application/json", "X-Tab": "a\tb", "X-Empty": "", "X-Utf8": "café",
	}))
	for _, h := range []map[string]string{
		{"X-Nul": "a\x00b"}, {"X-Cr": "a\rb"}, {"X-Lf": "a\nSet-Cookie: x"}, {"X-Del": "\x7f"},
		{"X-Bad": "\xff"}, {"": "v"}, {"Bad Name": "v"}, {"Bad\x00": "v"}, {"a:b": "v"}, {"é": "v"},
	} {
		requireFieldError(t, idem.ValidateResponseHeaders(h), "response.headers")
	}
	// Of several bad headers the first in name order is named, whatever
	// the map's order.
	several := map[string]string{"Z-Bad": "\x00", "M-Ok": "v", "C-Bad": "\xff", "Bad Name": "v", "D": "\n"}
	for range 20 {
		require.ErrorContains(t, idem.ValidateResponseHeaders(several), `"Bad Name" is not a valid header name`)
	}
	delete(several, "Bad Name")
	for range 20 {
		require.ErrorContains(t, idem.ValidateResponseHeaders(several), "the value of C-Bad must be valid UTF-8")
	}
}

// BenchmarkValidateResponseHeaders is the check of loadgen's one stored
// header.
func BenchmarkValidateResponseHeaders(b *testing.B) {
	h := map[string]string{"Content-Type": "application/json"}
	b.ReportAllocs()
	for b.Loop() {
		if err := idem.ValidateResponseHeaders(h); err != nil {
			b.Fatal(err)
		}
	}
}
