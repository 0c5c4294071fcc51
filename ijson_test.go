package idem_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
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
				if err := idem.CheckIJSON(doc); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// checkIJSONMatches fails t unless CheckIJSON says of doc exactly what the
// earlier scanner (which built every path as it went) says: no error, or
// the same path and reason.
func checkIJSONMatches(t *testing.T, doc []byte) {
	t.Helper()
	got, want := idem.CheckIJSON(doc), idem.CheckIJSONReference(doc)
	if (got == nil) != (want == nil) || got != nil && got.Error() != want.Error() {
		t.Fatalf("CheckIJSON(%q) = %v, reference %v", doc, got, want)
	}
}

// TestCheckIJSONMatchesReference compares CheckIJSON with the earlier
// scanner on random documents and on each broken at random (see
// TestCanonicalOnePassMatches), on objects with many members (a duplicate
// early, late or none) and on nesting too deep.
func TestCheckIJSONMatchesReference(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(14, 2))
	refused := 0
	for range 4000 {
		doc := randomJSON(rng, nil, 0)
		for _, d := range [][]byte{doc, mutateJSON(rng, doc)} {
			checkIJSONMatches(t, d)
			if idem.CheckIJSON(d) != nil {
				refused++
			}
		}
	}
	require.Greater(t, refused, 1000)
	for _, n := range []int{15, 16, 17, 40} {
		for _, dup := range []int{-1, 1, n / 2, n - 1} {
			var b strings.Builder
			b.WriteString(`{"outer":[{`)
			for i := range n {
				if i > 0 {
					b.WriteByte(',')
				}
				name := i
				if i == dup {
					name = 0
				}
				fmt.Fprintf(&b, `"m%d":{"x":%d}`, name, i)
			}
			b.WriteString(`}]}`)
			checkIJSONMatches(t, []byte(b.String()))
		}
	}
	for _, deep := range []string{strings.Repeat("[", 10001) + strings.Repeat("]", 10001), strings.Repeat(`{"a":`, 10001) + "1" + strings.Repeat("}", 10001)} {
		checkIJSONMatches(t, []byte(deep))
	}
}
