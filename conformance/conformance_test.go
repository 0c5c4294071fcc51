package conformance_test

import (
	"context"
	"database/sql"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	_ "modernc.org/sqlite" // the "sqlite" database/sql driver, to hold a write lock

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/client"
	"github.com/idem-dev/idem/client/idemhttp"
	"github.com/idem-dev/idem/conformance"
	"github.com/idem-dev/idem/gateway"
	"github.com/idem-dev/idem/keyevents"
	"github.com/idem-dev/idem/testkit/cutproxy"
	"github.com/idem-dev/idem/testkit/servertest"
)

// run runs the kit against target and requires every scenario to pass, none
// skipped but those opts cannot run.
func run(t *testing.T, opts conformance.Options) {
	t.Helper()
	rep := conformance.Run(context.Background(), opts)
	var out strings.Builder
	rep.Write(&out)
	t.Log("\n" + out.String())
	require.Zero(t, rep.Failed(), out.String())
	// Only the scenarios opts give no means to run are skipped: expiry
	// without Options.Expiry, store_unavailable without StoreDown.
	skips := []string{}
	if opts.Expiry == 0 {
		skips = append(skips, "expiry")
	}
	if opts.StoreDown == nil {
		skips = append(skips, "store_unavailable")
	}
	want := len(conformance.Scenarios())
	if opts.Scenarios != nil {
		want, skips = len(opts.Scenarios), []string{}
	}
	skipped := []string{}
	for _, x := range rep.Results {
		if x.Skipped {
			skipped = append(skipped, x.Name)
		}
	}
	require.ElementsMatch(t, skips, skipped, out.String())
	require.Equal(t, want-len(skips), rep.Passed(), out.String())
}

// shortWindow is the replay window of the tenant the expiry scenario runs
// against: the published expiry of its keys.
const shortWindow = 2

// idemServer starts an idem server on backend whose store (SQLite: a write
// lock held by another connection; PostgreSQL: the path to it) can be made
// to fail; it returns the server and the StoreDown hook.
func idemServer(t *testing.T, backend string) (*servertest.Server, func(context.Context) (func(), error)) {
	t.Helper()
	if backend == servertest.BackendPostgres {
		dbURL, p := cutproxy.Postgres(t)
		srv := servertest.Start(t, servertest.Options{DatabaseURL: dbURL, Tenants: []string{"conf"}})
		return srv, func(context.Context) (func(), error) { p.Cut(); return p.Restore, nil }
	}
	srv := servertest.Start(t, servertest.Options{Backend: backend, Tenants: []string{"conf"}})
	return srv, func(ctx context.Context) (func(), error) {
		// The server's own writes hold the file's write lock for moments
		// at a time: wait for it (busy_timeout) instead of failing with
		// SQLITE_BUSY when the kit's store-down hook lands on one.
		db, err := sql.Open("sqlite", "file:"+srv.Config().SQLitePath()+"?_pragma=busy_timeout(10000)")
		if err != nil {
			return nil, err
		}
		conn, err := db.Conn(ctx)
		if err != nil {
			_ = db.Close()
			return nil, err
		}
		if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
			_ = conn.Close()
			_ = db.Close()
			return nil, err
		}
		return func() {
			_, _ = conn.ExecContext(context.Background(), "ROLLBACK")
			_ = conn.Close()
			_ = db.Close()
		}, nil
	}
}

// TestGatewayConformance runs the kit against the gateway in front of the
// reference upstream, on both stores.
func TestGatewayConformance(t *testing.T) {
	t.Parallel()
	for _, backend := range []string{servertest.BackendSQLite, servertest.BackendPostgres} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			srv, storeDown := idemServer(t, backend)
			up := httptest.NewServer(conformance.NewUpstream())
			t.Cleanup(up.Close)
			// Prefer: wait needs the waiters the gateway command wires.
			waiters := keyevents.NewWaiters(srv.Store().KeyEvents(), 64)
			g, err := gateway.New(gateway.Options{Store: srv.Store(), Tenant: "conf", Upstream: up.URL, StoreTimeout: 3 * time.Second, Waiters: waiters})
			require.NoError(t, err)
			gw := httptest.NewServer(g)
			t.Cleanup(gw.Close)
			t.Run("expiry", func(t *testing.T) {
				t.Parallel()
				srv.CreateTenant(t, "short", idem.SettingsPatch{ReplayWindowSeconds: ptr(shortWindow)})
				g, err := gateway.New(gateway.Options{Store: srv.Store(), Tenant: "short", Upstream: up.URL})
				require.NoError(t, err)
				short := httptest.NewServer(g)
				t.Cleanup(short.Close)
				run(t, conformance.Options{Target: short.URL, Expiry: shortWindow * time.Second, Scenarios: []string{"expiry"}})
			})
			run(t, conformance.Options{Target: gw.URL, StoreDown: storeDown})
		})
	}
}

// TestIdemhttpConformance runs the kit against the reference upstream
// wrapped by client/idemhttp, whose idem service is reached through a
// proxy the store_unavailable scenario cuts.
func TestIdemhttpConformance(t *testing.T) {
	t.Parallel()
	for _, backend := range []string{servertest.BackendSQLite, servertest.BackendPostgres} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			srv := servertest.Start(t, servertest.Options{Backend: backend, Tenants: []string{"conf"}})
			p, err := cutproxy.New(srv.Addr())
			require.NoError(t, err)
			t.Cleanup(p.Close)
			c, err := client.New("http://"+p.Addr(), client.WithToken(srv.Token(t, "conf", "keys:write")),
				client.WithRetryPolicy(client.RetryPolicy{MaxAttempts: 2, BaseDelay: 20 * time.Millisecond, AttemptTimeout: 5 * time.Second}))
			require.NoError(t, err)
			t.Run("expiry", func(t *testing.T) {
				t.Parallel()
				srv.CreateTenant(t, "short", idem.SettingsPatch{ReplayWindowSeconds: ptr(shortWindow)})
				c, err := client.New(srv.URL(), client.WithToken(srv.Token(t, "short", "keys:write")))
				require.NoError(t, err)
				app := idemhttpApp(t, c)
				run(t, conformance.Options{Target: app.URL, Path: "/orders/1", Expiry: shortWindow * time.Second, Scenarios: []string{"expiry"}})
			})
			app := idemhttpApp(t, c)
			run(t, conformance.Options{Target: app.URL, Path: "/orders/1", OtherPath: "/orders/2",
				StoreDown: func(context.Context) (func(), error) { p.Cut(); return p.Restore, nil }})
		})
	}
}

// idemhttpApp serves the reference upstream wrapped by client/idemhttp on
// one route pattern (fingerprint_scope reuses a key on /orders/2 of the
// route that served /orders/1), and its counter.
func idemhttpApp(t *testing.T, c *client.Client) *httptest.Server {
	t.Helper()
	upstream := conformance.NewUpstream()
	mux := http.NewServeMux()
	mux.Handle("/orders/{id}", idemhttp.Middleware(c, idemhttp.Options{})(upstream))
	mux.Handle("GET /count", upstream)
	app := httptest.NewServer(mux)
	t.Cleanup(app.Close)
	return app
}

func ptr[T any](v T) *T { return &v }

func TestReportEndsWithTheCounts(t *testing.T) {
	rep := conformance.Report{Target: "http://x", Results: []conformance.Result{
		{Name: "a", Class: conformance.ClassCore, Passed: true}, {Name: "b", Class: conformance.ClassIdem, Detail: "broken"},
		{Name: "c", Class: conformance.ClassIdem, Skipped: true, Detail: "no hook"},
	}}
	var out strings.Builder
	rep.Write(&out)
	require.True(t, strings.HasSuffix(out.String(), "\n1 passed, 1 failed\n"), out.String())
	require.Contains(t, out.String(), "core: 1 passed, 0 failed, 0 skipped")
	require.Contains(t, out.String(), "idem: 0 passed, 1 failed, 1 skipped")
	require.Contains(t, out.String(), "FAIL  b")
	require.Contains(t, out.String(), "1 skipped")

	var js strings.Builder
	require.NoError(t, rep.WriteJSON(&js))
	back, err := conformance.ReadJSON(strings.NewReader(js.String()))
	require.NoError(t, err)
	require.Equal(t, rep, back, js.String())
	require.Contains(t, js.String(), `"idem": {`)
}

// TestEveryScenarioCitesItsSource: each scenario has a known class and a
// reference, and names are unique.
func TestEveryScenarioCitesItsSource(t *testing.T) {
	seen := map[string]bool{}
	for _, s := range conformance.Scenarios() {
		require.False(t, seen[s.Name], s.Name)
		seen[s.Name] = true
		require.Contains(t, conformance.Classes, s.Class, s.Name)
		require.NotEmpty(t, s.Ref, s.Name)
		require.NotEmpty(t, s.Description, s.Name)
	}
}
