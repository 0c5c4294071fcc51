package gateway_test

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/client/frontdoor"
)

// sendHeaders is send with every value of h, so a test can repeat a field.
func sendHeaders(t *testing.T, method, url, key, body string, h http.Header) reply {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set(frontdoor.HeaderKey, key)
	}
	for k, vs := range h {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	resp, err := noRedirects.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return reply{resp.StatusCode, resp.Header, string(b)}
}

// TestRepeatedScopeHeaderRefused: a protected request with two
// X-Account-Id fields, or one holding a list, is refused with 400
// invalid_key, as two Idempotency-Key fields are. Before, the gateway
// scoped it by the first value (alice) and the upstream saw both (and
// might act as mallory): a caller could claim keys in a scope that was
// not the one the upstream served. Two Authorization fields on a
// scope_jwt route are refused the same way.
func TestRepeatedScopeHeaderRefused(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		pub, priv, err := ed25519.GenerateKey(rand.Reader)
		require.NoError(t, err)
		jwks := filepath.Join(t.TempDir(), "jwks.json")
		require.NoError(t, os.WriteFile(jwks, []byte(fmt.Sprintf(`{"keys":[{"kty":"OKP","crv":"Ed25519","kid":"k1","x":%q}]}`, base64.RawURLEncoding.EncodeToString(pub))), 0o600))
		r := newRig(t, backend, fmt.Sprintf("routes:\n  - path: /orders/pay\n    scope_header: X-Account-Id\n  - path: /orders/jwt\n    scope_jwt:\n      jwks_file: %s\n      issuer: https://auth.example\n      audience: shop-api\n", jwks))
		for _, h := range []http.Header{
			{"X-Account-Id": {"alice", "mallory"}},
			{"X-Account-Id": {"alice", "alice"}},
			{"X-Account-Id": {"alice, mallory"}},
			{"X-Account-Id": {"alice,mallory"}},
		} {
			got := sendHeaders(t, http.MethodPost, r.url+"/orders/pay", "k1", `{}`, h)
			p := requireProblem(t, got, http.StatusBadRequest, frontdoor.CodeInvalidKey, false)
			require.Contains(t, p["detail"], "X-Account-Id", "%v", h)
		}
		require.Equal(t, idem.CodeKeyNotFound, r.getRecordErr(t, "alice:k1"))

		tok := jwt.NewWithClaims(jwt.SigningMethodEdDSA, jwt.RegisteredClaims{
			Subject: "alice", Issuer: "https://auth.example", Audience: jwt.ClaimStrings{"shop-api"},
			ExpiresAt: jwt.NewNumericDate(time.Now().Add(time.Hour)), IssuedAt: jwt.NewNumericDate(time.Now()),
		})
		tok.Header["kid"] = "k1"
		signed, err := tok.SignedString(priv)
		require.NoError(t, err)
		two := sendHeaders(t, http.MethodPost, r.url+"/orders/jwt", "k2", `{}`, http.Header{"Authorization": {"Bearer " + signed, "Bearer other"}})
		requireProblem(t, two, http.StatusBadRequest, frontdoor.CodeInvalidKey, false)
		require.EqualValues(t, 0, r.upstream.Count(), "no refused request reached the upstream")

		one := send(t, http.MethodPost, r.url+"/orders/pay", "k1", `{}`, "X-Account-Id", "alice")
		require.Equal(t, http.StatusCreated, one.status, one.body)
		jwtOne := send(t, http.MethodPost, r.url+"/orders/jwt", "k2", `{}`, "Authorization", "Bearer "+signed)
		require.Equal(t, http.StatusCreated, jwtOne.status, jwtOne.body)
		require.EqualValues(t, 2, r.upstream.Count())
	})
}
