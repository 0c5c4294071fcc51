package canon_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem/canon"
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
			err := canon.CheckIJSON([]byte(tc.doc))
			var ie *canon.Error
			require.True(t, errors.As(err, &ie), "want a canon.Error, got %v", err)
			require.Equal(t, tc.path, ie.Path)
			require.Contains(t, ie.Reason, tc.reason)

			// Canonicalization refuses the same documents: they never get
			// a fingerprint.
			_, err = canon.Fingerprint([]byte(tc.doc))
			require.True(t, errors.As(err, &ie), "Fingerprint must refuse %q, got %v", tc.doc, err)
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
		require.NoError(t, canon.CheckIJSON([]byte(doc)), doc)
	}
}

func TestCheckIJSONRefusesNonJSON(t *testing.T) {
	t.Parallel()
	for _, doc := range []string{``, `{`, `{"a"}`, `[1,]`, `01`, `1.`, `"\x"`, `"\u12"`, `tru`, `{} {}`, "\"a\x01\"", `-`} {
		require.Error(t, canon.CheckIJSON([]byte(doc)), doc)
	}
	deep := strings.Repeat("[", 10001) + strings.Repeat("]", 10001)
	require.ErrorContains(t, canon.CheckIJSON([]byte(deep)), "nested deeper")
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
		a, errA := canon.Fingerprint([]byte(pair[0]))
		b, errB := canon.Fingerprint([]byte(pair[1]))
		require.False(t, errA == nil && errB == nil && a == b, "%q and %q share fingerprint %s", pair[0], pair[1], a)
		require.Error(t, errA, "%q is not I-JSON", pair[0])
	}
}

// BenchmarkCheckIJSON checks the bodies cmd/loadgen sends (a claim, a
// complete) and a larger document with nesting, escapes and non-ASCII
// names. Run with -benchmem.
func BenchmarkCheckIJSON(b *testing.B) {
	for _, bc := range []struct{ name, doc string }{
		{"claim", `{"operation":"POST /v1/payments","request":{"amount":1000,"currency":"usd"}}`},
		{"complete", `{"fencing_token":42,"response":{"status":201,"headers":{"Content-Type":"application/json"},"body":"{\"id\":\"ord_1\"}"}}`},
		{"nested", `{"order":{"id":"ord_8f2a","lines":[{"sku":"A-1","qty":2,"price":19.99},{"sku":"B-7","qty":1,"price":5}],"note":"gift \"wrap\"\n","tags":["x","y"]},"customer":{"name":"Zoë","email":"z@example.com","vip":true,"ref":null},"amount":4498,"currency":"eur","métadata":{"b":1,"a":2}}`},
	} {
		b.Run(bc.name, func(b *testing.B) {
			doc := []byte(bc.doc)
			b.ReportAllocs()
			for b.Loop() {
				if err := canon.CheckIJSON(doc); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
