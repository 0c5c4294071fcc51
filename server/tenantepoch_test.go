package server_test

// A token outlived its tenant's deletion (issue 21, hole 8): tenant ids
// are names an operator may give again, and a token names its tenant by
// id. Now a tenant's token issued before the tenant was created (beyond
// the clock skew auth.Leeway allows) is 401, and every token must carry
// iat. Real HTTP on both stores.

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem/auth"
	"github.com/idem-dev/idem/testkit/servertest"
)

// tokenIssuedAt mints an HS256 token of tenant with scope, issued at iat.
func tokenIssuedAt(t *testing.T, ts *servertest.Server, tenant, scope string, iat int64) string {
	t.Helper()
	cfg := ts.Config()
	return hs256(t, []byte(servertest.Secret), `{"alg":"HS256","typ":"JWT"}`, fmt.Sprintf(
		`{"iss":%q,"aud":%q,"sub":"old","iat":%d,"exp":%d,"scope":%q,"tenant":%q}`,
		cfg.JWTIssuer, cfg.JWTAudience, iat, time.Now().Add(time.Hour).Unix(), scope, tenant))
}

// createdAt creates tenant id through the API and returns its created_at.
func createdAt(t *testing.T, c *apiClient, admin, id string) time.Time {
	t.Helper()
	status, body, _ := c.call(t, http.MethodPost, "/v1/admin/tenants", admin, `{"id":"`+id+`"}`)
	require.Equal(t, http.StatusCreated, status, "%v", body)
	at, err := time.Parse(time.RFC3339Nano, body["created_at"].(string))
	require.NoError(t, err)
	return at
}

// TestTokenOfDeletedTenantRefused: a token of tenant t, then t deleted
// and created again: the old token is 401 on every tenant route (reads,
// claims, and the completes that finish claims), a token minted now is
// 200; a token minted right after a tenant is created works at once.
// Before the fix the old token was 200 again as soon as the id existed.
func TestTokenOfDeletedTenantRefused(t *testing.T) {
	t.Parallel()
	for _, backend := range []string{servertest.BackendSQLite, servertest.BackendPostgres} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			ts := servertest.Start(t, servertest.Options{Backend: backend})
			c := newAPIClient(t, ts)
			admin := ts.Token(t, "", "admin")

			first := createdAt(t, c, admin, "t")
			fresh := ts.Token(t, "t", "keys:write")
			status, body, _ := c.call(t, http.MethodGet, "/v1/keys", fresh, "")
			require.Equal(t, http.StatusOK, status, "a token minted right after its tenant: %v", body)
			// The old token: issued 29 s ago, within the skew allowed
			// before the tenant's creation, so the first tenant takes it.
			// Backdating it stands for waiting out auth.Leeway.
			oldIat := time.Now().Unix() - int64(auth.Leeway/time.Second) + 1
			old := tokenIssuedAt(t, ts, "t", "keys:write", oldIat)
			status, body, _ = c.call(t, http.MethodGet, "/v1/keys", old, "")
			require.Equal(t, http.StatusOK, status, "%v", body)
			status, body, _ = c.call(t, http.MethodPost, "/v1/keys/k/claim", old, `{"operation":"op","request":{"n":1}}`)
			require.Equal(t, http.StatusCreated, status, "%v", body)
			fencing := body["fencing_token"].(float64)

			// The second tenant "t" must be created more than Leeway
			// after the old token's iat, in whole seconds (iat is whole
			// seconds; created_at is compared truncated).
			time.Sleep(time.Until(time.Unix(oldIat+int64(auth.Leeway/time.Second)+2, 0)))
			status, _, _ = c.call(t, http.MethodDelete, "/v1/admin/tenants/t", admin, "")
			require.Equal(t, http.StatusNoContent, status)
			second := createdAt(t, c, admin, "t")
			require.True(t, second.After(first))
			require.True(t, time.Unix(oldIat, 0).Before(second.Truncate(time.Second).Add(-auth.Leeway)),
				"the test's premise: the second tenant is more than Leeway younger than the old token (created %s, iat %d)", second, oldIat)

			for _, call := range []struct{ method, path, body string }{
				{http.MethodGet, "/v1/keys", ""},
				{http.MethodGet, "/v1/tenant", ""},
				{http.MethodPost, "/v1/keys/k/claim", `{"operation":"op","request":{"n":1}}`},
				{http.MethodPost, "/v1/keys/k/complete", fmt.Sprintf(`{"fencing_token":%v,"response":{"status":200}}`, fencing)},
			} {
				status, body, _ := c.call(t, call.method, call.path, old, call.body)
				require.Equal(t, http.StatusUnauthorized, status, "%s %s: %v", call.method, call.path, body)
				require.Equal(t, "unauthenticated", body["code"])
				require.Contains(t, body["detail"], "issued before its tenant was created")
			}
			// Nothing of the old tenant's claim came back, and the refused
			// claim claimed nothing: the new tenant's first claim is its own.
			renewed := ts.Token(t, "t", "keys:write")
			status, body, _ = c.call(t, http.MethodGet, "/v1/keys", renewed, "")
			require.Equal(t, http.StatusOK, status, "%v", body)
			require.Empty(t, body["items"])
			status, body, _ = c.call(t, http.MethodPost, "/v1/keys/k/claim", renewed, `{"operation":"op","request":{"n":2}}`)
			require.Equal(t, http.StatusCreated, status, "%v", body)
		})
	}
}

// TestTokenWithoutIatRefused: without iat a token cannot be placed
// before or after its tenant's creation, so the API refuses it (401),
// tenant token or operator token.
func TestTokenWithoutIatRefused(t *testing.T) {
	t.Parallel()
	for _, backend := range []string{servertest.BackendSQLite, servertest.BackendPostgres} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			ts := servertest.Start(t, servertest.Options{Backend: backend, Tenants: []string{"acme"}})
			c := newAPIClient(t, ts)
			cfg := ts.Config()
			exp := time.Now().Add(time.Hour).Unix()
			for path, claims := range map[string]string{
				"/v1/keys":          fmt.Sprintf(`{"iss":%q,"aud":%q,"exp":%d,"scope":"keys:read","tenant":"acme"}`, cfg.JWTIssuer, cfg.JWTAudience, exp),
				"/v1/admin/tenants": fmt.Sprintf(`{"iss":%q,"aud":%q,"exp":%d,"scope":"admin"}`, cfg.JWTIssuer, cfg.JWTAudience, exp),
			} {
				tok := hs256(t, []byte(servertest.Secret), `{"alg":"HS256","typ":"JWT"}`, claims)
				status, body, _ := c.call(t, http.MethodGet, path, tok, "")
				require.Equal(t, http.StatusUnauthorized, status, "%s: %v", path, body)
				require.Equal(t, "the token lacks a required claim (iat)", body["detail"])
			}
		})
	}
}
