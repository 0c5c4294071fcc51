package e2e

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem/testkit/cutproxy"
)

// TestServeWaitsForTheDatabase: serve started while PostgreSQL does not
// answer (its path cut, as during a failover) listens at once, answers
// /healthz 200 and /readyz and claims 503 store_unavailable, and retries
// with backoff (logged); once the path is back it opens the store and
// serves. With the path never back it exits 1 at IDEM_DB_START_TIMEOUT.
// Before, serve exited at once ("server exited before listening").
func TestServeWaitsForTheDatabase(t *testing.T) {
	t.Parallel()
	t.Run("comes back", func(t *testing.T) {
		t.Parallel()
		url, proxy := cutproxy.Postgres(t)
		proxy.Cut()
		env := map[string]string{"IDEM_DATABASE_URL": url, "IDEM_JWT_HS256_SECRET": testSecret, "IDEM_CREATE_DB": "1",
			"IDEM_DB_START_TIMEOUT": "2m", "IDEM_DB_CONNECT_TIMEOUT": "2s"}
		srv := startServer(t, env)
		c := newClient(false)
		require.Equal(t, http.StatusOK, mustCall(t, c, http.MethodGet, srv.url+"/healthz", "", nil).status)
		res := mustCall(t, c, http.MethodGet, srv.url+"/readyz", "", nil)
		require.Equal(t, http.StatusServiceUnavailable, res.status)
		require.Equal(t, "store_unavailable", problemCode(res.body))
		res = mustCall(t, c, http.MethodPost, srv.url+"/v1/keys/k1/claim", "any", map[string]any{"operation": "POST /x"})
		require.Equal(t, http.StatusServiceUnavailable, res.status, string(res.body))
		require.Equal(t, "store_unavailable", problemCode(res.body))
		require.NotEmpty(t, res.header.Get("Retry-After"))
		require.Eventually(t, func() bool {
			return strings.Count(srv.stderr.String(), "the store does not answer at start") >= 2
		}, 30*time.Second, 20*time.Millisecond, "no retries logged")

		proxy.Restore()
		require.Eventually(t, func() bool {
			return mustCall(t, c, http.MethodGet, srv.url+"/readyz", "", nil).status == http.StatusOK
		}, 30*time.Second, 20*time.Millisecond, "serve did not open the store once it answered")
		require.Contains(t, srv.stderr.String(), "the store opened")
		mustCLI(t, env, "tenant", "create", "acme")
		tok := mintToken(t, env, "acme", "keys:write")
		claimAndComplete(t, c, srv.url, tok, "k1", `{"ok":true}`)
		requireReplay(t, c, srv.url, tok, "k1", `{"ok":true}`)
	})
	t.Run("bounded", func(t *testing.T) {
		t.Parallel()
		url, proxy := cutproxy.Postgres(t)
		proxy.Cut()
		env := map[string]string{"IDEM_DATABASE_URL": url, "IDEM_JWT_HS256_SECRET": testSecret, "IDEM_CREATE_DB": "1",
			"IDEM_DB_START_TIMEOUT": "1s", "IDEM_DB_CONNECT_TIMEOUT": "1s"}
		srv := startServer(t, env)
		code := srv.wait(t, 30*time.Second)
		require.Equal(t, 1, code)
		require.Contains(t, srv.stderr.String(), "the store did not open within IDEM_DB_START_TIMEOUT (1s")
	})
}
