package canon_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"slices"
	"testing"
	"unicode/utf16"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem/canon"
)

func TestJSON(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, in, want string
	}{
		{"sorted members, no white space", `{ "b": 1, "a": [true, false, null] }`, `{"a":[true,false,null],"b":1}`},
		{"nested objects sorted", `{"z":{"y":1,"x":2},"a":{}}`, `{"a":{},"z":{"x":2,"y":1}}`},
		// RFC 8785 §3.2.3: members sorted by UTF-16 code units, so U+1F600
		// (surrogates D83D DE00) sorts before U+FB01 even though its code
		// point is larger.
		{"utf16 member order", `{"\ufb01":1,"\ud83d\ude00":2}`, "{\"\U0001F600\":2,\"\ufb01\":1}"},
		{"integer spelled as float", `1.0`, `1`},
		{"negative zero", `-0.0`, `0`},
		{"exponent large", `1e21`, `1e+21`},
		{"below exponent threshold", `1e20`, `100000000000000000000`},
		{"small exponent", `0.0000001`, `1e-7`},
		{"shortest round trip", `0.1`, `0.1`},
		{"rfc 8785 sample number", `333333333.33333329`, `333333333.3333333`},
		{"escapes", `"\u0008\u0009\u000a\u000c\u000d\"\\\u001f/"`, `"\b\t\n\f\r\"\\\u001f/"`},
		{"no html escaping", `"<&>"`, `"<&>"`},
		{"non-ascii literal", `"\u20ac"`, `"€"`},
		{"integer beyond 2^53 rounds to a double", `9007199254740993`, `9007199254740992`},
		{"large integer", `123456789012345678901234567890`, `1.2345678901234568e+29`},
		{"negative zero integer", `-0`, `0`},
		{"smallest subnormal", `5e-324`, `5e-324`},
		{"underflow to zero", `1e-400`, `0`},
		{"largest double", `1.7976931348623157e308`, `1.7976931348623157e+308`},
		{"white space around the value", " \t\n{\"a\" : 1}\r\n", `{"a":1}`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := canon.JSON([]byte(tc.in))
			require.NoError(t, err)
			require.Equal(t, tc.want, string(got))
		})
	}
}

func TestJSONRejectsInvalid(t *testing.T) {
	t.Parallel()
	for _, in := range []string{``, ` `, `{`, `{"a":1} {"b":2}`, `1 2`, `1e400`, `nul`} {
		_, err := canon.JSON([]byte(in))
		require.Error(t, err, "input %q", in)
	}
}

// TestJSONRefusesNumbersBeyondDouble: Canonicalize alone would write 1e400
// as the largest double, so {"n":1e400} and {"n":1.7976931348623157e308}
// would share a fingerprint; they are refused, with the path.
func TestJSONRefusesNumbersBeyondDouble(t *testing.T) {
	t.Parallel()
	for doc, path := range map[string]string{`1e400`: "", `[1,{"a":[2,-1e400]}]`: "[1].a[1]", `{"n":1e400,"m":1.7976931348623157e308}`: "n"} {
		_, err := canon.Fingerprint([]byte(doc))
		var ce *canon.Error
		require.True(t, errors.As(err, &ce), "%s: %v", doc, err)
		require.Equal(t, path, ce.Path, doc)
		require.Contains(t, ce.Reason, "outside the IEEE 754 double range")
		require.NoError(t, canon.CheckIJSON([]byte(doc)), "I-JSON only advises against such numbers")
	}
	_, err := canon.Fingerprint([]byte(`{"n":1.7976931348623157e308,"s":"1.7976931348623157e+308"}`))
	require.NoError(t, err, "the largest double itself is a number like any other")
}

// TestFingerprintLeavesInputAlone: the library canonicalizes in place; the
// caller's bytes (a request body kept to be stored) must not change.
func TestFingerprintLeavesInputAlone(t *testing.T) {
	t.Parallel()
	doc := []byte(`{ "b": 1.0, "a": "\u20ac" }`)
	before := slices.Clone(doc)
	_, err := canon.Fingerprint(doc)
	require.NoError(t, err)
	require.Equal(t, before, doc)
}

func TestFingerprint(t *testing.T) {
	t.Parallel()
	a, err := canon.Fingerprint(json.RawMessage(`{"amount": 1000, "currency": "usd"}`))
	require.NoError(t, err)
	b, err := canon.Fingerprint(json.RawMessage(`{"currency":"usd","amount":1000.0}`))
	require.NoError(t, err)
	c, err := canon.Fingerprint(json.RawMessage(`{"currency":"usd","amount":1001}`))
	require.NoError(t, err)

	require.Equal(t, a, b, "key order, spacing and number spelling must not change the fingerprint")
	require.NotEqual(t, a, c)
	// printf %s '{"amount":1000,"currency":"usd"}' | sha256sum
	require.Equal(t, "sha256:a223b60dc6adbc2911e7c073889b220df1181c5534fa6be58c3a70981c354c54", a)
}

// TestJSONOrdersByUTF16: object members come out ordered by their
// UTF-16 code units (RFC 8785 §3.2.3), which differs from code point order
// where a character above U+FFFF (a surrogate pair, 0xD800..) meets one in
// U+E000..U+FFFF; checked on random objects whose member names mix such
// characters, against utf16.Encode.
func TestJSONOrdersByUTF16(t *testing.T) {
	t.Parallel()
	alphabet := []rune{'a', 'b', 'é', '\u00ff', '\u0100', '\ud7ff', '\ue000', '\uffef', '\U00010000', '\U0001f600', '\U0010ffff'}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		members := map[string]int{}
		for i := range 1 + rng.IntN(8) {
			name := make([]rune, rng.IntN(4))
			for j := range name {
				name[j] = alphabet[rng.IntN(len(alphabet))]
			}
			members[string(name)] = i
		}
		doc, err := json.Marshal(members)
		require.NoError(t, err)
		canon, err := canon.JSON(doc)
		require.NoError(t, err)
		dec := json.NewDecoder(bytes.NewReader(canon))
		_, err = dec.Token() // {
		require.NoError(t, err)
		var names []string
		for dec.More() {
			tok, err := dec.Token()
			require.NoError(t, err)
			names = append(names, tok.(string))
			var v any
			require.NoError(t, dec.Decode(&v))
		}
		require.Len(t, names, len(members))
		require.Truef(t, slices.IsSortedFunc(names, func(a, b string) int {
			return slices.Compare(utf16.Encode([]rune(a)), utf16.Encode([]rune(b)))
		}), "members of %s not in UTF-16 order: %q", canon, names)
	}
}

// BenchmarkFingerprint is the server's fingerprint of a claim's request
// (the one cmd/loadgen sends) and of a larger document with nesting,
// escapes and non-ASCII names. Run with -benchmem.
func BenchmarkFingerprint(b *testing.B) {
	for _, bc := range []struct{ name, doc string }{
		{"loadgen", `{"amount":1000,"currency":"usd"}`},
		{"nested", `{"order":{"id":"ord_8f2a","lines":[{"sku":"A-1","qty":2,"price":19.99},{"sku":"B-7","qty":1,"price":5}],"note":"gift \"wrap\"\n","tags":["x","y"]},"customer":{"name":"Zoë","email":"z@example.com","vip":true,"ref":null},"amount":4498,"currency":"eur","métadata":{"b":1,"a":2}}`},
	} {
		b.Run(bc.name, func(b *testing.B) {
			doc := []byte(bc.doc)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := canon.Fingerprint(doc); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
