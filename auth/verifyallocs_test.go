package auth

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem"
)

// TestVerifyCacheHitAllocs guards the request path's cost of
// authentication: a token seen before is neither parsed nor its signature
// checked again, a cache hit allocates only the
// caller's copy of the scopes (the hash of the token once allocated too),
// and the same token is refused once it expired, from the cache.
func TestVerifyCacheHitAllocs(t *testing.T) {
	secret := []byte(strings.Repeat("s", MinSecretBytes))
	var offset atomic.Int64
	now := func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }
	v, err := newVerifier(Config{HS256Secret: secret, Issuer: "iss", Audience: "aud"}, now)
	require.NoError(t, err)
	tok, err := MintHS256(secret, MintClaims{Issuer: "iss", Audience: "aud", Subject: "sub", Tenant: "acme", Scopes: []string{ScopeKeysWrite}, TTL: time.Minute})
	require.NoError(t, err)
	require.Greater(t, len(tok), 32, "a token longer than Go's small conversion buffer")

	_, err = v.Verify(tok)
	require.NoError(t, err)

	allocs := testing.AllocsPerRun(100, func() {
		if _, err := v.Verify(tok); err != nil {
			t.Fatal(err)
		}
	})
	// A full verification allocates dozens of times (base64, two JSON
	// documents, the signature): at most one means it was not run again.
	require.LessOrEqual(t, allocs, 1.0, "allocations per cached Verify")

	offset.Store(int64(time.Minute + Leeway + time.Second))
	_, err = v.Verify(tok)
	require.Equal(t, idem.CodeUnauthenticated, idem.ErrorCode(err), "an expired token is refused")
}

// BenchmarkVerifyCached is the request path's Verify of a token seen before.
func BenchmarkVerifyCached(b *testing.B) {
	secret := []byte(strings.Repeat("s", MinSecretBytes))
	v, err := newVerifier(Config{HS256Secret: secret, Issuer: "iss", Audience: "aud"}, time.Now)
	require.NoError(b, err)
	tok, err := MintHS256(secret, MintClaims{Issuer: "iss", Audience: "aud", Subject: "sub", Tenant: "acme", Scopes: []string{ScopeKeysWrite}, TTL: time.Hour})
	require.NoError(b, err)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := v.Verify(tok); err != nil {
			b.Fatal(err)
		}
	}
}
