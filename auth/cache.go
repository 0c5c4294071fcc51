package auth

import (
	"crypto/sha256"
	"slices"
	"sync"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// MaxCachedTokens bounds the verified-token cache of a Verifier.
const MaxCachedTokens = 4096

// tokenCache remembers tokens that passed full verification, so a client
// that sends the same token on every request pays for parsing it (base64,
// two JSON documents, the signature) once. A hit answers only while the
// token's time claims still hold (with Leeway), exactly as a fresh parse
// would; otherwise Verify parses the token again and reports the failure the
// parser finds. Everything else a verification checks (signature, key,
// algorithm, issuer, audience) depends only on the token and on the
// Verifier's fixed configuration, so it cannot change between calls.
//
// Entries are keyed by the SHA-256 of the token, so the cache holds no
// tokens. When it is full, expired entries are dropped, and if that frees
// nothing the cache is emptied.
type tokenCache struct {
	mu      sync.RWMutex
	entries map[[sha256.Size]byte]cachedToken
}

// cachedToken is a verified principal and the window in which its token's
// time claims hold: [validFrom, validUntil).
type cachedToken struct {
	principal  Principal
	validFrom  time.Time // latest of nbf and iat minus Leeway; zero if neither is set
	validUntil time.Time // exp plus Leeway
}

func newTokenCache() *tokenCache {
	return &tokenCache{entries: map[[sha256.Size]byte]cachedToken{}}
}

// get returns the principal of a verified token whose time claims hold at
// now.
func (c *tokenCache) get(key [sha256.Size]byte, now time.Time) (Principal, bool) {
	c.mu.RLock()
	e, ok := c.entries[key]
	c.mu.RUnlock()
	if !ok || !now.Before(e.validUntil) || now.Before(e.validFrom) {
		return Principal{}, false
	}
	p := e.principal
	p.Scopes = slices.Clone(p.Scopes) // callers own their principal
	return p, true
}

// put remembers a token that just passed verification with claims cl.
func (c *tokenCache) put(key [sha256.Size]byte, p Principal, cl *claims, now time.Time) {
	if cl.ExpiresAt == nil { // not reachable: exp is required
		return
	}
	e := cachedToken{principal: p, validUntil: cl.ExpiresAt.Add(Leeway)}
	for _, d := range []*jwt.NumericDate{cl.NotBefore, cl.IssuedAt} {
		if d != nil && d.Add(-Leeway).After(e.validFrom) {
			e.validFrom = d.Add(-Leeway)
		}
	}
	e.principal.Scopes = slices.Clone(p.Scopes)
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.entries) >= MaxCachedTokens {
		for k, old := range c.entries {
			if !now.Before(old.validUntil) {
				delete(c.entries, k)
			}
		}
		if len(c.entries) >= MaxCachedTokens {
			clear(c.entries)
		}
	}
	c.entries[key] = e
}
