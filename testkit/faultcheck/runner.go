package faultcheck

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	_ "modernc.org/sqlite" // the "sqlite" database/sql driver, to hold the store's write lock

	"github.com/idem-dev/idem/testkit/cutproxy"
	"github.com/idem-dev/idem/testkit/launch"
	"github.com/idem-dev/idem/testkit/pgtest"
)

// Bins are the binaries a run starts: the real idem server and the Go app,
// and listenerserve (the server wiring whose key-event subscriptions a
// signal holds down, for the listenerdown kind).
type Bins struct {
	Idem, GoApp, ListenerServe string
	Root                       string // the repository's root
}

// Build builds the idem binary (go build ./cmd/server) and the Go app into
// dir, once per test binary.
func Build(dir string) (Bins, error) {
	root, err := repoRoot()
	if err != nil {
		return Bins{}, err
	}
	b := Bins{Idem: filepath.Join(dir, "idem"), GoApp: filepath.Join(dir, "goapp"), ListenerServe: filepath.Join(dir, "listenerserve"), Root: root}
	for _, p := range [][2]string{{b.Idem, "./cmd/server"}, {b.GoApp, "./testkit/faultcheck/goapp"}, {b.ListenerServe, "./testkit/faultcheck/listenerserve"}} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		cmd := exec.CommandContext(ctx, "go", "build", "-o", p[0], p[1])
		cmd.Dir = root
		out, err := cmd.CombinedOutput()
		cancel()
		if err != nil {
			return Bins{}, fmt.Errorf("go build %s: %v\n%s", p[1], err, out)
		}
	}
	return b, nil
}

func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			if b, _ := os.ReadFile(filepath.Join(dir, "go.mod")); bytes.HasPrefix(b, []byte("module github.com/idem-dev/idem\n")) {
				return dir, nil
			}
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("faultcheck: the repository root (go.mod of github.com/idem-dev/idem) is not above %s", dir)
		}
		dir = parent
	}
}

// secret is the HS256 secret of the server under test.
const secret = "faultcheck-hs256-secret-0123456789abcdef"

// ScopeHeader is the header every scoped front door reads the scope from.
const ScopeHeader = "X-Account-Id"

// proc is a running process of the rig.
type proc = launch.Proc

// LogDir, when set (-faultcheck.logdir), is where each rig appends the
// whole stderr of its processes, one file per front door, store and
// process (the app, serve, the gateway; restarts append): a failure
// report keeps only their last lines, and a violation that does not
// reproduce is diagnosed from these (which call failed, why it was given
// up).
var LogDir string //nolint:gochecknoglobals // set once from the flag before any rig starts

// startLogged starts argv with env and waits until listening(line) of one
// of its stdout or stderr lines returns the address it listens on; with
// LogDir set, the process's stderr is also appended to
// LogDir/<front door>-<store>-<name>.log.
func (r *Rig) startLogged(name string, env []string, dir string, listening func(line string) string, argv ...string) (*proc, error) {
	o := launch.Options{Env: env, Dir: dir, Listening: listening}
	if LogDir != "" {
		f, err := os.OpenFile(filepath.Join(LogDir, r.FrontDoor+"-"+r.Store+"-"+name+".log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
		if err != nil {
			return nil, err
		}
		r.tb.Cleanup(func() { _ = f.Close() })
		o.Log = f
	}
	return launch.Start(o, argv...)
}

// appListening reads the app's FC_LISTENING line (PROTOCOL.md).
func appListening(line string) string {
	if a, ok := strings.CutPrefix(strings.TrimSpace(line), "FC_LISTENING http://"); ok {
		return a
	}
	return ""
}

// baseEnv is the process environment without IDEM_ and FC_ variables, plus env.
func baseEnv(env map[string]string) []string { return launch.Environ(env, "FC_") }

// Tenant is the tenant under test; HogTenant the other tenant of the hog.
const (
	Tenant    = "fc"
	HogTenant = "hog"
)

// Lease is the lease of every claim under test (the tenant's default and the
// gateway routes' lease).
const Lease = 2 * time.Second

// The idem server's body limits under test: small, so that the hog's few
// connections can hold the whole in-flight budget.
const (
	maxBodyBytes     = 64 << 10
	maxInflightBytes = 16 * maxBodyBytes
)

// Rig is the processes of one front door on one store: the idem server
// (serve), the front door (the gateway, or an app with its middleware) and
// the counting app.
type Rig struct {
	tb        testing.TB
	bins      Bins
	FrontDoor string
	Store     string

	env        map[string]string // the store's environment
	listener   bool              // serve is listenerserve (the listenerdown kind is on)
	serveAddr  string            // set by the first start; restarts keep it
	mu         sync.Mutex        // guards serve and gateway, replaced by a kill -9
	serve      *proc
	idemProxy  *cutproxy.Proxy // apps: the app's path to the idem server
	pgProxy    *cutproxy.Proxy // gateway on PostgreSQL: its path to the store
	gwAddr     string
	gateway    *proc
	app        *proc
	appEnv     map[string]string
	appArgv    []string
	LogPath    string
	gwConfig   string
	gwEnvStore string
	admin      string // operator token
	hogToken   string
	readToken  string // keys:read of the tenant: the budget fault's retries
	BaseURL    string // where the clients send
	// lastFaults is the faults of the schedule Execute ran last
	// (History.Before of the next).
	lastFaults []*Injected
	http       *http.Client
}

// AppArgv returns the command of an app front door, or an error naming
// what is missing.
func AppArgv(b Bins, frontdoor string) ([]string, error) {
	switch frontdoor {
	case "gateway", "idemhttp":
		return []string{b.GoApp}, nil
	case "asgi", "wsgi":
		py := filepath.Join(b.Root, ".venv", "bin", "python")
		if _, err := os.Stat(py); err != nil {
			return nil, fmt.Errorf("%s missing (scripts/install-test-deps makes it)", py)
		}
		app, err := firstFile(filepath.Join(b.Root, "testkit", "faultcheck", "apps", "python"), "app.py", "main.py")
		if err != nil {
			return nil, err
		}
		return []string{py, app}, nil
	case "express", "fetch":
		node, err := exec.LookPath("node")
		if err != nil {
			return nil, fmt.Errorf("node not on PATH")
		}
		if _, err := os.Stat(filepath.Join(b.Root, "clients", "node", "node_modules")); err != nil {
			return nil, fmt.Errorf("clients/node/node_modules missing (npm ci in clients/node)")
		}
		app, err := firstFile(filepath.Join(b.Root, "testkit", "faultcheck", "apps", "node"), "app.mjs", "app.js", "main.mjs")
		if err != nil {
			return nil, err
		}
		return []string{node, app}, nil
	}
	return nil, fmt.Errorf("unknown front door %q", frontdoor)
}

func firstFile(dir string, names ...string) (string, error) {
	for _, n := range names {
		p := filepath.Join(dir, n)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("no app in %s (looked for %s)", dir, strings.Join(names, ", "))
}

// poolConns is the PostgreSQL pool of the idem server and the gateway.
const poolConns = 10

// QuotaWriters is how many writes of the tenant's records the rig's store
// may run at once: on PostgreSQL one per connection of the writing
// process's pool (the gateway's, or the idem server's behind an app), on
// SQLite one (a single writer, each complete checks the quota in its
// write transaction).
func (r *Rig) QuotaWriters() int {
	if r.Store == "postgres" {
		return poolConns
	}
	return 1
}

// NewRig starts the processes of frontdoor on store. They are killed when
// the test ends. With FaultListenerDown among faults (and an app front
// door) the idem server is listenerserve, the same wiring with its
// key-event subscriptions switchable (Rig.ListenerDown); otherwise the
// idem binary's serve.
func NewRig(tb testing.TB, b Bins, frontdoor, store string, faults ...Fault) *Rig {
	tb.Helper()
	argv, err := AppArgv(b, frontdoor)
	if err != nil {
		tb.Fatalf("faultcheck: front door %s: %v", frontdoor, err)
	}
	r := &Rig{tb: tb, bins: b, FrontDoor: frontdoor, Store: store, appArgv: argv,
		http:     &http.Client{Timeout: 30 * time.Second},
		listener: frontdoor != "gateway" && slices.Contains(faults, FaultListenerDown)}
	dir := tb.TempDir()
	r.env = map[string]string{
		"IDEM_JWT_HS256_SECRET": secret, "IDEM_CREATE_DB": "1",
		"IDEM_LOG_FORMAT": "json", "IDEM_LOG_LEVEL": "info",
		// Settings changed mid-flight take effect at once.
		"IDEM_TENANT_CACHE_TTL": "0",
		"IDEM_MAX_BODY_BYTES":   fmt.Sprint(maxBodyBytes), "IDEM_MAX_INFLIGHT_BYTES": fmt.Sprint(maxInflightBytes),
		"IDEM_ORPHAN_WATCH_INTERVAL": "200ms", "IDEM_STORE_TIMEOUT": "2s",
		// The server's default pool, named so the quota's bound is known.
		"IDEM_DB_MAX_CONNS": fmt.Sprint(poolConns),
		// The shortest retry budget window: the budget fault's spent
		// budget is over a second after it, not in the next schedule.
		"IDEM_RETRY_BUDGET_WINDOW": "1s",
	}
	gwStore := ""
	if store == "postgres" {
		u := pgtest.URL(tb)
		r.env["IDEM_DATABASE_URL"] = u
		pu, err := url.Parse(u)
		if err != nil {
			tb.Fatal(err)
		}
		if r.pgProxy, err = cutproxy.New(pu.Host); err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(r.pgProxy.Close)
		pu.Host = r.pgProxy.Addr()
		gwStore = pu.String()
	} else {
		r.env["IDEM_DATABASE_URL"] = "sqlite:" + filepath.Join(dir, "idem.db")
		gwStore = r.env["IDEM_DATABASE_URL"]
	}
	r.cli("migrate")
	r.cli("tenant", "create", Tenant, "--lease-seconds-default", fmt.Sprint(int(Lease/time.Second)))
	r.cli("tenant", "create", HogTenant)
	r.admin = strings.TrimSpace(r.cli("token", "--scope", "admin", "--ttl", "2h"))
	r.hogToken = strings.TrimSpace(r.cli("token", "--tenant", HogTenant, "--scope", "keys:write", "--ttl", "2h"))
	r.readToken = strings.TrimSpace(r.cli("token", "--tenant", Tenant, "--scope", "keys:read", "--ttl", "2h"))
	r.startServe("127.0.0.1:0")
	tb.Cleanup(func() { r.mu.Lock(); p := r.serve; r.mu.Unlock(); p.Kill() })

	r.LogPath = filepath.Join(dir, "side-effects.jsonl")
	r.appEnv = map[string]string{"FC_ADDR": "127.0.0.1:0", "FC_LOG": r.LogPath, "FC_SCOPE_HEADER": ScopeHeader,
		"PYTHONPATH": filepath.Join(b.Root, "clients", "python", "src"), "PYTHONUNBUFFERED": "1"}
	if frontdoor == "gateway" {
		r.appEnv["FC_FRONTDOOR"] = "none"
	} else {
		r.appEnv["FC_FRONTDOOR"] = frontdoor
		var err error
		if r.idemProxy, err = cutproxy.New(r.serveAddr); err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(r.idemProxy.Close)
		r.appEnv["IDEM_URL"] = "http://" + r.idemProxy.Addr()
		r.appEnv["IDEM_TOKEN"] = strings.TrimSpace(r.cli("token", "--tenant", Tenant, "--scope", "keys:write", "--ttl", "2h"))
	}
	r.app, err = r.startLogged("app", baseEnv(r.appEnv), b.Root, appListening, r.appArgv...)
	if err != nil {
		tb.Fatalf("faultcheck: start the %s app: %v", frontdoor, err)
	}
	tb.Cleanup(func() { r.app.Kill() })
	r.BaseURL = "http://" + r.app.Addr

	if frontdoor == "gateway" {
		r.gwConfig = filepath.Join(dir, "gateway.yaml")
		// Scoped routes (fail closed and fail_open) and an unscoped one in
		// one tenant: callers without a scope use the unscoped route.
		cfg := fmt.Sprintf(`defaults:
  lease: %s
  store_5xx: true
routes:
  - path: /fc/closed/
    scope_header: %[2]s
  - path: /fc/open/
    scope_header: %[2]s
    fail_open: true
  - path: /fc/unscoped/
`, Lease, ScopeHeader)
		if err := os.WriteFile(r.gwConfig, []byte(cfg), 0o600); err != nil {
			tb.Fatal(err)
		}
		r.gwEnvStore = gwStore
		r.startGateway("127.0.0.1:0")
		tb.Cleanup(func() { r.mu.Lock(); p := r.gateway; r.mu.Unlock(); p.Kill() })
		r.BaseURL = "http://" + r.gwAddr
	}
	r.waitHealthy()
	return r
}

func (r *Rig) cli(args ...string) string {
	r.tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, r.bins.Idem, args...)
	cmd.Env = baseEnv(r.env)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		r.tb.Fatalf("faultcheck: idem %s: %v\n%s", strings.Join(args, " "), err, errb.String())
	}
	return out.String()
}

func (r *Rig) startServe(addr string) {
	env := maps.Clone(r.env)
	env["IDEM_ADDR"] = addr
	var p *proc
	var err error
	// A restart may find the port not yet free, or the store cut (a
	// process that cannot reach its store at start exits): try again for
	// a while, as a supervisor would.
	for deadline := time.Now().Add(30 * time.Second); ; {
		argv := []string{r.bins.Idem, "serve"}
		if r.listener {
			argv = []string{r.bins.ListenerServe}
		}
		p, err = r.startLogged("serve", baseEnv(env), "", launch.IdemListening, argv...)
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		r.tb.Fatalf("faultcheck: start idem serve: %v", err)
	}
	r.mu.Lock()
	r.serve = p
	if r.serveAddr == "" {
		r.serveAddr = p.Addr
	}
	r.mu.Unlock()
}

func (r *Rig) startGateway(addr string) {
	env := maps.Clone(r.env)
	env["IDEM_DATABASE_URL"] = r.gwEnvStore
	// The small body limits are the idem server's, for the hog.
	delete(env, "IDEM_MAX_BODY_BYTES")
	delete(env, "IDEM_MAX_INFLIGHT_BYTES")
	var p *proc
	var err error
	for deadline := time.Now().Add(30 * time.Second); ; { // as in startServe
		p, err = r.startLogged("gateway", baseEnv(env), "", launch.IdemListening, r.bins.Idem, "gateway",
			"--listen", addr, "--upstream", "http://"+r.app.Addr, "--tenant", Tenant, "--config", r.gwConfig)
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		r.tb.Fatalf("faultcheck: start idem gateway: %v", err)
	}
	r.mu.Lock()
	r.gateway = p
	if r.gwAddr == "" {
		r.gwAddr = p.Addr
	}
	r.mu.Unlock()
}

// waitHealthy waits until the front door and the idem server answer.
func (r *Rig) waitHealthy() {
	deadline := time.Now().Add(60 * time.Second)
	for _, u := range []string{"http://" + r.app.Addr + "/fc/healthz", "http://" + r.serveAddr + "/healthz"} {
		for {
			resp, err := r.http.Get(u)
			if err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					break
				}
			}
			if time.Now().After(deadline) {
				r.tb.Fatalf("faultcheck: %s not healthy within 60s: %v", u, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// Kill9 kills the process the fault kill9 names for this front door (the
// gateway, or the idem server behind an app) and restarts it on its port.
func (r *Rig) Kill9() string {
	r.mu.Lock()
	gw, serve := r.gateway, r.serve
	r.mu.Unlock()
	if r.FrontDoor == "gateway" {
		gw.Kill()
		r.startGateway(r.gwAddr)
		return "gateway"
	}
	serve.Kill()
	r.startServe(r.serveAddr)
	return "idem serve"
}

// CanCut says whether the store path can be cut for this rig: the gateway
// on SQLite opens a file, no path.
func (r *Rig) CanCut() bool { return r.FrontDoor != "gateway" || r.pgProxy != nil }

// Cut cuts the front door's path to its store; the returned func restores it.
func (r *Rig) Cut() func() {
	p := r.idemProxy
	if r.FrontDoor == "gateway" {
		p = r.pgProxy
	}
	p.Cut()
	return p.Restore
}

// CanListenerDown says whether key-event subscriptions can be held down:
// apps only (the idem server is listenerserve); the gateway binary opens
// its own store.
func (r *Rig) CanListenerDown() bool { return r.listener }

// ListenerDown holds the idem server's key-event subscriptions down for d
// (SIGUSR1, then SIGUSR2 to listenerserve): each Subscribe meanwhile
// blocks until d ends, then fails store_unavailable, as PostgreSQL's does
// while its LISTEN connection reconnects; the store keeps working.
func (r *Rig) ListenerDown(d time.Duration) string {
	r.mu.Lock()
	p := r.serve
	r.mu.Unlock()
	_ = p.Cmd.Process.Signal(syscall.SIGUSR1)
	time.Sleep(d)
	r.mu.Lock()
	p = r.serve // a kill -9 meanwhile restarted it: its switch is up
	r.mu.Unlock()
	_ = p.Cmd.Process.Signal(syscall.SIGUSR2)
	return "key-event subscriptions of idem serve held down (each failed when released)"
}

// SpendBudget keeps the tenant's fleet retry budget spent from now, while
// the app's path to the idem server is cut at cut for d, and for a second and a half after
// it is restored, when the apps' finishing writes that failed in the cut
// are retried: retry_budget_percent 0, and the floor's retries (reads
// saying Idem-Attempt: 2, straight to the idem server) sent again every
// 100 ms, more than the floor of a one-second window. Then the percent is
// back to the default; the window empties within a second.
func (r *Rig) SpendBudget(cut time.Time, d time.Duration) string {
	zero, def := 0, 10
	err := r.PatchTenant(map[string]any{"settings": map[string]any{"retry_budget_percent": zero}})
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			for i := range 12 {
				req, _ := http.NewRequest(http.MethodGet, fmt.Sprintf("http://%s/v1/keys/fc-budget-%d", r.serveAddr, i), nil)
				req.Header.Set("Authorization", "Bearer "+r.readToken)
				req.Header.Set("Idem-Attempt", "2;cause=unavailable")
				if resp, err := r.http.Do(req); err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					_ = resp.Body.Close()
				}
			}
			select {
			case <-stop:
				return
			case <-t.C:
			}
		}
	})
	time.Sleep(time.Until(cut))
	restore := r.Cut()
	time.Sleep(d)
	restore()
	time.Sleep(1500 * time.Millisecond)
	close(stop)
	wg.Wait()
	err2 := r.PatchTenant(map[string]any{"settings": map[string]any{"retry_budget_percent": def}})
	what := "tenant's retry budget spent (retry_budget_percent 0, the floor's retries sent every 100 ms), the path to idem cut for " + d.String() + ", then restored"
	if err != nil || err2 != nil {
		what += fmt.Sprintf(" (errors: %v %v)", err, err2)
	}
	return what
}

// CanFreeze says whether the store can be frozen for this rig: apps freeze
// the idem server (SIGSTOP), the gateway on SQLite the store's write lock;
// the gateway on PostgreSQL has no freeze (its store is shared).
func (r *Rig) CanFreeze() bool { return r.FrontDoor != "gateway" || r.pgProxy == nil }

// Freeze freezes the front door's store for d: the idem server behind an
// app is stopped (SIGSTOP: its connections stay open and nothing answers)
// and continued; the gateway's SQLite file has its write lock held by
// another connection. It returns what it froze.
func (r *Rig) Freeze(d time.Duration) string {
	if r.FrontDoor != "gateway" {
		r.mu.Lock()
		p := r.serve
		r.mu.Unlock()
		_ = p.Cmd.Process.Signal(syscall.SIGSTOP)
		time.Sleep(d)
		_ = p.Cmd.Process.Signal(syscall.SIGCONT)
		return "idem serve stopped (SIGSTOP), then continued"
	}
	db, err := sql.Open("sqlite", strings.TrimPrefix(r.gwEnvStore, "sqlite:"))
	if err != nil {
		return "could not open the SQLite file: " + err.Error()
	}
	defer db.Close()
	ctx := context.Background()
	conn, err := db.Conn(ctx)
	if err != nil {
		return "could not open the SQLite file: " + err.Error()
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		return "could not take the SQLite write lock: " + err.Error()
	}
	time.Sleep(d)
	_, _ = conn.ExecContext(ctx, "ROLLBACK")
	return "the SQLite write lock held by another connection"
}

// admin sends an operator API call to the idem server.
func (r *Rig) adminCall(method, path string, body any) (int, []byte, error) {
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, "http://"+r.serveAddr+path, rd)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+r.admin)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := r.http.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// PatchTenant changes the tenant under test (the operator API).
func (r *Rig) PatchTenant(patch map[string]any) error {
	var last error
	for range 50 { // the server may be restarting after a kill -9
		code, b, err := r.adminCall(http.MethodPatch, "/v1/admin/tenants/"+Tenant, patch)
		if err == nil && code == http.StatusOK {
			return nil
		}
		last = fmt.Errorf("PATCH tenant %v: %d %s %v", patch, code, b, err)
		time.Sleep(100 * time.Millisecond)
	}
	return last
}

// TenantUsage returns the tenant's usage.stored_bytes and its settings.
func (r *Rig) TenantUsage() (stored int64, settings map[string]int64, err error) {
	code, b, err := r.adminCall(http.MethodGet, "/v1/admin/tenants/"+Tenant, nil)
	if err != nil || code != http.StatusOK {
		return 0, nil, fmt.Errorf("GET tenant: %d %s %v", code, b, err)
	}
	var t struct {
		Settings map[string]int64 `json:"settings"`
		Usage    struct {
			StoredBytes int64 `json:"stored_bytes"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(b, &t); err != nil {
		return 0, nil, err
	}
	return t.Usage.StoredBytes, t.Settings, nil
}

// Stderr is the tail of the processes' logs, for a failure report.
func (r *Rig) Stderr() string {
	var b strings.Builder
	r.mu.Lock()
	procs := map[string]*proc{"idem serve": r.serve, "gateway": r.gateway, "app": r.app}
	r.mu.Unlock()
	for name, p := range procs {
		if p != nil {
			fmt.Fprintf(&b, "--- %s (last lines)\n%s\n", name, tail(p.Stderr(), 3000))
		}
	}
	return b.String()
}

func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

// logSize is the side-effect log's size now: a schedule reads from there.
func (r *Rig) logSize() int64 {
	fi, err := os.Stat(r.LogPath)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// Hog holds the idem server's in-flight budget as the other tenant would:
// n connections each declare a body of IDEM_MAX_BODY_BYTES and send one byte
// every 200 ms. The returned func stops it.
func (r *Rig) Hog(n int) func() {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			c, err := net.Dial("tcp", r.serveAddr)
			if err != nil {
				return
			}
			defer c.Close()
			fmt.Fprintf(c, "POST /v1/keys/hog-%d/claim HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n{",
				i, r.serveAddr, r.hogToken, maxBodyBytes)
			for {
				select {
				case <-ctx.Done():
					return
				case <-time.After(200 * time.Millisecond):
					if _, err := c.Write([]byte(" ")); err != nil {
						return
					}
				}
			}
		})
	}
	return func() { cancel(); wg.Wait() }
}
