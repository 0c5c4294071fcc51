package auth

import (
	"crypto/sha256"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem"
)

// TestVerifyCacheKeepsTimeChecks verifies that a remembered token is still
// refused outside its exp/nbf/iat window, with the same detail a fresh
// verification gives, and accepted again inside it.
func TestVerifyCacheKeepsTimeChecks(t *testing.T) {
	t.Parallel()
	v, tok, offset, now := clockedVerifier(t)
	want := Principal{Subject: "sub", Tenant: "acme", Scopes: []string{ScopeKeysWrite}}

	p, err := v.Verify(tok)
	require.NoError(t, err)
	require.WithinDuration(t, time.Now(), p.IssuedAt, 2*time.Second)
	want.IssuedAt = p.IssuedAt
	require.Equal(t, want, p)
	_, cached := v.cache.get(tokenKey(tok), now())
	require.True(t, cached, "a verified token is remembered")

	p, err = v.Verify(tok) // from the cache
	require.NoError(t, err)
	require.Equal(t, want, p)
	p.Scopes[0] = "mutated"
	p, err = v.Verify(tok)
	require.NoError(t, err)
	require.Equal(t, want, p, "a caller cannot change the remembered principal")

	// A different token (one signature character changed) is verified on
	// its own and refused.
	bad := tok[:len(tok)-2] + map[bool]string{true: "A", false: "B"}[tok[len(tok)-2] != 'A'] + tok[len(tok)-1:]
	_, err = v.Verify(bad)
	require.Equal(t, idem.CodeUnauthenticated, idem.ErrorCode(err))

	requireDetail := func(detail string) {
		t.Helper()
		_, err := v.Verify(tok)
		require.Equal(t, idem.CodeUnauthenticated, idem.ErrorCode(err))
		var ie *idem.Error
		require.ErrorAs(t, err, &ie)
		require.Equal(t, detail, ie.Detail)
	}

	offset.Store(int64(time.Hour + Leeway + time.Second))
	requireDetail("the token has expired")
	offset.Store(int64(-Leeway - 2*time.Second))
	requireDetail("the token is not valid yet")

	offset.Store(0)
	p, err = v.Verify(tok)
	require.NoError(t, err)
	require.Equal(t, want, p)
}

// clockedVerifier is a verifier whose clock runs offset from the real one,
// and a token it accepts, valid for an hour.
func clockedVerifier(t *testing.T) (v *Verifier, tok string, offset *atomic.Int64, now func() time.Time) {
	t.Helper()
	secret := []byte(strings.Repeat("s", MinSecretBytes))
	offset = new(atomic.Int64)
	now = func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }
	v, err := newVerifier(Config{HS256Secret: secret, Issuer: "iss", Audience: "aud"}, now)
	require.NoError(t, err)
	tok, err = MintHS256(secret, MintClaims{Issuer: "iss", Audience: "aud", Subject: "sub", Tenant: "acme", Scopes: []string{ScopeKeysWrite}, TTL: time.Hour})
	require.NoError(t, err)
	return v, tok, offset, now
}

// TestVerifyCacheHitAllocs guards the request path's cost of
// authentication: a token seen before is neither parsed nor its signature
// checked again, a cache hit allocates only the caller's copy of the
// scopes (tokenKey hashes the token without a heap copy), and the same
// token is refused once it expired, from the cache.
func TestVerifyCacheHitAllocs(t *testing.T) {
	v, tok, offset, _ := clockedVerifier(t)
	require.Greater(t, len(tok), 32, "a token longer than Go's small conversion buffer")

	_, err := v.Verify(tok)
	require.NoError(t, err)

	allocs := testing.AllocsPerRun(100, func() {
		if _, err := v.Verify(tok); err != nil {
			t.Fatal(err)
		}
	})
	// A full verification allocates dozens of times (base64, two JSON
	// documents, the signature): at most one means it was not run again.
	require.LessOrEqual(t, allocs, 1.0, "allocations per cached Verify")

	offset.Store(int64(time.Hour + Leeway + time.Second))
	_, err = v.Verify(tok)
	require.Equal(t, idem.CodeUnauthenticated, idem.ErrorCode(err), "an expired token is refused")
}

// TestTokenCacheBounded verifies that the cache never holds more than
// MaxCachedTokens entries.
func TestTokenCacheBounded(t *testing.T) {
	t.Parallel()
	c := newTokenCache()
	now := time.Now()
	for i := range MaxCachedTokens + 10 {
		var key [sha256.Size]byte
		key[0], key[1], key[2] = byte(i), byte(i>>8), byte(i>>16)
		cl := &claims{}
		cl.ExpiresAt = jwt.NewNumericDate(now.Add(time.Hour))
		c.put(key, Principal{Tenant: "t"}, cl, now)
		require.LessOrEqual(t, len(c.entries), MaxCachedTokens)
	}
	require.NotEmpty(t, c.entries)
}

// BenchmarkVerifyHS256 verifies the same HS256 token repeatedly, as a
// client that reuses its token makes the server do.
func BenchmarkVerifyHS256(b *testing.B) {
	secret := []byte(strings.Repeat("s", MinSecretBytes))
	v, err := NewVerifier(Config{HS256Secret: secret, Issuer: "iss", Audience: "aud"})
	if err != nil {
		b.Fatal(err)
	}
	tok, err := MintHS256(secret, MintClaims{Issuer: "iss", Audience: "aud", Subject: "sub", Tenant: "acme", Scopes: []string{ScopeKeysWrite}, TTL: time.Hour})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := v.Verify(tok); err != nil {
			b.Fatal(err)
		}
	}
}
