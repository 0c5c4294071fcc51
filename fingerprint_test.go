package idem_test

import (
	"encoding/json"
	"testing"

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
