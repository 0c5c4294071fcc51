package server_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	_ "modernc.org/sqlite" // the driver of the lock holder

	"github.com/idem-dev/idem/server"
	"github.com/idem-dev/idem/testkit/pgtest"
	"github.com/idem-dev/idem/testkit/servertest"
)

// Fault tests: the store stops answering (a PostgreSQL behind a paused
// network path, a SQLite file whose write lock another connection holds),
// fails (disk full, read-only, login refused, database dropped), or the
// client goes away. Each drives the real server wiring over loopback HTTP
// and checks what the caller gets and that the ledger is intact afterwards.

// faultStoreTimeout is IDEM_STORE_TIMEOUT in the fault tests; answerSlack is
// what a loaded two-core machine running the race detector may add to it.
const (
	faultStoreTimeout = time.Second
	answerSlack       = 4 * time.Second
)

// faultClient waits far longer than the deadline, so a hang shows as a slow
// answer (or a client timeout) instead of ending the test early.
var faultClient = &http.Client{Timeout: 15 * time.Second}

// reply is one HTTP exchange of a fault test.
type reply struct {
	status  int
	header  http.Header
	body    []byte
	elapsed time.Duration
	err     error
}

func (r reply) String() string {
	if r.err != nil {
		return fmt.Sprintf("error after %s: %v", r.elapsed, r.err)
	}
	return fmt.Sprintf("%d after %s: %s", r.status, r.elapsed, bytes.TrimSpace(r.body))
}

func (r reply) json(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal(r.body, &m), r.String())
	return m
}

func call(ctx context.Context, c *http.Client, method, url, token string, body any) reply {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return reply{err: err}
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return reply{err: err}
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	start := time.Now()
	resp, err := c.Do(req)
	if err != nil {
		return reply{err: err, elapsed: time.Since(start)}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return reply{status: resp.StatusCode, header: resp.Header, body: b, err: err, elapsed: time.Since(start)}
}

// requireStoreUnavailable asserts a 503 store_unavailable problem with
// Retry-After, answered within the store timeout plus slack.
func requireStoreUnavailable(t *testing.T, what string, r reply) {
	t.Helper()
	require.NoError(t, r.err, "%s: %s", what, r)
	require.Equal(t, http.StatusServiceUnavailable, r.status, "%s: %s", what, r)
	require.Equal(t, "store_unavailable", r.json(t)["code"], "%s: %s", what, r)
	require.Equal(t, true, r.json(t)["retryable"], "%s: %s", what, r)
	require.NotEmpty(t, r.header.Get("Retry-After"), "%s: %s", what, r)
}

// ledgerFixture is what a fault test stores before the fault: completed keys
// with their responses and in-flight keys with their fencing tokens.
type ledgerFixture struct {
	url, token string
	done       map[string]string // key → stored response body
	open       map[string]int64  // key → fencing token
}

const faultOp = "POST /v1/payments"

func claimBody(key string) map[string]any {
	return map[string]any{"operation": faultOp, "fingerprint": "fp-" + key, "lease_seconds": 600}
}

func completeBody(token int64, body string) map[string]any {
	return map[string]any{"fencing_token": token, "response": map[string]any{
		"status": 201, "headers": map[string]string{"Content-Type": "application/json"}, "body": body}}
}

func newLedgerFixture(t *testing.T, srv *servertest.Server, n int) *ledgerFixture {
	t.Helper()
	f := &ledgerFixture{url: srv.URL(), token: srv.Token(t, "acme", "keys:write"),
		done: map[string]string{}, open: map[string]int64{}}
	ctx := context.Background()
	// The store is healthy here, but the server's deadline is the fault
	// tests' short one: on a loaded machine a call can miss it and answer
	// 503. Such a call is repeated (a claim with its attempt_id, so a claim
	// that did commit gets its own attempt back; a complete as it was,
	// which a completed key accepts again), as a client would.
	settled := func(path string, body any) reply {
		for range 10 {
			r := call(ctx, faultClient, http.MethodPost, f.url+path, f.token, body)
			if r.status != http.StatusServiceUnavailable {
				return r
			}
		}
		return call(ctx, faultClient, http.MethodPost, f.url+path, f.token, body)
	}
	setupClaim := func(key string) map[string]any {
		b := claimBody(key)
		b["attempt_id"] = "fixture-" + key
		return b
	}
	for i := range n {
		key := fmt.Sprintf("done-%d", i)
		r := settled("/v1/keys/"+key+"/claim", setupClaim(key))
		require.Equal(t, http.StatusCreated, r.status, r.String())
		body := fmt.Sprintf(`{"id":"ord_%d"}`, i)
		r = settled("/v1/keys/"+key+"/complete", completeBody(int64(r.json(t)["fencing_token"].(float64)), body))
		require.Equal(t, http.StatusOK, r.status, r.String())
		f.done[key] = body

		key = fmt.Sprintf("open-%d", i)
		r = settled("/v1/keys/"+key+"/claim", setupClaim(key))
		require.Equal(t, http.StatusCreated, r.status, r.String())
		f.open[key] = int64(r.json(t)["fencing_token"].(float64))
	}
	return f
}

// duringFault sends, all at once, a replay claim and a read of every
// completed key, a complete of every in-flight key and a claim of as many
// new keys, plus GET /readyz; it returns every reply by name.
func (f *ledgerFixture) duringFault(n int) map[string]reply {
	type req struct {
		name, method, path string
		body               any
	}
	var reqs []req
	for key := range f.done {
		reqs = append(reqs,
			req{"replay " + key, http.MethodPost, "/v1/keys/" + key + "/claim", claimBody(key)},
			req{"get " + key, http.MethodGet, "/v1/keys/" + key, nil})
	}
	for key, tok := range f.open {
		reqs = append(reqs, req{"complete " + key, http.MethodPost, "/v1/keys/" + key + "/complete",
			completeBody(tok, `{"id":"`+key+`"}`)})
	}
	for i := range n {
		key := fmt.Sprintf("new-%d", i)
		reqs = append(reqs, req{"claim " + key, http.MethodPost, "/v1/keys/" + key + "/claim", claimBody(key)})
	}
	reqs = append(reqs, req{"readyz", http.MethodGet, "/readyz", nil})

	out := make(map[string]reply, len(reqs))
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, rq := range reqs {
		wg.Go(func() {
			r := call(context.Background(), faultClient, rq.method, f.url+rq.path, f.token, rq.body)
			mu.Lock()
			out[rq.name] = r
			mu.Unlock()
		})
	}
	wg.Wait()
	return out
}

// requireIntact checks the ledger after the fault ended: every completed
// key replays its response, every in-flight key completes (or had completed
// during the fault) and then replays what was sent, and every new key has
// one winner at most.
func (f *ledgerFixture) requireIntact(t *testing.T, n int) (replayed int) {
	t.Helper()
	ctx := context.Background()
	replay := func(key, want string) {
		r := call(ctx, faultClient, http.MethodPost, f.url+"/v1/keys/"+key+"/claim", f.token, claimBody(key))
		require.Equal(t, http.StatusOK, r.status, "replay %s: %s", key, r)
		require.Equal(t, "true", r.header.Get("Idempotent-Replayed"), "replay %s", key)
		resp := r.json(t)["response"].(map[string]any)
		require.Equal(t, want, resp["body"], "replay %s: the stored response changed", key)
		replayed++
	}
	for key, body := range f.done {
		replay(key, body)
	}
	for key, tok := range f.open {
		body := `{"id":"` + key + `"}`
		r := call(ctx, faultClient, http.MethodPost, f.url+"/v1/keys/"+key+"/complete", f.token, completeBody(tok, body))
		// The complete sent during the fault may have reached the database
		// after all; then this retry finds it done.
		if r.status != http.StatusOK {
			require.Equal(t, http.StatusConflict, r.status, "complete %s: %s", key, r)
			require.Equal(t, "already_completed", r.json(t)["code"], "complete %s: %s", key, r)
		}
		replay(key, body)
	}
	for i := range n {
		key := fmt.Sprintf("new-%d", i)
		r := call(ctx, faultClient, http.MethodPost, f.url+"/v1/keys/"+key+"/claim", f.token, claimBody(key))
		// A claim sent during the fault may have reached the database; its
		// caller never learnt the fencing token, so the key stays in flight
		// until its lease ends. Either way there is one winner.
		if r.status != http.StatusCreated {
			require.Equal(t, http.StatusConflict, r.status, "claim %s: %s", key, r)
			require.Equal(t, "request_in_flight", r.json(t)["code"], "claim %s: %s", key, r)
			continue
		}
		require.EqualValues(t, 1, r.json(t)["attempt"], "claim %s: %s", key, r)
		r = call(ctx, faultClient, http.MethodPost, f.url+"/v1/keys/"+key+"/claim", f.token, claimBody(key))
		require.Equal(t, http.StatusConflict, r.status, "second claim of %s: %s", key, r)
	}
	return replayed
}

// waitReady polls GET /readyz until it answers 200, for at most 30 s.
func waitReady(t *testing.T, base string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		r := call(context.Background(), faultClient, http.MethodGet, base+"/readyz", "", nil)
		if r.err == nil && r.status == http.StatusOK {
			return
		}
		require.True(t, time.Now().Before(deadline), "the server did not become ready again: %s", r)
		time.Sleep(50 * time.Millisecond)
	}
}

// metric returns the value of one series of GET /metrics (written as
// Prometheus prints it, labels sorted), 0 when absent.
func metric(t *testing.T, base, series string) float64 {
	t.Helper()
	r := call(context.Background(), faultClient, http.MethodGet, base+"/metrics", "", nil)
	require.NoError(t, r.err)
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\S+)$`).FindSubmatch(r.body)
	if m == nil {
		return 0
	}
	v, err := strconv.ParseFloat(string(m[1]), 64)
	require.NoError(t, err)
	return v
}

// waitMetric polls GET /metrics until ok(value of series), for at most 15 s.
func waitMetric(t *testing.T, base, series string, ok func(float64) bool) float64 {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		v := metric(t, base, series)
		if ok(v) {
			return v
		}
		require.True(t, time.Now().Before(deadline), "%s stayed at %v", series, v)
		time.Sleep(50 * time.Millisecond)
	}
}

// pausableProxy forwards TCP connections from a loopback port to a target.
// Pause turns it into a black hole: bytes already sent and new connections
// are held, nothing is answered, nothing is closed. Resume lets everything
// flow again. It stands in for a frozen database server without freezing
// a shared one.
type pausableProxy struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	cond   *sync.Cond
	paused bool
	closed bool
	held   int // reads waiting for Resume
	conns  []net.Conn
}

func newPausableProxy(t *testing.T, target string) *pausableProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &pausableProxy{ln: ln, target: target}
	p.cond = sync.NewCond(&p.mu)
	go p.serve()
	t.Cleanup(p.close)
	return p
}

func (p *pausableProxy) addr() string { return p.ln.Addr().String() }

func (p *pausableProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.track(c) {
			return
		}
		go func() {
			if !p.gate() {
				return
			}
			up, err := net.DialTimeout("tcp", p.target, 10*time.Second)
			if err != nil || !p.track(up) {
				_ = c.Close()
				return
			}
			go p.pipe(up, c)
			p.pipe(c, up)
		}()
	}
}

func (p *pausableProxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		_ = c.Close()
		return false
	}
	p.conns = append(p.conns, c)
	return true
}

// gate waits while the proxy is paused; false once it is closed.
func (p *pausableProxy) gate() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.paused {
		p.held++
		p.cond.Broadcast()
		for p.paused && !p.closed {
			p.cond.Wait()
		}
		p.held--
	}
	return !p.closed
}

func (p *pausableProxy) pipe(dst, src net.Conn) {
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.gate() {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *pausableProxy) pause() {
	p.mu.Lock()
	p.paused = true
	p.mu.Unlock()
}

func (p *pausableProxy) resume() {
	p.mu.Lock()
	p.paused = false
	p.cond.Broadcast()
	p.mu.Unlock()
}

// waitHeld waits until at least n reads or new connections are held by the
// paused proxy, for at most 10 s.
func (p *pausableProxy) waitHeld(t *testing.T, n int) {
	t.Helper()
	timer := time.AfterFunc(10*time.Second, func() {
		p.mu.Lock()
		p.cond.Broadcast()
		p.mu.Unlock()
	})
	defer timer.Stop()
	deadline := time.Now().Add(10 * time.Second)
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.held < n && time.Now().Before(deadline) {
		p.cond.Wait()
	}
	require.GreaterOrEqual(t, p.held, n, "the paused proxy holds %d reads, want %d", p.held, n)
}

func (p *pausableProxy) close() {
	p.mu.Lock()
	p.closed = true
	p.paused = false
	p.cond.Broadcast()
	conns := p.conns
	p.conns = nil
	p.mu.Unlock()
	_ = p.ln.Close()
	for _, c := range conns {
		_ = c.Close()
	}
}

// proxiedPostgres returns a fresh isolated PostgreSQL schema reached
// through a pausable proxy.
func proxiedPostgres(t *testing.T) (dbURL string, p *pausableProxy) {
	t.Helper()
	u, err := url.Parse(pgtest.URL(t))
	require.NoError(t, err)
	p = newPausableProxy(t, u.Host)
	u.Host = p.addr()
	return u.String(), p
}

// sqliteLockHolder holds the write lock of a SQLite file from its own
// connection, as another process would, until release.
type sqliteLockHolder struct {
	db   *sql.DB
	conn *sql.Conn
}

func holdSQLiteWriteLock(t *testing.T, path string) *sqliteLockHolder {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(5000)")
	require.NoError(t, err)
	conn, err := db.Conn(context.Background())
	require.NoError(t, err)
	_, err = conn.ExecContext(context.Background(), "BEGIN IMMEDIATE")
	require.NoError(t, err)
	h := &sqliteLockHolder{db: db, conn: conn}
	t.Cleanup(h.release)
	return h
}

func (h *sqliteLockHolder) release() {
	if h.conn == nil {
		return
	}
	_, _ = h.conn.ExecContext(context.Background(), "ROLLBACK")
	_ = h.conn.Close()
	_ = h.db.Close()
	h.conn = nil
}

// freezableStore gives a database URL for backend and a freeze/thaw pair
// that stops its store answering and lets it answer again: PostgreSQL behind
// a paused network path, SQLite with its write lock held by another
// connection.
func freezableStore(t *testing.T, backend string) (dbURL string, freeze, thaw func()) {
	t.Helper()
	if backend == servertest.BackendPostgres {
		u, p := proxiedPostgres(t)
		return u, p.pause, p.resume
	}
	path := filepath.Join(t.TempDir(), "idem.db")
	var h *sqliteLockHolder
	return "sqlite:" + path, func() { h = holdSQLiteWriteLock(t, path) }, func() { h.release() }
}

// TestStoreDeadline freezes the store under a running server: PostgreSQL
// behind a paused network path (existing connections and new ones hang),
// SQLite with its write lock held by another connection. Every request
// made meanwhile is answered 503 store_unavailable with Retry-After within
// IDEM_STORE_TIMEOUT plus slack, never hangs and never loses its
// connection; once the store answers again, nothing stored is lost and every
// key has one winner.
func TestStoreDeadline(t *testing.T) {
	t.Parallel()
	const n = 5
	for _, backend := range []string{servertest.BackendSQLite, servertest.BackendPostgres} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			dbURL, freeze, thaw := freezableStore(t, backend)
			srv := servertest.Start(t, servertest.Options{
				DatabaseURL: dbURL,
				Tenants:     []string{"acme"},
				Configure:   func(c *server.Config) { c.StoreTimeout = faultStoreTimeout },
			})
			f := newLedgerFixture(t, srv, n)

			freeze()
			t.Cleanup(thaw) // runs before the server stops
			replies := f.duringFault(n)
			// The reaper (every 200 ms here) is bounded too: a pass fails
			// instead of waiting for the store.
			waitMetric(t, srv.URL(), `idem_reaper_runs_total{result="error"}`, func(v float64) bool { return v >= 1 })
			thaw()
			okRuns := metric(t, srv.URL(), `idem_reaper_runs_total{result="ok"}`)

			unavailable, slowest := 0, time.Duration(0)
			for name, r := range replies {
				require.NoError(t, r.err, "%s: no reply: %s", name, r)
				require.LessOrEqual(t, r.elapsed, faultStoreTimeout+answerSlack, "%s: answered too late: %s", name, r)
				slowest = max(slowest, r.elapsed)
				if backend == servertest.BackendSQLite && strings.HasPrefix(name, "get ") {
					// Reads do not need the write lock (WAL); /readyz
					// probes a write, so it fails with the writes.
					require.Equal(t, http.StatusOK, r.status, "%s: %s", name, r)
					continue
				}
				if backend == servertest.BackendSQLite && strings.HasPrefix(name, "replay ") && r.status == http.StatusOK {
					// A replay is one read beside the writer too, when it
					// reaches the store before the tenant's share of
					// writes (a claim counts as one) fills with the
					// frozen completes and claims; then it is the stored
					// response, whole.
					key := strings.TrimPrefix(name, "replay ")
					require.Equal(t, "true", r.header.Get("Idempotent-Replayed"), "%s: %s", name, r)
					require.Equal(t, f.done[key], r.json(t)["response"].(map[string]any)["body"], "%s: %s", name, r)
					continue
				}
				requireStoreUnavailable(t, name, r)
				unavailable++
			}

			waitReady(t, srv.URL())
			waitMetric(t, srv.URL(), `idem_reaper_runs_total{result="ok"}`, func(v float64) bool { return v > okRuns })
			replayed := f.requireIntact(t, n)
			t.Logf("%s: %d requests during the freeze, %d answered 503 store_unavailable (slowest answer %s, "+
				"store timeout %s), %d stored responses replayed after it, 0 lost", backend, len(replies),
				unavailable, slowest.Round(time.Millisecond), faultStoreTimeout, replayed)
		})
	}
}

// TestClientDisconnect sends claims to a server whose store is frozen and
// cancels them once they are on the wire, as a client that timed out or
// went away would. Each is recorded as status 499 (a claim outcome and a
// store result "canceled"), logged at debug level, and never as a 500 or an
// ERROR line; after the thaw every key has one winner at most.
func TestClientDisconnect(t *testing.T) {
	t.Parallel()
	const n = 6
	for _, backend := range []string{servertest.BackendSQLite, servertest.BackendPostgres} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			dbURL, freeze, thaw := freezableStore(t, backend)
			logs := &syncBuffer{}
			srv := servertest.Start(t, servertest.Options{
				DatabaseURL: dbURL,
				Tenants:     []string{"acme"},
				Logger:      slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
				// The client's cancel comes long before the store deadline;
				// were a cancel missed, the deadline still ends the call
				// within the wait below.
				Configure: func(c *server.Config) { c.StoreTimeout = 8 * time.Second },
			})
			t.Cleanup(func() {
				if t.Failed() {
					t.Log("server log:\n" + logs.String())
				}
			})
			tok := srv.Token(t, "acme", "keys:write")
			// The tenant lookup is cached before the freeze, so the claims
			// wait in the store call itself.
			r := call(context.Background(), faultClient, http.MethodPost, srv.URL()+"/v1/keys/warm/claim", tok, claimBody("warm"))
			require.Equal(t, http.StatusCreated, r.status, r.String())

			freeze()
			t.Cleanup(thaw)
			ctx, cancel := context.WithCancel(context.Background())
			wrote := make(chan struct{}, n)
			errs := make(chan error, n)
			for i := range n {
				go func() {
					trace := &httptrace.ClientTrace{WroteRequest: func(httptrace.WroteRequestInfo) { wrote <- struct{}{} }}
					key := fmt.Sprintf("gone-%d", i)
					r := call(httptrace.WithClientTrace(ctx, trace), faultClient, http.MethodPost,
						srv.URL()+"/v1/keys/"+key+"/claim", tok, claimBody(key))
					errs <- r.err
				}()
			}
			timeout := time.After(10 * time.Second)
			for range n {
				select {
				case <-wrote:
				case <-timeout:
					t.Fatal("the claims were not sent within 10 s")
				}
			}
			cancel() // the clients go away mid-request
			for range n {
				require.ErrorIs(t, <-errs, context.Canceled)
			}

			route := `idem_http_request_duration_seconds_count{method="POST",route="/v1/keys/{key}/claim",status_class=`
			waitMetric(t, srv.URL(), route+`"499"}`, func(v float64) bool { return v == n })
			thaw()
			waitReady(t, srv.URL())

			require.Zero(t, metric(t, srv.URL(), route+`"5xx"}`), "a canceled request counted as a server error")
			require.EqualValues(t, n, metric(t, srv.URL(), `idem_claims_total{outcome="canceled",tenant="acme"}`))
			require.Zero(t, metric(t, srv.URL(), `idem_claims_total{outcome="error",tenant="acme"}`))
			require.Zero(t, metric(t, srv.URL(), `idem_store_operation_duration_seconds_count{op="claim",result="error"}`))
			out := logs.String()
			require.NotContains(t, out, `"level":"ERROR"`, "a canceled request logged as an error")
			require.Equal(t, n, strings.Count(out, `"msg":"request canceled by the client"`), out)
			require.Equal(t, n, strings.Count(out, `"status":499`), out)

			// The claims may or may not have reached the store before the
			// cancel; either way each key has one winner at most.
			winners := 0
			for i := range n {
				key := fmt.Sprintf("gone-%d", i)
				r := call(context.Background(), faultClient, http.MethodPost, srv.URL()+"/v1/keys/"+key+"/claim", tok, claimBody(key))
				if r.status == http.StatusCreated {
					winners++
					r = call(context.Background(), faultClient, http.MethodPost, srv.URL()+"/v1/keys/"+key+"/claim", tok, claimBody(key))
				}
				require.Equal(t, http.StatusConflict, r.status, "claim %s: %s", key, r)
			}
			t.Logf("%s: %d claims canceled mid-request: %d counted as 499, 0 as 5xx, 0 ERROR log lines; "+
				"after the thaw %d keys won by the retry, %d kept by the canceled claim", backend, n, n, winners, n-winners)
		})
	}
}

// requireUnavailableWhileFailing sends a claim of a new key, a replay and a
// complete during a store failure and GET /readyz, and asserts each is a
// 503 store_unavailable with Retry-After (never a 500, never retryable:
// false); it returns how many requests it sent.
func (f *ledgerFixture) requireUnavailableWhileFailing(t *testing.T, round int) int {
	t.Helper()
	ctx := context.Background()
	sent := 0
	for key, tok := range f.open {
		r := call(ctx, faultClient, http.MethodPost, f.url+"/v1/keys/"+key+"/complete", f.token,
			completeBody(tok, `{"id":"`+key+`"}`))
		requireStoreUnavailable(t, "complete "+key, r)
		sent++
		break
	}
	newKey := fmt.Sprintf("fail-%d", round)
	r := call(ctx, faultClient, http.MethodPost, f.url+"/v1/keys/"+newKey+"/claim", f.token, claimBody(newKey))
	requireStoreUnavailable(t, "claim "+newKey, r)
	r = call(ctx, faultClient, http.MethodGet, f.url+"/readyz", "", nil)
	requireStoreUnavailable(t, "readyz", r)
	return sent + 2
}

// mountTmpfs mounts a tmpfs of size bytes on a new folder and unmounts it
// when the test ends. It needs root (CI and `make test` run as root); a
// non-root run skips, a root run that cannot mount fails.
func mountTmpfs(t *testing.T, size int) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a small tmpfs it can fill (make test and CI run as root)")
	}
	dir := filepath.Join(t.TempDir(), "mnt")
	require.NoError(t, os.Mkdir(dir, 0o700))
	out, err := exec.Command("mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%d,mode=0700", size), "tmpfs", dir).CombinedOutput()
	require.NoError(t, err, "mount a tmpfs (root is required to fill a disk safely): %s", out)
	t.Cleanup(func() {
		if out, err := exec.Command("umount", "-l", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
		}
	})
	return dir
}

// fillDisk writes a file in dir until the filesystem is full and returns
// its path.
func fillDisk(t *testing.T, dir string) string {
	t.Helper()
	path := filepath.Join(dir, "filler")
	f, err := os.Create(path)
	require.NoError(t, err)
	defer f.Close()
	chunk := make([]byte, 64<<10)
	for {
		n, err := f.Write(chunk)
		if err != nil {
			require.ErrorIs(t, err, syscall.ENOSPC)
			if n == 0 {
				// Fill the last partial block too.
				for size := len(chunk) / 2; size > 0; size /= 2 {
					for {
						if _, err := f.Write(chunk[:size]); err != nil {
							break
						}
					}
				}
				return path
			}
		}
	}
}

// TestSQLiteDiskFull runs the server on a SQLite file in a small tmpfs, then
// fills the filesystem. While it is full, writes and /readyz answer 503
// store_unavailable (retryable), never 500; once space is freed, the server
// is ready again and nothing stored is lost. (A read-only remount cannot be
// made under a process holding the file open for writing; the read-only,
// I/O and open errors are classified by the same table, see
// sqlite.TestInterpretErrorUnavailable.)
func TestSQLiteDiskFull(t *testing.T) {
	t.Parallel()
	dir := mountTmpfs(t, 4<<20)
	srv := servertest.Start(t, servertest.Options{
		DatabaseURL: "sqlite:" + filepath.Join(dir, "idem.db"),
		Tenants:     []string{"acme"},
		Configure:   func(c *server.Config) { c.StoreTimeout = 5 * time.Second },
	})
	f := newLedgerFixture(t, srv, 3)

	filler := fillDisk(t, dir)
	sent := 0
	for round := range 3 {
		sent += f.requireUnavailableWhileFailing(t, round)
	}
	require.NoError(t, os.Remove(filler))

	waitReady(t, srv.URL())
	replayed := f.requireIntact(t, 0)
	t.Logf("sqlite disk full: %d requests while it lasted, all 503 store_unavailable, 0 500s; "+
		"%d stored responses replayed after it, 0 lost", sent, replayed)
}

// TestPostgresLoginFailures runs the server as its own role on its own
// database, then refuses it at login: the role loses LOGIN (as after a
// password change, class 28) and, separately, the database is dropped
// (3D000). Every request and /readyz answer 503 store_unavailable while it
// lasts; once the role may log in again the server is ready and nothing
// stored is lost.
func TestPostgresLoginFailures(t *testing.T) {
	t.Parallel()
	base := pgtest.ServerURL(t)
	admin := func(t *testing.T, sql string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, base)
		require.NoError(t, err)
		defer conn.Close(ctx)
		_, err = conn.Exec(ctx, sql)
		require.NoError(t, err, sql)
	}
	for _, fault := range []string{"login refused", "database dropped"} {
		t.Run(fault, func(t *testing.T) {
			t.Parallel()
			var b [6]byte
			_, _ = rand.Read(b[:])
			name := "idem_fault_" + hex.EncodeToString(b[:])
			admin(t, "CREATE ROLE "+name+" LOGIN PASSWORD '"+name+"'")
			admin(t, "CREATE DATABASE "+name+" OWNER "+name)
			t.Cleanup(func() {
				admin(t, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
				admin(t, "DROP ROLE IF EXISTS "+name)
			})
			u, err := url.Parse(base)
			require.NoError(t, err)
			u.User = url.UserPassword(name, name)
			u.Path = "/" + name
			srv := servertest.Start(t, servertest.Options{
				DatabaseURL: u.String(),
				Tenants:     []string{"acme"},
				Configure:   func(c *server.Config) { c.StoreTimeout = 5 * time.Second },
			})
			f := newLedgerFixture(t, srv, 3)

			terminate := "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '" + name + "'"
			if fault == "login refused" {
				admin(t, "ALTER ROLE "+name+" NOLOGIN")
				admin(t, terminate)
			} else {
				admin(t, "DROP DATABASE "+name+" WITH (FORCE)")
			}
			sent := 0
			for round := range 3 {
				sent += f.requireUnavailableWhileFailing(t, round)
			}
			if fault == "database dropped" {
				t.Logf("postgres %s: %d requests while it lasted, all 503 store_unavailable, 0 500s", fault, sent)
				return
			}
			admin(t, "ALTER ROLE "+name+" LOGIN")
			waitReady(t, srv.URL())
			replayed := f.requireIntact(t, 0)
			t.Logf("postgres %s: %d requests while it lasted, all 503 store_unavailable, 0 500s; "+
				"%d stored responses replayed after it, 0 lost", fault, sent, replayed)
		})
	}
}
