package auth

import (
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/idem-dev/idem"
)

// Fixed inputs of the JWT fuzz targets: the seed tokens carry fixed times
// and the verifier a fixed clock, so the committed corpus never expires.
var (
	fuzzSecret = []byte("fuzz-hs256-secret-0123456789abcdef")
	fuzzEdKey  = ed25519.NewKeyFromSeed([]byte("fuzz-ed25519-seed-0123456789abcd"))
	fuzzNow    = time.Date(2026, 6, 1, 0, 0, 0, 0, time.UTC)
)

func fuzzVerifier(tb testing.TB) *Verifier {
	tb.Helper()
	pub := fuzzEdKey.Public().(ed25519.PublicKey)
	doc := `{"keys":[{"kty":"OKP","crv":"Ed25519","kid":"ed","x":"` + base64.RawURLEncoding.EncodeToString(pub) + `"}]}`
	v, err := newVerifier(Config{HS256Secret: fuzzSecret, JWKS: []byte(doc), Issuer: "idem-fuzz", Audience: "idem-api"},
		func() time.Time { return fuzzNow })
	if err != nil {
		tb.Fatal(err)
	}
	return v
}

// fuzzSeedToken signs claims valid at fuzzNow (and for a century after).
func fuzzSeedToken(tb testing.TB, method jwt.SigningMethod, key any, kid string, mut func(jwt.MapClaims)) string {
	tb.Helper()
	c := jwt.MapClaims{
		"iss": "idem-fuzz", "aud": "idem-api", "sub": "fuzz", "tenant": "acme", "scope": "keys:write",
		"iat": fuzzNow.Add(-time.Hour).Unix(), "exp": fuzzNow.AddDate(100, 0, 0).Unix(),
	}
	if mut != nil {
		mut(c)
	}
	tok := jwt.NewWithClaims(method, c)
	if kid != "" {
		tok.Header["kid"] = kid
	}
	s, err := tok.SignedString(key)
	if err != nil {
		tb.Fatal(err)
	}
	return s
}

// FuzzVerify feeds arbitrary strings to Verify. It checks that Verify never
// panics, that every refusal is unauthenticated, and that every token it
// accepts really carries a valid signature by one of the configured keys
// over its first two segments, with claims matching the principal — the
// fuzzer can mutate a token but cannot forge one. Verifying twice (the
// second answer from the cache) gives the same answer. Seeds:
// testdata/fuzz/FuzzVerify.
func FuzzVerify(f *testing.F) {
	seeds := []string{
		fuzzSeedToken(f, jwt.SigningMethodHS256, fuzzSecret, "", nil),
		fuzzSeedToken(f, jwt.SigningMethodEdDSA, fuzzEdKey, "ed", nil),
		fuzzSeedToken(f, jwt.SigningMethodHS256, fuzzSecret, "", func(c jwt.MapClaims) { c["tenant"] = "ac\x00me" }),
		fuzzSeedToken(f, jwt.SigningMethodHS256, fuzzSecret, "", func(c jwt.MapClaims) { delete(c, "exp") }),
		fuzzSeedToken(f, jwt.SigningMethodHS256, fuzzSecret, "", func(c jwt.MapClaims) { c["aud"] = []string{"x", "idem-api"} }),
		fuzzSeedToken(f, jwt.SigningMethodHS256, []byte("another-secret-another-secret-0123"), "", nil),
		"", "a.b.c", "eyJhbGciOiJub25lIn0.e30.", "...", "eyJhbGciOiJIUzI1NiJ9.eyJ0ZW5hbnQiOnt9fQ.sig",
	}
	for _, s := range seeds {
		f.Add(s)
	}
	v := fuzzVerifier(f)
	f.Fuzz(func(t *testing.T, token string) {
		p, err := v.Verify(token)
		if err != nil {
			var e *idem.Error
			if !errors.As(err, &e) || e.Code != idem.CodeUnauthenticated {
				t.Fatalf("Verify(%q) = %v, want unauthenticated", token, err)
			}
			return
		}
		parts := strings.Split(token, ".")
		if len(parts) != 3 {
			t.Fatalf("Verify accepted %q, which has %d segments", token, len(parts))
		}
		var header struct {
			Alg string `json:"alg"`
		}
		hb, err1 := base64.RawURLEncoding.DecodeString(parts[0])
		sig, err2 := base64.RawURLEncoding.DecodeString(parts[2])
		if err1 != nil || err2 != nil || json.Unmarshal(hb, &header) != nil {
			t.Fatalf("Verify accepted %q, whose header or signature does not decode", token)
		}
		signed := []byte(parts[0] + "." + parts[1])
		switch header.Alg {
		case "HS256":
			mac := hmac.New(sha256.New, fuzzSecret)
			mac.Write(signed)
			if !hmac.Equal(sig, mac.Sum(nil)) {
				t.Fatalf("Verify accepted %q without a valid HS256 signature", token)
			}
		case "EdDSA":
			if !ed25519.Verify(fuzzEdKey.Public().(ed25519.PublicKey), signed, sig) {
				t.Fatalf("Verify accepted %q without a valid EdDSA signature", token)
			}
		default:
			t.Fatalf("Verify accepted %q with algorithm %q", token, header.Alg)
		}
		var c claims
		if _, _, err := jwt.NewParser().ParseUnverified(token, &c); err != nil {
			t.Fatalf("accepted token %q does not parse: %v", token, err)
		}
		if c.ExpiresAt == nil || c.Tenant != p.Tenant || c.Subject != p.Subject || strings.Join(p.Scopes, " ") != strings.Join(strings.Fields(c.Scope), " ") {
			t.Fatalf("principal %+v does not match the claims of %q", p, token)
		}
		again, err := v.Verify(token)
		if err != nil || again.Tenant != p.Tenant || strings.Join(again.Scopes, " ") != strings.Join(p.Scopes, " ") {
			t.Fatalf("second Verify(%q) = %+v, %v; first was %+v", token, again, err, p)
		}
	})
}

// FuzzParseJWKS checks that parsing an arbitrary JWKS document never panics
// and that every key it returns names an accepted algorithm. Seeds:
// testdata/fuzz/FuzzParseJWKS.
func FuzzParseJWKS(f *testing.F) {
	pub := base64.RawURLEncoding.EncodeToString(fuzzEdKey.Public().(ed25519.PublicKey))
	for _, s := range []string{
		`{"keys":[{"kty":"OKP","crv":"Ed25519","kid":"ed","x":"` + pub + `"}]}`,
		`{"keys":[{"kty":"EC","crv":"P-256","kid":"ec","x":"AA","y":"AA"}]}`,
		`{"keys":[{"kty":"RSA","kid":"r","n":"AQAB","e":"AQAB"}]}`,
		`{"keys":[]}`, `{}`, `[]`, `{"keys":[{"kty":"oct","k":"c2VjcmV0"}]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		keys, err := parseJWKS(doc)
		if err != nil {
			return
		}
		for _, k := range keys {
			switch k.alg {
			case "EdDSA", "ES256", "RS256":
			default:
				t.Fatalf("parseJWKS(%q) returned key %q with algorithm %q", doc, k.kid, k.alg)
			}
		}
	})
}
