package jsonenc

import (
	"encoding/json"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

var pieces = []string{"", "a", "Content-Type", "application/json", "<>&", `"`, `\`, "\n\t\r\b\f", "\x00\x1f\x7f",
	"é", "€", "\U0001f600", "\u2028", "\u2029", "\xff", "\xc3", "\xed\xa0\x80", "x-idem-é"}

func randomString(rng *rand.Rand) string {
	s := ""
	for range rng.IntN(4) {
		s += pieces[rng.IntN(len(pieces))]
	}
	return s
}

// TestAppendStringMapIsJSONMarshal: AppendStringMap writes what json.Marshal
// writes for the same map, over random maps (nil, empty, up to 20 members
// whose names and values mix escapes, HTML characters, invalid UTF-8 and
// the line separators), and AppendString what it writes for each string.
func TestAppendStringMapIsJSONMarshal(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(14, 3))
	for i := range 3000 {
		var m map[string]string
		if i%50 != 0 {
			m = map[string]string{}
			for range rng.IntN(21) {
				m[randomString(rng)] = randomString(rng)
			}
		}
		want, err := json.Marshal(m)
		require.NoError(t, err)
		require.Equal(t, string(want), string(AppendStringMap(nil, m)))
		for k, v := range m {
			for _, s := range []string{k, v} {
				want, err := json.Marshal(s)
				require.NoError(t, err)
				require.Equal(t, string(want), string(AppendString([]byte("prefix"), s))[len("prefix"):])
			}
		}
	}
}

// BenchmarkStoredHeaders is what the stores pay to write a complete's
// response headers (loadgen's one header): json.Marshal before,
// AppendStringMap now.
func BenchmarkStoredHeaders(b *testing.B) {
	h := map[string]string{"Content-Type": "application/json"}
	b.Run("json.Marshal", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := json.Marshal(h); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("AppendStringMap", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			AppendStringMap(nil, h)
		}
	})
}
