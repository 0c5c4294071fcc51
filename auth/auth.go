// Package auth verifies the bearer tokens (JWT) of the idem HTTP API and
// mints HS256 tokens for operators and tests.
//
// The accepted algorithms are pinned by configuration: HS256 only when a
// shared secret is configured, and EdDSA, ES256 and RS256 only for the public
// keys of a JWKS document, each key used only with the algorithm that matches
// its type. Every token must carry exp; iss and aud must match the
// configuration; exp, nbf and iat are checked with 30 seconds of leeway.
// The API also requires iat, and refuses a tenant's token issued before
// the tenant was created (Principal.IssuedBefore): deleting a tenant and
// creating one with the same id must not revive the old tenant's tokens.
package auth

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/canon"
)

// The scopes a token may carry in its space-separated scope claim.
const (
	// ScopeKeysWrite allows claim, checkpoint, complete and release; it
	// implies ScopeKeysRead.
	ScopeKeysWrite = "keys:write"
	// ScopeKeysRead allows fetching and listing keys.
	ScopeKeysRead = "keys:read"
	// ScopeTenantAdmin allows reading and changing the own tenant's settings.
	ScopeTenantAdmin = "tenant:admin"
	// ScopeAdmin allows the operator endpoints; it needs no tenant.
	ScopeAdmin = "admin"
)

// MinSecretBytes is the shortest HS256 secret accepted.
const MinSecretBytes = 32

// Leeway is the clock skew tolerated on exp, nbf and iat.
const Leeway = 30 * time.Second

// Config configures a Verifier.
type Config struct {
	// HS256Secret enables HS256 tokens; it must be at least MinSecretBytes
	// long. Nil disables HS256.
	HS256Secret []byte
	// JWKS is the content of a JWKS file with the public keys accepted for
	// EdDSA (OKP Ed25519), ES256 (EC P-256) and RS256 (RSA); nil for none.
	JWKS []byte
	// Issuer is the required iss claim.
	Issuer string
	// Audience must be one of the aud claim's values.
	Audience string
}

// Principal is the verified identity of a caller.
type Principal struct {
	// Subject is the token's sub claim (may be empty).
	Subject string
	// Tenant is the token's tenant claim; empty for operator tokens.
	Tenant string
	// Scopes are the entries of the token's scope claim.
	Scopes []string
	// IssuedAt is the token's iat claim; zero when it has none. The API
	// refuses a token without one, and a tenant's token issued before the
	// tenant was created (see IssuedBefore).
	IssuedAt time.Time
}

// IssuedBefore reports whether the token was issued before createdAt (a
// tenant's creation, read from the database clock), beyond what clock
// skew explains: iat is whole seconds (an issuer truncates), and the
// issuer's clock may be behind the database's by up to Leeway, the skew
// every time claim is allowed. A token minted right after its tenant was
// created is never refused so; one minted for an earlier tenant of the same
// id (deleted, then created again) is, once the new tenant is more than
// Leeway younger than the token. A token without iat is reported as issued
// before.
func (p Principal) IssuedBefore(createdAt time.Time) bool {
	if p.IssuedAt.IsZero() {
		return true
	}
	return p.IssuedAt.Before(createdAt.Truncate(time.Second).Add(-Leeway))
}

// HasScope reports whether the principal holds scope. ScopeKeysWrite implies
// ScopeKeysRead.
func (p Principal) HasScope(scope string) bool {
	if slices.Contains(p.Scopes, scope) {
		return true
	}
	return scope == ScopeKeysRead && slices.Contains(p.Scopes, ScopeKeysWrite)
}

// Verifier checks bearer tokens. It is safe for concurrent use.
type Verifier struct {
	secret []byte
	keys   map[string]publicKey // by kid
	parser *jwt.Parser
	now    func() time.Time
	cache  *tokenCache
}

// claims are the claims idem reads from a token.
type claims struct {
	jwt.RegisteredClaims
	Tenant string `json:"tenant,omitempty"`
	Scope  string `json:"scope,omitempty"`
}

// errDateNotNumber is a time claim that is not a JSON number.
var errDateNotNumber = errors.New("exp, nbf and iat must be NumericDates (JSON numbers of seconds)")

// UnmarshalJSON decodes the claims like encoding/json, but refuses exp, nbf
// and iat that are not JSON numbers. jwt.NumericDate reads through
// json.Number, which also takes a string such as "1700000000"; RFC 7519
// §2 makes a NumericDate a number, and a string date read one way here and
// another way by a second verifier is a token whose lifetime depends on
// who reads it.
func (c *claims) UnmarshalJSON(b []byte) error {
	var dates struct {
		Exp json.RawMessage `json:"exp"`
		Nbf json.RawMessage `json:"nbf"`
		Iat json.RawMessage `json:"iat"`
	}
	if err := json.Unmarshal(b, &dates); err != nil {
		return err
	}
	for _, raw := range []json.RawMessage{dates.Exp, dates.Nbf, dates.Iat} {
		if len(raw) > 0 && !(raw[0] == '-' || raw[0] >= '0' && raw[0] <= '9') {
			return errDateNotNumber
		}
	}
	type plain claims // without this method
	return json.Unmarshal(b, (*plain)(c))
}

// NewVerifier returns a Verifier for cfg. It fails when no key is configured,
// when the HS256 secret is shorter than MinSecretBytes, when the JWKS cannot
// be parsed, or when the issuer or audience is empty.
func NewVerifier(cfg Config) (*Verifier, error) {
	return newVerifier(cfg, time.Now)
}

func newVerifier(cfg Config, now func() time.Time) (*Verifier, error) {
	if cfg.Issuer == "" || cfg.Audience == "" {
		return nil, errors.New("new verifier: issuer and audience must be set")
	}
	v := &Verifier{keys: map[string]publicKey{}, now: now, cache: newTokenCache()}
	var methods []string
	if cfg.HS256Secret != nil {
		if len(cfg.HS256Secret) < MinSecretBytes {
			return nil, fmt.Errorf("new verifier: the HS256 secret is %d bytes; at least %d are required", len(cfg.HS256Secret), MinSecretBytes)
		}
		v.secret = slices.Clone(cfg.HS256Secret)
		methods = append(methods, jwt.SigningMethodHS256.Alg())
	}
	if len(cfg.JWKS) > 0 {
		keys, err := parseJWKS(cfg.JWKS)
		if err != nil {
			return nil, fmt.Errorf("new verifier: %w", err)
		}
		for _, k := range keys {
			if v.secret != nil && k.encodedEqual(v.secret) {
				return nil, fmt.Errorf("new verifier: the HS256 secret equals the public key %q", k.kid)
			}
			v.keys[k.kid] = k
			if !slices.Contains(methods, k.alg) {
				methods = append(methods, k.alg)
			}
		}
	}
	if len(methods) == 0 {
		return nil, errors.New("new verifier: neither an HS256 secret nor a JWKS key is configured")
	}
	v.parser = jwt.NewParser(
		jwt.WithValidMethods(methods),
		jwt.WithExpirationRequired(),
		jwt.WithIssuer(cfg.Issuer),
		jwt.WithAudience(cfg.Audience),
		jwt.WithIssuedAt(),
		jwt.WithLeeway(Leeway),
		jwt.WithTimeFunc(now),
	)
	return v, nil
}

// Verify checks token and returns its principal. Every failure is an
// *idem.Error with code unauthenticated and a short detail safe to show.
//
// A token that passed verification is remembered (see MaxCachedTokens), so
// repeating it costs a hash and a map lookup while its exp, nbf and iat
// still hold; the answer is the same as a full verification's.
func (v *Verifier) Verify(token string) (Principal, error) {
	key := tokenKey(token)
	if p, ok := v.cache.get(key, v.now()); ok {
		return p, nil
	}
	var c claims
	_, err := v.parser.ParseWithClaims(token, &c, v.keyFunc)
	if err != nil {
		return Principal{}, &idem.Error{Code: idem.CodeUnauthenticated, Detail: failureDetail(err), Err: fmt.Errorf("verify token: %w", err)}
	}
	if err := checkSegmentsIJSON(token); err != nil {
		return Principal{}, &idem.Error{Code: idem.CodeUnauthenticated, Detail: "the token's header or claims are not I-JSON (a claim name twice, invalid UTF-8)", Err: fmt.Errorf("verify token: %w", err)}
	}
	p := Principal{Subject: c.Subject, Tenant: c.Tenant, Scopes: strings.Fields(c.Scope)}
	if c.IssuedAt != nil {
		p.IssuedAt = c.IssuedAt.Time
	}
	v.cache.put(key, p, &c, v.now())
	return p, nil
}

// tokenKey is the cache key of token: its SHA-256. A token is a few
// hundred bytes, longer than the 32 bytes Go converts a string to []byte in
// without allocating, so []byte(token) cost one heap allocation on every
// request (~1 % of the server's allocations under load, 12-02 profile);
// copying it into a stack buffer first keeps a cache hit allocation-free
// (TestVerifyCacheHitAllocs). A longer token takes the plain conversion.
func tokenKey(token string) [sha256.Size]byte {
	var buf [2048]byte
	if len(token) <= len(buf) {
		return sha256.Sum256(append(buf[:0], token...))
	}
	return sha256.Sum256([]byte(token))
}

// checkSegmentsIJSON refuses a token whose header or claims set is not
// I-JSON. encoding/json keeps the last of duplicate claim names; an issuer
// or gateway that reads the first would see another tenant or scope in the
// same signed token, so such a token is refused rather than read one way
// (RFC 7519 §4 allows either). It runs once per token: verified tokens are
// cached.
func checkSegmentsIJSON(token string) error {
	parts := strings.SplitN(token, ".", 3)
	for _, seg := range parts[:min(2, len(parts))] {
		doc, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(seg, "="))
		if err != nil {
			return err
		}
		if err := canon.CheckIJSON(doc); err != nil {
			return err
		}
	}
	return nil
}

// keyFunc selects the verification key for a token whose algorithm already
// passed WithValidMethods: the secret for HS256, otherwise the JWKS key named
// by kid, and only when the key's type matches the algorithm.
func (v *Verifier) keyFunc(t *jwt.Token) (any, error) {
	alg := t.Method.Alg()
	if alg == jwt.SigningMethodHS256.Alg() {
		if v.secret == nil {
			return nil, errUnsupportedAlg
		}
		return v.secret, nil
	}
	kid, _ := t.Header["kid"].(string)
	k, ok := v.keys[kid]
	if !ok && kid == "" && len(v.keys) == 1 {
		for _, only := range v.keys {
			k, ok = only, true
		}
	}
	if !ok {
		return nil, errUnknownKey
	}
	if k.alg != alg {
		return nil, errUnsupportedAlg
	}
	return k.key, nil
}

var (
	errUnknownKey     = errors.New("no key with this kid")
	errUnsupportedAlg = errors.New("algorithm not accepted for this key")
)

// failureDetail turns a parse error into a short sentence that reveals
// nothing about keys.
func failureDetail(err error) string {
	switch {
	case errors.Is(err, errUnknownKey):
		return "the token's key id is not known"
	case errors.Is(err, errUnsupportedAlg), errors.Is(err, jwt.ErrTokenSignatureInvalid) && strings.Contains(err.Error(), "signing method"):
		return "the token's signing algorithm is not accepted"
	case errors.Is(err, jwt.ErrTokenSignatureInvalid):
		return "the token's signature is invalid"
	case errors.Is(err, errDateNotNumber):
		return "the token's exp, nbf and iat must be JSON numbers (NumericDate)"
	case errors.Is(err, jwt.ErrTokenMalformed):
		return "the token is malformed"
	case errors.Is(err, jwt.ErrTokenExpired):
		return "the token has expired"
	case errors.Is(err, jwt.ErrTokenRequiredClaimMissing):
		return "the token lacks a required claim (exp)"
	case errors.Is(err, jwt.ErrTokenInvalidIssuer):
		return "the token's issuer is not accepted"
	case errors.Is(err, jwt.ErrTokenInvalidAudience):
		return "the token's audience is not accepted"
	case errors.Is(err, jwt.ErrTokenNotValidYet):
		return "the token is not valid yet"
	case errors.Is(err, jwt.ErrTokenUsedBeforeIssued):
		return "the token was issued in the future"
	case errors.Is(err, jwt.ErrTokenUnverifiable):
		return "the token cannot be verified"
	}
	return "the token is invalid"
}

// MintClaims are the claims of a token minted by MintHS256.
type MintClaims struct {
	Issuer, Audience, Subject, Tenant string
	Scopes                            []string
	// TTL is how long the token is valid; zero or less means one hour.
	TTL time.Duration
}

// DefaultMintTTL is the lifetime of a minted token whose TTL is not set.
const DefaultMintTTL = time.Hour

// MintHS256 returns an HS256 token signed with secret, which must be at
// least MinSecretBytes long.
func MintHS256(secret []byte, c MintClaims) (string, error) {
	if len(secret) < MinSecretBytes {
		return "", fmt.Errorf("mint token: the HS256 secret is %d bytes; at least %d are required", len(secret), MinSecretBytes)
	}
	ttl := c.TTL
	if ttl <= 0 {
		ttl = DefaultMintTTL
	}
	now := time.Now()
	cl := claims{
		RegisteredClaims: jwt.RegisteredClaims{
			Issuer:    c.Issuer,
			Subject:   c.Subject,
			IssuedAt:  jwt.NewNumericDate(now),
			NotBefore: jwt.NewNumericDate(now),
			ExpiresAt: jwt.NewNumericDate(now.Add(ttl)),
		},
		Tenant: c.Tenant,
		Scope:  strings.Join(c.Scopes, " "),
	}
	if c.Audience != "" {
		cl.Audience = jwt.ClaimStrings{c.Audience}
	}
	s, err := jwt.NewWithClaims(jwt.SigningMethodHS256, cl).SignedString(secret)
	if err != nil {
		return "", fmt.Errorf("mint token: %w", err)
	}
	return s, nil
}

// constantTimeEqual compares secrets without leaking timing.
func constantTimeEqual(a, b []byte) bool { return hmac.Equal(a, b) }
