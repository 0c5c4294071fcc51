package server_test

import (
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/server"
	"github.com/idem-dev/idem/testkit/cutproxy"
	"github.com/idem-dev/idem/testkit/listenerdown"
	"github.com/idem-dev/idem/testkit/servertest"
)

// startListenerDown is startWait on a store whose key-event subscriptions
// the returned switch holds down (testkit/listenerdown: the real store,
// its Subscribe blocked then failing, as PostgreSQL's while its LISTEN
// connection reconnects).
func startListenerDown(t *testing.T, opts servertest.Options) (*waitFixture, *listenerdown.Switch) {
	sw := &listenerdown.Switch{}
	opts.Tenants = []string{"acme"}
	opts.WrapDriver = func(d idem.Driver) idem.Driver { return listenerdown.Wrap(d, sw) }
	ts := servertest.Start(t, opts)
	return &waitFixture{ts: ts, c: newAPIClient(t, ts), tok: ts.Token(t, "acme", "keys:write", "keys:read")}, sw
}

// waitBlocked waits until n subscriptions are blocked on sw.
func waitBlocked(t *testing.T, sw *listenerdown.Switch, n int) {
	t.Helper()
	require.Eventually(t, func() bool { return sw.Blocked() == n }, 20*time.Second, 2*time.Millisecond,
		"%d waiting claims should be subscribing (%d are)", n, sw.Blocked())
}

// TestWaitListenerDownClaimsAgain (failover harness): a waiting claim
// whose key-event subscription fails — PostgreSQL's LISTEN connection
// still reconnecting, which Subscribe waits up to 2 s for — claims once
// more before it answers, as at the end of a wait: a key completed
// meanwhile answers the 200 replay, one still in flight the 409 with the
// lease left then. Before, it answered its first claim's 409, with the
// Retry-After of that moment, even when the key was completed meanwhile.
func TestWaitListenerDownClaimsAgain(t *testing.T) {
	t.Parallel()
	bothBackends(t, func(t *testing.T, backend string) {
		f, sw := startListenerDown(t, servertest.Options{Backend: backend})

		// Completed while the subscription waited: the replay.
		token := f.hold(t, "done", `{"fingerprint":"fp","lease_seconds":60}`)
		sw.Down()
		held := claimAsync(t.Context(), t, f.ts.URL(), f.tok, "done", `{"fingerprint":"fp"}`, http.Header{"Prefer": {"wait=15"}})
		waitBlocked(t, sw, 1)
		status, body, _ := f.c.call(t, http.MethodPost, "/v1/keys/done/complete", f.tok,
			fmt.Sprintf(`{"fencing_token":%d,"response":{"status":201,"body":"{\"id\":\"ord_1\"}"}}`, token))
		require.Equal(t, http.StatusOK, status, "%v", body)
		sw.Up()
		a := recv(t, held)
		require.Equal(t, http.StatusOK, a.status, "a key completed before the claim answered must replay, got %v", a.body)
		require.Equal(t, "true", a.header.Get("Idempotent-Replayed"))
		require.Equal(t, float64(token), a.body["fencing_token"], "the replay is the holder's record")
		require.Equal(t, `{"id":"ord_1"}`, a.body["response"].(map[string]any)["body"])
		require.Empty(t, a.header.Get("Preference-Applied"), "the claim could not wait")
		require.Equal(t, 0, f.ts.Server().Waiting())
		status, rec, _ := f.c.call(t, http.MethodGet, "/v1/keys/done", f.tok, "")
		require.Equal(t, http.StatusOK, status)
		require.Equal(t, float64(1), rec["attempt"], "nobody else ran the work")

		// Still in flight: the 409's Retry-After is the lease left when
		// it answers, not when the claim arrived.
		const lease = 60
		f.hold(t, "busy", fmt.Sprintf(`{"fingerprint":"fp","lease_seconds":%d}`, lease))
		status, rec, _ = f.c.call(t, http.MethodGet, "/v1/keys/busy", f.tok, "")
		require.Equal(t, http.StatusOK, status)
		expires, err := time.Parse(time.RFC3339Nano, rec["lease_expires_at"].(string))
		require.NoError(t, err)
		sw.Down()
		held = claimAsync(t.Context(), t, f.ts.URL(), f.tok, "busy", `{"fingerprint":"fp","wait_seconds":15}`, nil)
		waitBlocked(t, sw, 1)
		// Hold the subscription until over a second of the lease is gone:
		// the state a Retry-After of the lease left can be told from one
		// of the whole lease by.
		require.Eventually(t, func() bool { return time.Until(expires) < (lease-1)*time.Second-200*time.Millisecond },
			20*time.Second, 10*time.Millisecond)
		sw.Up()
		a = recv(t, held)
		require.Equal(t, http.StatusConflict, a.status, "%v", a.body)
		require.Equal(t, "request_in_flight", a.body["code"])
		ra, err := strconv.Atoi(a.header.Get("Retry-After"))
		require.NoError(t, err)
		require.LessOrEqual(t, ra, lease-1, "Retry-After must be the lease left, not the lease left when the claim arrived")
		require.GreaterOrEqual(t, ra, 1)
		require.Equal(t, 0, f.ts.Server().Waiting())
	})
}

// TestWaitListenerDownStoreGone: a waiting claim whose subscription fails
// while the store went away answers 503 store_unavailable, as an
// immediate claim then would (see TestWaitDuringOutageAnswers503), not
// its first claim's 409. PostgreSQL: its path cut; SQLite: its file moved
// away.
func TestWaitListenerDownStoreGone(t *testing.T) {
	t.Parallel()
	bothBackends(t, func(t *testing.T, backend string) {
		opts := servertest.Options{Backend: backend,
			Configure: func(c *server.Config) { c.StoreTimeout = 2 * c.StoreTimeout / 5 }}
		var cut, restore func()
		if backend == servertest.BackendPostgres {
			url, proxy := cutproxy.Postgres(t)
			opts.DatabaseURL = url
			cut, restore = proxy.Cut, proxy.Restore
		}
		f, sw := startListenerDown(t, opts)
		if backend == servertest.BackendSQLite {
			path := strings.TrimPrefix(f.ts.Config().DatabaseURL, "sqlite:")
			cut = func() { require.NoError(t, os.Rename(path, path+".away")) }
			restore = func() { require.NoError(t, os.Rename(path+".away", path)) }
		}

		f.hold(t, "k", `{"fingerprint":"fp","lease_seconds":60}`)
		sw.Down()
		held := claimAsync(t.Context(), t, f.ts.URL(), f.tok, "k", `{"fingerprint":"fp","wait_seconds":15}`, nil)
		waitBlocked(t, sw, 1)
		cut()
		sw.Up()
		a := recv(t, held)
		restore()
		require.Equal(t, http.StatusServiceUnavailable, a.status, "the claim answered %v", a.body)
		require.Equal(t, "store_unavailable", a.body["code"])
		require.NotEmpty(t, a.header.Get("Retry-After"))
		require.Equal(t, 0, f.ts.Server().Waiting())

		// The store back, the key is still held by its first claim.
		require.Eventually(t, func() bool { return readyStatus(t, f.ts) == http.StatusOK }, 20*time.Second, 10*time.Millisecond)
		status, body, _ := f.c.call(t, http.MethodPost, "/v1/keys/k/claim", f.tok, `{"fingerprint":"fp"}`)
		require.Equal(t, http.StatusConflict, status, "%v", body)
		require.Equal(t, "request_in_flight", body["code"])
	})
}
