package server_test

import (
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem/server"
	"github.com/idem-dev/idem/testkit/cutproxy"
	"github.com/idem-dev/idem/testkit/servertest"
)

// TestWaitDuringOutageAnswers503 (issue 25, item 6): a claim waiting for
// a key in flight while the store goes away answers 503 store_unavailable
// at the end of its wait, as an immediate claim would then, not the 409
// request_in_flight its last claim before the outage found. PostgreSQL:
// its path cut (the listening connection too, so no event wakes the
// waiter); SQLite: its file moved away. Before, both answered 409 with a
// Retry-After of the lease left.
func TestWaitDuringOutageAnswers503(t *testing.T) {
	t.Parallel()
	bothBackends(t, func(t *testing.T, backend string) {
		opts := servertest.Options{Backend: backend, Tenants: []string{"acme"},
			Configure: func(c *server.Config) { c.StoreTimeout = 2 * c.StoreTimeout / 5 }}
		var cut, restore func()
		if backend == servertest.BackendPostgres {
			url, proxy := cutproxy.Postgres(t)
			opts.DatabaseURL = url
			cut, restore = proxy.Cut, proxy.Restore
		}
		ts := servertest.Start(t, opts)
		if backend == servertest.BackendSQLite {
			path := strings.TrimPrefix(ts.Config().DatabaseURL, "sqlite:")
			cut = func() { require.NoError(t, os.Rename(path, path+".away")) }
			restore = func() { require.NoError(t, os.Rename(path+".away", path)) }
		}
		f := &waitFixture{ts: ts, c: newAPIClient(t, ts), tok: ts.Token(t, "acme", "keys:write", "keys:read")}
		// A first wait, ended by a complete, brings the store's listening
		// connection up: the held claim below subscribes at once and
		// sleeps (a Subscribe that cannot listen answers without waiting).
		warm := f.hold(t, "warm", `{"fingerprint":"fp","lease_seconds":60}`)
		woken := claimAsync(t.Context(), t, f.ts.URL(), f.tok, "warm", `{"fingerprint":"fp","wait_seconds":15}`, nil)
		waitWaiting(t, f.ts.Server(), 1)
		status, body, _ := f.c.call(t, http.MethodPost, "/v1/keys/warm/complete", f.tok,
			fmt.Sprintf(`{"fencing_token":%d,"response":{"status":200,"body":"ok"}}`, warm))
		require.Equal(t, http.StatusOK, status, "%v", body)
		require.Equal(t, http.StatusOK, recv(t, woken).status)

		f.hold(t, "k", `{"fingerprint":"fp","lease_seconds":60}`)
		held := claimAsync(t.Context(), t, f.ts.URL(), f.tok, "k", `{"fingerprint":"fp","wait_seconds":1}`, nil)
		waitWaiting(t, f.ts.Server(), 1)
		cut()
		a := recv(t, held)
		restore()
		require.Equal(t, http.StatusServiceUnavailable, a.status, "the held claim answered %v", a.body)
		require.Equal(t, "store_unavailable", a.body["code"])
		require.NotEmpty(t, a.header.Get("Retry-After"))
		require.Equal(t, 0, f.ts.Server().Waiting())

		// The store back, the key is still held by its first claim.
		require.Eventually(t, func() bool { return readyStatus(t, ts) == http.StatusOK }, 20*time.Second, 10*time.Millisecond)
		status, body, _ = f.c.call(t, http.MethodPost, "/v1/keys/k/claim", f.tok, `{"fingerprint":"fp"}`)
		require.Equal(t, http.StatusConflict, status, "%v", body)
		require.Equal(t, "request_in_flight", body["code"])
	})
}
