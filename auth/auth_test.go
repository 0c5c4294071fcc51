package auth_test

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/auth"
)

var secret = []byte(strings.Repeat("k", auth.MinSecretBytes))

func b64u(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) }

func jwks(t *testing.T, keys ...map[string]any) []byte {
	t.Helper()
	b, err := json.Marshal(map[string]any{"keys": keys})
	require.NoError(t, err)
	return b
}

func TestNewVerifierConfig(t *testing.T) {
	t.Parallel()
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	okp := map[string]any{"kty": "OKP", "crv": "Ed25519", "kid": "a", "x": b64u(pub)}

	cases := []struct {
		name string
		cfg  auth.Config
		err  string
	}{
		{"no key", auth.Config{Issuer: "i", Audience: "a"}, "neither"},
		{"short secret", auth.Config{HS256Secret: []byte("short"), Issuer: "i", Audience: "a"}, "at least 32"},
		{"no issuer", auth.Config{HS256Secret: secret, Audience: "a"}, "issuer"},
		{"bad json", auth.Config{JWKS: []byte("{"), Issuer: "i", Audience: "a"}, "parse jwks"},
		{"private key", auth.Config{JWKS: jwks(t, map[string]any{"kty": "OKP", "crv": "Ed25519", "kid": "a", "x": b64u(pub), "d": "xx"}), Issuer: "i", Audience: "a"}, "private"},
		{"wrong alg for type", auth.Config{JWKS: jwks(t, map[string]any{"kty": "OKP", "crv": "Ed25519", "kid": "a", "alg": "RS256", "x": b64u(pub)}), Issuer: "i", Audience: "a"}, "does not match"},
		{"unsupported curve", auth.Config{JWKS: jwks(t, map[string]any{"kty": "EC", "crv": "P-384", "kid": "a", "x": "AA", "y": "AA"}), Issuer: "i", Audience: "a"}, "curve"},
		{"off-curve point", auth.Config{JWKS: jwks(t, map[string]any{"kty": "EC", "crv": "P-256", "kid": "a", "x": b64u(make([]byte, 32)), "y": b64u(make([]byte, 32))}), Issuer: "i", Audience: "a"}, "point"},
		{"small RSA", auth.Config{JWKS: jwks(t, map[string]any{"kty": "RSA", "kid": "a", "n": b64u(make([]byte, 128)), "e": "AQAB"}), Issuer: "i", Audience: "a"}, "bits"},
		{"symmetric jwk", auth.Config{JWKS: jwks(t, map[string]any{"kty": "oct", "kid": "a", "k": "AA"}), Issuer: "i", Audience: "a"}, "key type"},
		{"duplicate kid", auth.Config{JWKS: jwks(t, okp, okp), Issuer: "i", Audience: "a"}, "duplicate"},
		{"secret equals a public key", auth.Config{HS256Secret: func() []byte {
			d, _ := x509.MarshalPKIXPublicKey(pub)
			return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: d})
		}(), JWKS: jwks(t, okp), Issuer: "i", Audience: "a"}, "equals the public key"},
	}
	for _, tc := range cases {
		_, err := auth.NewVerifier(tc.cfg)
		require.ErrorContains(t, err, tc.err, tc.name)
	}

	_, err = auth.NewVerifier(auth.Config{JWKS: jwks(t, okp, map[string]any{"kty": "RSA", "use": "enc", "kid": "e"}), Issuer: "i", Audience: "a"})
	require.NoError(t, err, "enc keys are skipped")
}

func TestMintAndVerify(t *testing.T) {
	t.Parallel()
	v, err := auth.NewVerifier(auth.Config{HS256Secret: secret, Issuer: "idem", Audience: "idem"})
	require.NoError(t, err)

	tok, err := auth.MintHS256(secret, auth.MintClaims{Issuer: "idem", Audience: "idem", Subject: "ops", Tenant: "acme", Scopes: []string{auth.ScopeKeysWrite, auth.ScopeTenantAdmin}})
	require.NoError(t, err)
	p, err := v.Verify(tok)
	require.NoError(t, err)
	require.WithinDuration(t, time.Now(), p.IssuedAt, 2*time.Second, "a minted token carries iat, and Verify reads it")
	require.Equal(t, p.IssuedAt, p.IssuedAt.Truncate(time.Second), "iat is whole seconds")
	p.IssuedAt = time.Time{}
	require.Equal(t, auth.Principal{Subject: "ops", Tenant: "acme", Scopes: []string{"keys:write", "tenant:admin"}}, p)
	require.True(t, p.HasScope(auth.ScopeKeysRead), "keys:write implies keys:read")
	require.True(t, p.HasScope(auth.ScopeTenantAdmin))
	require.False(t, p.HasScope(auth.ScopeAdmin))
	require.False(t, auth.Principal{Scopes: []string{auth.ScopeKeysRead}}.HasScope(auth.ScopeKeysWrite))

	_, err = auth.MintHS256([]byte("short"), auth.MintClaims{})
	require.Error(t, err)

	// Every failure is unauthenticated and never echoes the token.
	for _, bad := range []string{"", "a.b.c", tok + "x"} {
		_, err := v.Verify(bad)
		require.Equal(t, idem.CodeUnauthenticated, idem.ErrorCode(err))
		var e *idem.Error
		require.ErrorAs(t, err, &e)
		require.NotContains(t, e.Detail, tok)
	}

	expired, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{
		"iss": "idem", "aud": "idem", "exp": time.Now().Add(-time.Minute).Unix(),
	}).SignedString(secret)
	require.NoError(t, err)
	_, err = v.Verify(expired)
	var e *idem.Error
	require.ErrorAs(t, err, &e)
	require.Equal(t, idem.CodeUnauthenticated, e.Code)
	require.Contains(t, e.Detail, "expired")
}

// TestTimeClaimsMustBeNumbers: exp, nbf and iat written as JSON strings
// are refused even when the string holds a valid time, while the same
// token with numbers passes.
func TestTimeClaimsMustBeNumbers(t *testing.T) {
	t.Parallel()
	v, err := auth.NewVerifier(auth.Config{HS256Secret: secret, Issuer: "idem", Audience: "idem"})
	require.NoError(t, err)
	now := time.Now()
	sign := func(c jwt.MapClaims) string {
		tok, err := jwt.NewWithClaims(jwt.SigningMethodHS256, c).SignedString(secret)
		require.NoError(t, err)
		return tok
	}
	base := func() jwt.MapClaims {
		return jwt.MapClaims{"iss": "idem", "aud": "idem", "tenant": "acme", "scope": "keys:write",
			"exp": now.Add(time.Hour).Unix(), "nbf": now.Add(-time.Minute).Unix(), "iat": now.Add(-time.Minute).Unix()}
	}
	_, err = v.Verify(sign(base()))
	require.NoError(t, err, "numbers are NumericDates")
	for _, claim := range []string{"exp", "nbf", "iat"} {
		c := base()
		c[claim] = strconv.FormatInt(c[claim].(int64), 10)
		_, err := v.Verify(sign(c))
		var e *idem.Error
		require.ErrorAs(t, err, &e, claim)
		require.Equal(t, idem.CodeUnauthenticated, e.Code, claim)
		require.Contains(t, e.Detail, "NumericDate", claim)
	}
	for _, bad := range []any{true, map[string]any{"t": 1}, []int{1}} {
		c := base()
		c["exp"] = bad
		_, err := v.Verify(sign(c))
		require.Equal(t, idem.CodeUnauthenticated, idem.ErrorCode(err), "%v", bad)
	}
}

func TestSingleJWKSKeyWithoutKid(t *testing.T) {
	t.Parallel()
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	pt, err := priv.PublicKey.Bytes()
	require.NoError(t, err)
	v, err := auth.NewVerifier(auth.Config{JWKS: jwks(t, map[string]any{"kty": "EC", "crv": "P-256", "x": b64u(pt[1:33]), "y": b64u(pt[33:])}), Issuer: "i", Audience: "a"})
	require.NoError(t, err)
	tok, err := jwt.NewWithClaims(jwt.SigningMethodES256, jwt.MapClaims{"iss": "i", "aud": []string{"x", "a"}, "exp": time.Now().Add(time.Minute).Unix(), "scope": "keys:read", "tenant": "t"}).SignedString(priv)
	require.NoError(t, err)
	p, err := v.Verify(tok)
	require.NoError(t, err)
	require.Equal(t, "t", p.Tenant)

	// HS256 is not accepted without a configured secret, whatever the key.
	hs, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{"iss": "i", "aud": "a", "exp": time.Now().Add(time.Minute).Unix()}).SignedString(pt)
	require.NoError(t, err)
	_, err = v.Verify(hs)
	require.Equal(t, idem.CodeUnauthenticated, idem.ErrorCode(err))
}

// IssuedBefore places a token's iat against its tenant's created_at with
// Leeway of clock skew, in whole seconds: a token minted in the same
// second as the tenant (iat truncated) or by an issuer up to Leeway behind
// is not before; one more than Leeway older is; no iat is.
func TestIssuedBefore(t *testing.T) {
	t.Parallel()
	created := time.Date(2026, 12, 1, 12, 0, 0, 700_000_000, time.UTC)
	at := func(d time.Duration) auth.Principal {
		return auth.Principal{IssuedAt: created.Truncate(time.Second).Add(d)}
	}
	require.False(t, at(0).IssuedBefore(created), "minted in the tenant's second: iat truncated")
	require.False(t, at(time.Hour).IssuedBefore(created))
	require.False(t, at(-auth.Leeway).IssuedBefore(created), "an issuer's clock Leeway behind")
	require.True(t, at(-auth.Leeway-time.Second).IssuedBefore(created))
	require.True(t, at(-24*time.Hour).IssuedBefore(created), "a token of an earlier tenant of the id")
	require.True(t, auth.Principal{}.IssuedBefore(created), "no iat")
}
