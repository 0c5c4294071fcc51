package idem_test

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"slices"
	"testing"
	"unicode/utf16"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem"
)

func TestCanonicalJSON(t *testing.T) {
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
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := idem.CanonicalJSON([]byte(tc.in))
			require.NoError(t, err)
			require.Equal(t, tc.want, string(got))
		})
	}
}

func TestCanonicalJSONRejectsInvalid(t *testing.T) {
	t.Parallel()
	for _, in := range []string{``, `{`, `{"a":1} {"b":2}`, `1e400`, `nul`} {
		_, err := idem.CanonicalJSON([]byte(in))
		require.Error(t, err, "input %q", in)
	}
}

func TestFingerprintJSON(t *testing.T) {
	t.Parallel()
	a, err := idem.FingerprintJSON(json.RawMessage(`{"amount": 1000, "currency": "usd"}`))
	require.NoError(t, err)
	b, err := idem.FingerprintJSON(json.RawMessage(`{"currency":"usd","amount":1000.0}`))
	require.NoError(t, err)
	c, err := idem.FingerprintJSON(json.RawMessage(`{"currency":"usd","amount":1001}`))
	require.NoError(t, err)

	require.Equal(t, a, b, "key order, spacing and number spelling must not change the fingerprint")
	require.NotEqual(t, a, c)
	// printf %s '{"amount":1000,"currency":"usd"}' | sha256sum
	require.Equal(t, "sha256:a223b60dc6adbc2911e7c073889b220df1181c5534fa6be58c3a70981c354c54", a)
}

// TestCanonicalJSONOrdersByUTF16: object members come out ordered by their
// UTF-16 code units (RFC 8785 §3.2.3), which differs from code point order
// where a character above U+FFFF (a surrogate pair, 0xD800..) meets one in
// U+E000..U+FFFF; checked on random objects whose member names mix such
// characters, against utf16.Encode.
func TestCanonicalJSONOrdersByUTF16(t *testing.T) {
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
		canon, err := idem.CanonicalJSON(doc)
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
