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

// BenchmarkFingerprintJSON is the server's fingerprint of a claim's request
// (the one cmd/loadgen sends) and of a larger document with nesting,
// escapes and non-ASCII names. Run with -benchmem.
func BenchmarkFingerprintJSON(b *testing.B) {
	for _, bc := range []struct{ name, doc string }{
		{"loadgen", `{"amount":1000,"currency":"usd"}`},
		{"nested", `{"order":{"id":"ord_8f2a","lines":[{"sku":"A-1","qty":2,"price":19.99},{"sku":"B-7","qty":1,"price":5}],"note":"gift \"wrap\"\n","tags":["x","y"]},"customer":{"name":"Zoë","email":"z@example.com","vip":true,"ref":null},"amount":4498,"currency":"eur","métadata":{"b":1,"a":2}}`},
	} {
		b.Run(bc.name, func(b *testing.B) {
			doc := []byte(bc.doc)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := idem.FingerprintJSON(doc); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// checkCanonicalPaths fails t unless CanonicalJSON's answer for doc (canon,
// err) is the two-pass path's, byte for byte and error for error, and the
// one-pass path accepted only what the two-pass path accepts, with the same
// bytes.
func checkCanonicalPaths(t *testing.T, doc, canon []byte, err error) {
	t.Helper()
	want, wantErr := idem.CanonicalTwoPass(doc)
	if (err == nil) != (wantErr == nil) || err != nil && err.Error() != wantErr.Error() {
		t.Fatalf("CanonicalJSON(%q): error %v, two-pass path %v", doc, err, wantErr)
	}
	if !bytes.Equal(canon, want) {
		t.Fatalf("CanonicalJSON(%q) = %q, two-pass path %q", doc, canon, want)
	}
	if fast, ok := idem.CanonicalOnePass(doc); ok && (wantErr != nil || !bytes.Equal(fast, want)) {
		t.Fatalf("one-pass path accepted %q as %q; two-pass path: %q, %v", doc, fast, want, wantErr)
	}
}

// TestCanonicalOnePassMatches compares CanonicalJSON with its two-pass path
// (the reference: encoding/json, CheckIJSON, then writing) on random
// documents — nested values, member names and strings mixing escapes,
// control characters, non-ASCII and surrogate pairs, numbers in many
// spellings, random white space, some duplicate names — and on each of
// them broken at random (a byte changed, inserted or cut off), so both the
// accepted and the refused side are compared.
func TestCanonicalOnePassMatches(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(14, 1))
	accepted := 0
	for range 4000 {
		doc := randomJSON(rng, nil, 0)
		for _, d := range [][]byte{doc, mutateJSON(rng, doc)} {
			canon, err := idem.CanonicalJSON(d)
			checkCanonicalPaths(t, d, canon, err)
			if err == nil {
				accepted++
			}
		}
	}
	require.Greater(t, accepted, 2000, "the random documents should mostly be valid")
}

var (
	jsonSpace   = []string{"", "", "", " ", "\n", "\t", "\r\n  "}
	jsonNumbers = []string{"0", "-0", "1", "-1", "1000", "123456789012345", "1234567890123456", "-999999999999999",
		"9007199254740993", "1.0", "1.5", "-0.0", "0.1", "1e21", "1e20", "1E+2", "1e-7", "0.000001", "5e-324",
		"1e400", "-1e400", "1e-400", "333333333.33333329", "12.34e5", "100e-2", "0e10", "01", "1.", ".5", "-", "1e"}
	jsonChars = []string{"a", "z", "A", "0", " ", "é", "\u00ff", "\u20ac", "\ue000", "\uffef", "\U0001f600", "\U0010ffff",
		`\"`, `\\`, `\/`, `\b`, `\f`, `\n`, `\r`, `\t`, `\u0000`, `\u001f`, `\u0041`, `\u00e9`, `\uffff`,
		`\ud83d\ude00`, `\uD83D\uDE00`, `\ud800`, `\udc00`, `\ud83dx`, "\x7f", "<", "&", "\xff", "\x01", `\x`}
)

// randomJSON appends a random JSON value (mostly valid) to b.
func randomJSON(rng *rand.Rand, b []byte, depth int) []byte {
	sp := func() { b = append(b, jsonSpace[rng.IntN(len(jsonSpace))]...) }
	str := func() {
		b = append(b, '"')
		for range rng.IntN(5) {
			b = append(b, jsonChars[rng.IntN(len(jsonChars))]...)
		}
		b = append(b, '"')
	}
	sp()
	switch k := rng.IntN(10); {
	case depth < 4 && k < 3:
		b = append(b, '{')
		var names [][]byte
		for i := range rng.IntN(6) {
			if i > 0 {
				b = append(b, ',')
			}
			sp()
			start := len(b)
			if len(names) > 0 && rng.IntN(20) == 0 {
				b = append(b, names[rng.IntN(len(names))]...) // a duplicate
			} else {
				str()
			}
			names = append(names, slices.Clone(b[start:]))
			sp()
			b = append(b, ':')
			b = randomJSON(rng, b, depth+1)
		}
		sp()
		b = append(b, '}')
	case depth < 4 && k < 5:
		b = append(b, '[')
		for i := range rng.IntN(5) {
			if i > 0 {
				b = append(b, ',')
			}
			b = randomJSON(rng, b, depth+1)
		}
		sp()
		b = append(b, ']')
	case k < 7:
		str()
	case k < 9:
		b = append(b, jsonNumbers[rng.IntN(len(jsonNumbers))]...)
	default:
		b = append(b, [...]string{"true", "false", "null"}[rng.IntN(3)]...)
	}
	sp()
	return b
}

// mutateJSON returns a copy of doc with one byte changed, inserted or cut
// off from there on.
func mutateJSON(rng *rand.Rand, doc []byte) []byte {
	d := slices.Clone(doc)
	if len(d) == 0 {
		return d
	}
	i := rng.IntN(len(d))
	const bytesToUse = "{}[]\":,\\ 0-.eE+tfnu\x00\x1f\x80\xc3"
	switch rng.IntN(3) {
	case 0:
		d[i] = bytesToUse[rng.IntN(len(bytesToUse))]
	case 1:
		d = slices.Insert(d, i, bytesToUse[rng.IntN(len(bytesToUse))])
	default:
		d = d[:i]
	}
	return d
}
