package e2e

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	_ "modernc.org/sqlite" // the "sqlite" database/sql driver, to hold a write lock

	"github.com/idem-dev/idem/conformance"
	"github.com/idem-dev/idem/testkit/cutproxy"
)

// gatewayRig is `serve` and `gateway` processes of the real binary on one
// store (for SQLite: one file shared by the two processes), the gateway in
// front of a conformance.Upstream running in the test.
type gatewayRig struct {
	env      map[string]string
	serve    *proc
	upstream *conformance.Upstream
	upURL    string
	config   string
	token    string
}

func newGatewayRig(t *testing.T, backend, config string, extra map[string]string) *gatewayRig {
	t.Helper()
	r := &gatewayRig{env: backendEnv(t, backend, nil)}
	maps.Copy(r.env, extra)
	mustCLI(t, r.env, "tenant", "create", "gw")
	r.serve = startServer(t, r.env)
	r.token = mintToken(t, r.env, "gw", "keys:read")
	r.upstream = conformance.NewUpstream()
	up := httptest.NewServer(r.upstream)
	t.Cleanup(up.Close)
	r.upURL = up.URL
	r.config = filepath.Join(t.TempDir(), "gateway.yaml")
	require.NoError(t, os.WriteFile(r.config, []byte(config), 0o600))
	return r
}

func (r *gatewayRig) startGateway(t *testing.T) *proc {
	t.Helper()
	return startCommand(t, r.env, "gateway", "--listen", "127.0.0.1:0", "--upstream", r.upURL, "--tenant", "gw", "--config", r.config)
}

func (r *gatewayRig) record(t *testing.T, key string) record {
	t.Helper()
	res := mustCall(t, newClient(false), http.MethodGet, r.serve.url+"/v1/keys/"+key, r.token, nil)
	require.Equal(t, http.StatusOK, res.status, string(res.body))
	return decodeRecord(t, res.body)
}

func gatewayPost(c *http.Client, url, key, body string) (result, error) {
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return result{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	resp, err := c.Do(req)
	if err != nil {
		return result{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return result{status: resp.StatusCode, header: resp.Header, body: b}, err
}

// TestGatewayKill9MidRequest: the gateway process is killed (kill -9) while
// the upstream handles a request. The claim is left in flight, becomes an
// orphan when its lease runs out (the serve process sees it), and the
// client's retry through a new gateway process takes it over and completes
// it; the retry before the lease ran out was refused with 409.
func TestGatewayKill9MidRequest(t *testing.T) {
	t.Parallel()
	for _, backend := range []string{"sqlite", "postgres"} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			r := newGatewayRig(t, backend, "defaults:\n  lease: 2s\n", nil)
			gw := r.startGateway(t)
			release := r.upstream.Hold()
			errc := make(chan error, 1)
			go func() {
				_, err := gatewayPost(newClient(false), gw.url+"/orders", "crash-1", `{"sku":"A"}`)
				errc <- err
			}()
			require.Eventually(t, func() bool { return r.upstream.Entered() == 1 }, 20*time.Second, 5*time.Millisecond)
			require.NoError(t, gw.cmd.Process.Signal(syscall.SIGKILL))
			gw.wait(t, 10*time.Second)
			require.Error(t, <-errc, "the client lost its answer")
			release()
			require.Eventually(t, func() bool { return r.upstream.Count() == 1 }, 10*time.Second, 5*time.Millisecond)

			gw2 := r.startGateway(t)
			rec := r.record(t, "crash-1")
			require.Contains(t, []string{"in_flight", "orphaned"}, rec.State)
			if rec.State == "in_flight" {
				early, err := gatewayPost(newClient(false), gw2.url+"/orders", "crash-1", `{"sku":"A"}`)
				require.NoError(t, err)
				require.Equal(t, http.StatusConflict, early.status, "no takeover before the lease runs out")
			}
			require.Eventually(t, func() bool { return r.record(t, "crash-1").State == "orphaned" }, 10*time.Second, 50*time.Millisecond)

			retry, err := gatewayPost(newClient(false), gw2.url+"/orders", "crash-1", `{"sku":"A"}`)
			require.NoError(t, err)
			require.Equal(t, http.StatusCreated, retry.status, string(retry.body))
			rec = r.record(t, "crash-1")
			require.Equal(t, "completed", rec.State)
			require.Equal(t, 2, rec.Attempt, "taken over")
			require.Equal(t, string(retry.body), rec.Response.Body)
			require.Equal(t, int64(2), r.upstream.Count(), "the takeover called the upstream again: the gateway cannot know the first call's outcome")
			again, err := gatewayPost(newClient(false), gw2.url+"/orders", "crash-1", `{"sku":"A"}`)
			require.NoError(t, err)
			require.Equal(t, "true", again.header.Get("Idempotent-Replayed"))
			require.Equal(t, int64(2), r.upstream.Count())
		})
	}
}

// TestGatewayConcurrentDuplicatesReplicas: concurrent duplicates sent to
// two gateway processes on one store give one upstream call, and every
// client gets the same stored response.
func TestGatewayConcurrentDuplicatesReplicas(t *testing.T) {
	t.Parallel()
	for _, backend := range []string{"sqlite", "postgres"} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			r := newGatewayRig(t, backend, "", nil)
			gws := []*proc{r.startGateway(t), r.startGateway(t)}
			release := r.upstream.Hold()
			const callers = 12
			bodies := make([]string, callers)
			var wg sync.WaitGroup
			c := newClient(true)
			for i := range callers {
				wg.Go(func() {
					for range 400 {
						res, err := gatewayPost(c, gws[i%2].url+"/orders", "dup-1", `{"sku":"Z"}`)
						if err != nil || res.status == http.StatusConflict {
							time.Sleep(10 * time.Millisecond)
							continue
						}
						if res.status == http.StatusCreated {
							bodies[i] = string(res.body)
						}
						return
					}
				})
			}
			require.Eventually(t, func() bool { return r.upstream.Entered() == 1 }, 20*time.Second, 5*time.Millisecond)
			time.Sleep(100 * time.Millisecond) // let the duplicates pile up on the claimed key
			release()
			wg.Wait()
			require.Equal(t, int64(1), r.upstream.Count(), "one upstream call")
			require.Contains(t, bodies[0], `"order":1`)
			for i := range callers {
				require.Equal(t, bodies[0], bodies[i], "caller %d", i)
			}
		})
	}
}

// TestGatewayStoreDown: the store stops answering (SQLite: another process
// holds the write lock; PostgreSQL: the network path to it is cut). A
// protected request gets 503 store_unavailable with Retry-After within
// IDEM_STORE_TIMEOUT, and the upstream is not called.
func TestGatewayStoreDown(t *testing.T) {
	t.Parallel()
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		r := newGatewayRig(t, "sqlite", "", map[string]string{"IDEM_STORE_TIMEOUT": "700ms"})
		gw := r.startGateway(t)
		ok, err := gatewayPost(newClient(false), gw.url+"/orders", "before", `{}`)
		require.NoError(t, err)
		require.Equal(t, http.StatusCreated, ok.status)

		db, err := sql.Open("sqlite", strings.TrimPrefix(r.env["IDEM_DATABASE_URL"], "sqlite:"))
		require.NoError(t, err)
		defer db.Close()
		conn, err := db.Conn(context.Background())
		require.NoError(t, err)
		defer conn.Close()
		_, err = conn.ExecContext(context.Background(), "BEGIN IMMEDIATE")
		require.NoError(t, err)
		requireStoreDown(t, gw.url, r.upstream, 1)
		_, err = conn.ExecContext(context.Background(), "ROLLBACK")
		require.NoError(t, err)
		after, err := gatewayPost(newClient(false), gw.url+"/orders", "down-1", `{}`)
		require.NoError(t, err)
		require.Equal(t, http.StatusCreated, after.status, "the same key works once the store is back")
	})
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		dbURL, proxy := cutproxy.Postgres(t)
		cut := proxy.Cut
		r := newGatewayRig(t, "postgres", "", map[string]string{"IDEM_STORE_TIMEOUT": "700ms", "IDEM_DATABASE_URL": dbURL})
		gw := r.startGateway(t)
		ok, err := gatewayPost(newClient(false), gw.url+"/orders", "before", `{}`)
		require.NoError(t, err)
		require.Equal(t, http.StatusCreated, ok.status)
		cut()
		requireStoreDown(t, gw.url, r.upstream, 1)
	})
}

func requireStoreDown(t *testing.T, url string, up *conformance.Upstream, count int64) {
	t.Helper()
	start := time.Now()
	down, err := gatewayPost(newClient(false), url+"/orders", "down-1", `{}`)
	require.NoError(t, err)
	require.Equal(t, http.StatusServiceUnavailable, down.status, string(down.body))
	require.Equal(t, "store_unavailable", problemCode(down.body))
	require.NotEmpty(t, down.header.Get("Retry-After"))
	require.Less(t, time.Since(start), 10*time.Second)
	require.Equal(t, count, up.Count(), "the upstream was not called")
}

// TestConformanceCLIAgainstTheGateway runs `server conformance` against a
// gateway process: every scenario passes but store_unavailable and expiry,
// which need --store-down and --expiry and are skipped without them; with
// --json the report is one JSON document.
func TestConformanceCLIAgainstTheGateway(t *testing.T) {
	t.Parallel()
	r := newGatewayRig(t, "sqlite", "", nil)
	gw := r.startGateway(t)
	out := mustCLI(t, nil, "conformance", "--target", gw.url)
	require.Contains(t, out, "SKIP  store_unavailable")
	require.Contains(t, out, "SKIP  expiry")
	require.True(t, strings.HasSuffix(out, fmt.Sprintf("\n%d passed, 0 failed\n", len(conformance.Scenarios())-2)), out)
	js := mustCLI(t, nil, "conformance", "--target", gw.url, "--json", "--scenarios", "first_request,mismatch_422")
	rep, err := conformance.ReadJSON(strings.NewReader(js))
	require.NoError(t, err, js)
	require.Equal(t, 2, rep.Passed(), js)
	require.Equal(t, conformance.ClassRecommended, rep.Results[0].Class, js)

	// --store-down and --store-up: two URLs the kit POSTs; here they take
	// and give back the SQLite file's write lock.
	var mu sync.Mutex
	var conn *sql.Conn
	db, err := sql.Open("sqlite", "file:"+strings.TrimPrefix(r.env["IDEM_DATABASE_URL"], "sqlite:")+"?_pragma=busy_timeout(10000)")
	require.NoError(t, err)
	defer db.Close()
	hooks := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		var err error
		switch req.URL.Path {
		case "/down":
			if conn, err = db.Conn(context.Background()); err == nil {
				_, err = conn.ExecContext(context.Background(), "BEGIN IMMEDIATE")
			}
		case "/up":
			_, err = conn.ExecContext(context.Background(), "ROLLBACK")
			_ = conn.Close()
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
		}
	}))
	defer hooks.Close()
	down := mustCLI(t, nil, "conformance", "--target", gw.url, "--scenarios", "store_unavailable",
		"--store-down", hooks.URL+"/down", "--store-up", hooks.URL+"/up")
	require.Contains(t, down, "PASS  store_unavailable", down)
	_, errOut, code := runCLI(t, nil, "conformance", "--target", r.upURL)
	require.Equal(t, 1, code, "the bare upstream has no Idempotency-Key support: %s", errOut)
}

// TestGatewaySIGHUPReload: SIGHUP reloads the route file while a request
// is in flight; that request completes, and the next ones follow the new
// file. An invalid file is refused and the running configuration stays.
func TestGatewaySIGHUPReload(t *testing.T) {
	t.Parallel()
	r := newGatewayRig(t, "sqlite", "", nil)
	gw := r.startGateway(t)
	missing, err := gatewayPost(newClient(false), gw.url+"/orders", "", `{}`)
	require.NoError(t, err)
	require.Equal(t, http.StatusBadRequest, missing.status, "POST requires a key by default")

	release := r.upstream.Hold()
	done := make(chan result, 1)
	go func() {
		res, _ := gatewayPost(newClient(false), gw.url+"/orders", "hup-1", `{}`)
		done <- res
	}()
	require.Eventually(t, func() bool { return r.upstream.Entered() == 1 }, 20*time.Second, 5*time.Millisecond)
	require.NoError(t, os.WriteFile(r.config, []byte("defaults:\n  required_methods: []\n"), 0o600))
	require.NoError(t, gw.cmd.Process.Signal(syscall.SIGHUP))
	require.Eventually(t, func() bool { return strings.Contains(gw.stderr.String(), "gateway config reloaded") }, 10*time.Second, 10*time.Millisecond)
	release()
	require.Equal(t, http.StatusCreated, (<-done).status, "the request in flight during the reload was not dropped")
	require.Equal(t, "completed", r.record(t, "hup-1").State)

	resp, err := newClient(false).Do(mustRequest(t, gw.url+"/orders"))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusCreated, resp.StatusCode, "the new file requires no key")

	require.NoError(t, os.WriteFile(r.config, []byte("routes: [{path: nope}]\n"), 0o600))
	require.NoError(t, gw.cmd.Process.Signal(syscall.SIGHUP))
	require.Eventually(t, func() bool { return strings.Contains(gw.stderr.String(), "reload failed") }, 10*time.Second, 10*time.Millisecond)
	resp, err = newClient(false).Do(mustRequest(t, gw.url+"/orders"))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusCreated, resp.StatusCode, "the previous configuration stays")
}

func mustRequest(t *testing.T, url string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(`{}`))
	require.NoError(t, err)
	return req
}

// TestGatewayRefusalsNeverFailOpen: the real `serve` and `gateway`
// processes on one store, the tenant changed with the CLI while they run
// (tenant cache off). A route with fail_open: true and lease: 2m keeps one
// upstream call per key after `tenant set --lease-seconds-max=60` (the
// lease is clamped), and once the tenant is disabled the same key twice
// is 403 tenant_unknown, not retryable, and never reaches the upstream.
// Before the fix both refusals were taken for store failures and each
// request went upstream unprotected: two upstream calls per key.
func TestGatewayRefusalsNeverFailOpen(t *testing.T) {
	t.Parallel()
	for _, backend := range []string{"sqlite", "postgres"} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			r := newGatewayRig(t, backend, "routes:\n  - path: /orders/open\n    fail_open: true\n    lease: 2m\n",
				map[string]string{"IDEM_TENANT_CACHE_TTL": "0s"})
			gw := r.startGateway(t)
			c := newClient(false)
			mustCLI(t, r.env, "tenant", "set", "gw", "--lease-seconds-max=60")
			for i := range 2 {
				res, err := gatewayPost(c, gw.url+"/orders/open", "lease-1", `{}`)
				require.NoError(t, err)
				require.Equal(t, http.StatusCreated, res.status, string(res.body))
				require.Equal(t, i == 1, res.header.Get("Idempotent-Replayed") == "true", "the retry is replayed: %s", res.body)
			}
			require.Equal(t, int64(1), r.upstream.Count(), "one upstream call for the key")

			mustCLI(t, r.env, "tenant", "set", "gw", "--disabled=true")
			for range 2 {
				res, err := gatewayPost(c, gw.url+"/orders/open", "off-1", `{}`)
				require.NoError(t, err)
				require.Equal(t, http.StatusForbidden, res.status, string(res.body))
				require.Equal(t, "tenant_unknown", problemCode(res.body))
				require.Contains(t, string(res.body), `"retryable":false`)
				require.Empty(t, res.header.Get("Retry-After"))
			}
			require.Equal(t, int64(1), r.upstream.Count(), "no refused request reached the upstream")
		})
	}
}

// TestGatewayKeySpaces: the gateway binary refuses an unscoped key with
// ':' (it would be a scoped record key: alice:sq is alice's sq), a scope
// header sent twice, and keeps a route's scope on /orders/PAY/. Before the
// fix each of them reached the upstream: the squat ran and made alice's
// own request 422, the doubled header was scoped as its first value, and
// /orders/PAY/ ran unscoped.
func TestGatewayKeySpaces(t *testing.T) {
	t.Parallel()
	for _, backend := range []string{"sqlite", "postgres"} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			r := newGatewayRig(t, backend, "routes:\n  - path: /orders/pay\n    scope_header: X-Account-Id\n", nil)
			gw := r.startGateway(t)
			c := newClient(false)
			squat, err := gatewayPost(c, gw.url+"/orders", "alice:sq", `{}`)
			require.NoError(t, err)
			require.Equal(t, http.StatusBadRequest, squat.status, string(squat.body))
			require.Equal(t, "invalid_key", problemCode(squat.body))

			for _, h := range []http.Header{{}, {"X-Account-Id": {"alice", "mallory"}}} {
				req, err := http.NewRequest(http.MethodPost, gw.url+"/orders/PAY/", strings.NewReader(`{}`))
				require.NoError(t, err)
				req.Header = h
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Idempotency-Key", "sq")
				resp, err := c.Do(req)
				require.NoError(t, err)
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				require.Equal(t, http.StatusBadRequest, resp.StatusCode, "%v: %s", h, b)
				require.Equal(t, "invalid_key", problemCode(b))
			}
			require.Equal(t, int64(0), r.upstream.Count(), "no refused request reached the upstream")

			req, err := http.NewRequest(http.MethodPost, gw.url+"/orders/pay", strings.NewReader(`{}`))
			require.NoError(t, err)
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Idempotency-Key", "sq")
			req.Header.Set("X-Account-Id", "alice")
			resp, err := c.Do(req)
			require.NoError(t, err)
			resp.Body.Close()
			require.Equal(t, http.StatusCreated, resp.StatusCode, "alice's own key runs")
			require.Equal(t, "completed", r.record(t, "alice:sq").State)
			require.Equal(t, int64(1), r.upstream.Count())
		})
	}
}
