package server_test

import (
	"fmt"
	"log/slog"
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

// TestStoreOutageLogged (issue 25, item 5): a store outage is logged once
// when it begins, with its cause, and once when it ends, with its length —
// not once per 503 — and counted (idem_store_outages_total,
// idem_store_outage_seconds_total). PostgreSQL: its path cut; SQLite: its
// file moved away. Before, nothing was logged or counted.
func TestStoreOutageLogged(t *testing.T) {
	t.Parallel()
	bothBackends(t, func(t *testing.T, backend string) {
		logs := &syncBuffer{}
		opts := servertest.Options{Backend: backend, Tenants: []string{"acme"},
			Configure: func(c *server.Config) { c.StoreTimeout = 2 * c.StoreTimeout / 5 },
			Logger:    slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))}
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
		c := newAPIClient(t, ts)
		tok := ts.Token(t, "acme", "keys:write")
		claim := func(key string) int {
			status, _, _ := c.call(t, http.MethodPost, "/v1/keys/"+key+"/claim", tok, `{"fingerprint":"fp"}`)
			return status
		}
		require.Equal(t, http.StatusCreated, claim("before"))
		require.Equal(t, 0.0, c.metric(t, "idem_store_outages_total"))

		cut()
		for i := range 5 {
			require.Equal(t, http.StatusServiceUnavailable, claim(fmt.Sprintf("during-%d", i)))
		}
		restore()
		require.Eventually(t, func() bool { return claim("after") == http.StatusCreated }, 20*time.Second, 20*time.Millisecond)

		out := logs.String()
		require.Equal(t, 1, strings.Count(out, "store outage began"), out)
		require.Equal(t, 1, strings.Count(out, "store outage ended"), out)
		require.Contains(t, out, `"cause":"`)
		require.Contains(t, out, `"lasted":"`)
		require.Equal(t, 1.0, c.metric(t, "idem_store_outages_total"))
		require.Greater(t, c.metric(t, "idem_store_outage_seconds_total"), 0.0)
	})
}

// TestKeyEventsReconnectLogged (issue 25, item 5): PostgreSQL's listening
// connection, which wakes waiting claims, logs its loss and its return
// (with how long it was down) and counts the reconnection. Before,
// neither was logged nor counted.
func TestKeyEventsReconnectLogged(t *testing.T) {
	t.Parallel()
	logs := &syncBuffer{}
	url, proxy := cutproxy.Postgres(t)
	ts := servertest.Start(t, servertest.Options{DatabaseURL: url, Tenants: []string{"acme"},
		Logger: slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	f := &waitFixture{ts: ts, c: newAPIClient(t, ts), tok: ts.Token(t, "acme", "keys:write", "keys:read")}
	// A wait brings the listening connection up.
	held := f.hold(t, "k", `{"fingerprint":"fp","lease_seconds":60}`)
	woken := claimAsync(t.Context(), t, ts.URL(), f.tok, "k", `{"fingerprint":"fp","wait_seconds":15}`, nil)
	waitWaiting(t, ts.Server(), 1)
	status, body, _ := f.c.call(t, http.MethodPost, "/v1/keys/k/complete", f.tok,
		fmt.Sprintf(`{"fencing_token":%d,"response":{"status":200,"body":"ok"}}`, held))
	require.Equal(t, http.StatusOK, status, "%v", body)
	require.Equal(t, http.StatusOK, recv(t, woken).status)
	require.Equal(t, 0.0, f.c.metric(t, "idem_key_events_reconnects_total"))

	proxy.Cut()
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "the listening connection was lost") }, 20*time.Second, 10*time.Millisecond)
	proxy.Restore()
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "listening again") }, 30*time.Second, 10*time.Millisecond)
	require.Equal(t, 1, strings.Count(logs.String(), "the listening connection was lost"), "logged once, not per attempt")
	require.Contains(t, logs.String(), `"down":"`)
	require.Eventually(t, func() bool { return f.c.metric(t, "idem_key_events_reconnects_total") == 1 }, 10*time.Second, 10*time.Millisecond)
}
