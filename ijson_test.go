package idem_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem"
)

// TestCheckIJSONRefuses holds the vectors of documents encoding/json accepts
// silently but that are not I-JSON, with the path the error must name.
func TestCheckIJSONRefuses(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, doc, path, reason string
	}{
		{"duplicate member", `{"amount":1000,"amount":1}`, "amount", "more than once"},
		{"duplicate after unescaping", `{"a":1,"\u0061":2}`, "a", "more than once"},
		{"nested duplicate", `{"request":{"x":[{"k":1,"k":1}]}}`, "request.x[0].k", "more than once"},
		{"invalid utf-8 value", "{\"name\":\"\xff\"}", "name", "not valid UTF-8"},
		{"invalid utf-8 name", "{\"\xfe\":1}", "", "not valid UTF-8"},
		{"utf-8 encoded surrogate", "\"\xed\xa0\x80\"", "", "not valid UTF-8"},
		{"overlong encoding", "\"\xc0\xaf\"", "", "not valid UTF-8"},
		{"lone high surrogate", `"\ud800"`, "", "lone UTF-16 surrogate \\ud800"},
		{"lone low surrogate", `{"s":"\udc00"}`, "s", "lone UTF-16 surrogate \\udc00"},
		{"high surrogate then text", `["\ud83dx"]`, "[0]", "lone UTF-16 surrogate"},
		{"two high surrogates", `"\ud83d\ud83d"`, "", "lone UTF-16 surrogate"},
		{"lone surrogate in a name", `{"\udfff":1}`, "", "lone UTF-16 surrogate"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := idem.CheckIJSON([]byte(tc.doc))
			var ie *idem.IJSONError
			require.True(t, errors.As(err, &ie), "want an IJSONError, got %v", err)
			require.Equal(t, tc.path, ie.Path)
			require.Contains(t, ie.Reason, tc.reason)

			// Canonicalization refuses the same documents: they never get
			// a fingerprint.
			_, err = idem.FingerprintJSON([]byte(tc.doc))
			require.True(t, errors.As(err, &ie), "FingerprintJSON must refuse %q, got %v", tc.doc, err)
		})
	}
}

func TestCheckIJSONAccepts(t *testing.T) {
	t.Parallel()
	for _, doc := range []string{
		`{}`, `[]`, `null`, ` true `, `-0.5e+3`, `"\ud83d\ude00"`, "\"\U0001F600\"", `"\u0000"`,
		`{"a":{"a":{"a":1}},"b":[{"a":1},{"a":2}]}`, `{"":1,"\u0000":2}`, `"\ufffd"`, "\"\uFFFD\"",
		`{"A":1,"a":2}`, `"\/"`,
	} {
		require.NoError(t, idem.CheckIJSON([]byte(doc)), doc)
	}
}

func TestCheckIJSONRefusesNonJSON(t *testing.T) {
	t.Parallel()
	for _, doc := range []string{``, `{`, `{"a"}`, `[1,]`, `01`, `1.`, `"\x"`, `"\u12"`, `tru`, `{} {}`, "\"a\x01\"", `-`} {
		require.Error(t, idem.CheckIJSON([]byte(doc)), doc)
	}
	deep := strings.Repeat("[", 10001) + strings.Repeat("]", 10001)
	require.ErrorContains(t, idem.CheckIJSON([]byte(deep)), "nested deeper")
}

// TestFingerprintsOfDifferentPayloadsDiffer is the fingerprint collision of
// issue 9 item 10: before, {"amount":1000,"amount":1} fingerprinted like
// {"amount":1}, and "\xff" like "\xfe".
func TestFingerprintsOfDifferentPayloadsDiffer(t *testing.T) {
	t.Parallel()
	for _, pair := range [][2]string{
		{`{"amount":1000,"amount":1}`, `{"amount":1}`},
		{"{\"name\":\"\xff\"}", "{\"name\":\"\xfe\"}"},
		{`{"name":"\ud800"}`, `{"name":"\ufffd"}`},
	} {
		a, errA := idem.FingerprintJSON([]byte(pair[0]))
		b, errB := idem.FingerprintJSON([]byte(pair[1]))
		require.False(t, errA == nil && errB == nil && a == b, "%q and %q share fingerprint %s", pair[0], pair[1], a)
		require.Error(t, errA, "%q is not I-JSON", pair[0])
	}
}
