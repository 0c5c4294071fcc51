//go:build scoreboard

// Package scoreboard runs the conformance kit (conformance/) against idem's
// six front doors on both stores and against the public Idempotency-Key
// implementations scripts/scoreboard installed, each in a minimal app of
// ours (apps/), and writes the table: scenario × implementation. It is not
// part of make test (build tag scoreboard); scripts/scoreboard runs it.
//
//	go test -tags scoreboard ./testkit/scoreboard -run TestScoreboard -v \
//	  -scoreboard.work=DIR -scoreboard.out=docs/conformance-scoreboard.md
//
// Everything listens on 127.0.0.1; every process is killed when the test
// ends.
package scoreboard

import (
	"context"
	"database/sql"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	_ "modernc.org/sqlite" // the "sqlite" database/sql driver, to hold the store's write lock

	"github.com/idem-dev/idem/client"
	"github.com/idem-dev/idem/client/idemhttp"
	"github.com/idem-dev/idem/conformance"
	"github.com/idem-dev/idem/testkit/cutproxy"
	"github.com/idem-dev/idem/testkit/faultcheck"
	"github.com/idem-dev/idem/testkit/launch"
	"github.com/idem-dev/idem/testkit/pgtest"
)

var (
	workDir = flag.String("scoreboard.work", "", "directory scripts/scoreboard installed the outside implementations into (venv/, node/, go/); empty: idem's front doors only")
	outFile = flag.String("scoreboard.out", "", "markdown file the table is written to")
	jsonOut = flag.String("scoreboard.json", "", "file every report is written to as JSON")
	only    = flag.String("scoreboard.only", "", "comma-separated implementations to run (default: all)")
)

// expiry is the published expiry every target gets for the expiry
// scenario: the replay window of idem's short tenant, the TTL option of an
// outside implementation that has one.
const expiry = 2 * time.Second

// outside is one public implementation: how to start its app.
type outside struct {
	name     string // as in the table
	lang     string // python, node, go
	impl     string // SB_IMPL of the app
	replay   string // the replay header it documents ("-": none)
	hasTTL   bool   // it takes SB_EXPIRY_SECONDS
	homepage string // where it is published (package registry)
}

var outsides = []outside{
	{"express-idempotency", "node", "express-idempotency", "-", false, "npm"},
	{"@node-idempotency/nestjs", "node", "node-idempotency-nestjs", "-", true, "npm"},
	{"fastapi-idempotency-key", "python", "fastapi-idempotency-key", "Idempotency-Replayed", true, "PyPI"},
	{"fastapi-idempotency", "python", "fastapi-idempotency", "Idempotent-Replayed", true, "PyPI"},
	{"asgi-idempotency-header", "python", "asgi-idempotency-header", "Idempotent-Replayed", true, "PyPI"},
	{"django-idempotency-key", "python", "django-idempotency-key", "-", false, "PyPI"},
	{"gofiber/fiber/v2 middleware/idempotency", "go", "fiber-idempotency", "-", true, "Go module proxy"},
}

// column is one column of the table: one implementation (on one store).
type column struct {
	Name    string             `json:"name"`
	Version string             `json:"version"`
	Store   string             `json:"store,omitempty"`
	Idem    bool               `json:"idem"`
	Error   string             `json:"error,omitempty"`
	Report  conformance.Report `json:"report"`
}

func selected(name string) bool {
	return *only == "" || slices.Contains(strings.Split(*only, ","), name)
}

func TestScoreboard(t *testing.T) {
	bins, err := faultcheck.Build(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var cols []column
	for _, store := range []string{"sqlite", "postgres"} {
		r := newIdemRig(t, bins, store)
		for _, fd := range []string{"gateway", "idemhttp", "asgi", "wsgi", "express", "fetch"} {
			if !selected(fd) {
				continue
			}
			c := r.run(t, fd)
			t.Logf("%s on %s: %s", fd, store, summary(c))
			cols = append(cols, c)
		}
	}
	if *workDir != "" {
		for _, o := range outsides {
			if !selected(o.impl) {
				continue
			}
			c := runOutside(t, bins, o)
			t.Logf("%s: %s", o.name, summary(c))
			cols = append(cols, c)
		}
	}
	if *jsonOut != "" {
		b, _ := json.MarshalIndent(cols, "", "  ")
		if err := os.WriteFile(*jsonOut, append(b, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	md := table(cols, bins.Root)
	if *outFile != "" {
		if err := os.WriteFile(*outFile, []byte(md), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Log("\n" + md)
	// idem's promise: every front door passes every scenario, idem's own
	// rules included, on both stores (the rig gives each the expiry and
	// the StoreDown hook, so none is skipped). The Python and Node.js
	// front doors meet the kit only here.
	for _, c := range cols {
		if !c.Idem {
			continue
		}
		if c.Error != "" {
			t.Errorf("%s on %s did not run: %s", c.Name, c.Store, c.Error)
		}
		for _, x := range c.Report.Results {
			if x.Outcome() != "pass" {
				t.Errorf("%s on %s: %s %s: %s", c.Name, c.Store, x.Name, x.Outcome(), x.Detail)
			}
		}
	}
}

func summary(c column) string {
	if c.Error != "" {
		return "did not run: " + c.Error
	}
	var parts []string
	for _, class := range conformance.Classes {
		p, f, s := c.Report.ClassCounts(class)
		parts = append(parts, fmt.Sprintf("%s %d/%d (%d skipped)", class, p, p+f, s))
	}
	return c.Version + ": " + strings.Join(parts, ", ")
}

// ---------------------------------------------------------------- processes

// start starts argv in a process group of its own (uvicorn and werkzeug
// start no children, but a framework may) and waits for the line
// listening finds an answer in; the group is killed when the test ends.
func start(t *testing.T, env []string, dir string, listening func(string) string, argv ...string) (*launch.Proc, string, error) {
	p, err := launch.Start(launch.Options{
		Env: env, Dir: dir, Listening: listening, Timeout: 90 * time.Second, Group: true,
		Name: filepath.Base(argv[len(argv)-1]),
	}, argv...)
	if err != nil {
		return nil, "", err
	}
	t.Cleanup(p.Kill)
	return p, p.Addr, nil
}

// appListening reads `SB_LISTENING URL VERSION` and returns "URL VERSION".
func appListening(line string) string {
	if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "SB_LISTENING "); ok {
		return rest
	}
	return ""
}

// environ is the process environment without IDEM_ and SB_ variables, plus env.
func environ(env map[string]string) []string { return launch.Environ(env, "SB_") }

// ---------------------------------------------------------------- idem

const secret = "scoreboard-hs256-secret-0123456789abcdef"

// idemRig is an idem server on one store, a path to it that can be cut,
// and its tenants: sb (default settings) and sbshort (replay window
// `expiry`, for the expiry scenario).
type idemRig struct {
	bins       faultcheck.Bins
	store      string
	env        map[string]string
	gwStore    string          // the gateway's IDEM_DATABASE_URL (through pgProxy on PostgreSQL)
	pgProxy    *cutproxy.Proxy // PostgreSQL: the gateway's path to its store
	idemProxy  *cutproxy.Proxy // the apps' path to the idem server
	tokens     map[string]string
	sqlitePath string
}

func newIdemRig(t *testing.T, bins faultcheck.Bins, store string) *idemRig {
	r := &idemRig{bins: bins, store: store, tokens: map[string]string{}}
	r.env = map[string]string{"IDEM_JWT_HS256_SECRET": secret, "IDEM_CREATE_DB": "1", "IDEM_LOG_FORMAT": "json",
		"IDEM_LOG_LEVEL": "info", "IDEM_STORE_TIMEOUT": "2s"}
	if store == "postgres" {
		u := pgtest.URL(t)
		r.env["IDEM_DATABASE_URL"] = u
		pu, err := url.Parse(u)
		if err != nil {
			t.Fatal(err)
		}
		if r.pgProxy, err = cutproxy.New(pu.Host); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(r.pgProxy.Close)
		pu.Host = r.pgProxy.Addr()
		r.gwStore = pu.String()
	} else {
		r.sqlitePath = filepath.Join(t.TempDir(), "idem.db")
		r.env["IDEM_DATABASE_URL"] = "sqlite:" + r.sqlitePath
		r.gwStore = r.env["IDEM_DATABASE_URL"]
	}
	r.cli(t, "migrate")
	r.cli(t, "tenant", "create", "sb")
	r.cli(t, "tenant", "create", "sbshort", "--replay-window-seconds", fmt.Sprint(int(expiry/time.Second)))
	for _, tenant := range []string{"sb", "sbshort"} {
		r.tokens[tenant] = strings.TrimSpace(r.cli(t, "token", "--tenant", tenant, "--scope", "keys:write", "--ttl", "4h"))
	}
	env := map[string]string{"IDEM_ADDR": "127.0.0.1:0"}
	for k, v := range r.env {
		env[k] = v
	}
	_, addr, err := start(t, environ(env), "", launch.IdemListening, bins.Idem, "serve")
	if err != nil {
		t.Fatal(err)
	}
	if r.idemProxy, err = cutproxy.New(addr); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.idemProxy.Close)
	return r
}

func (r *idemRig) cli(t *testing.T, args ...string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, r.bins.Idem, args...)
	cmd.Env = environ(r.env)
	out, err := cmd.Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("idem %s: %v\n%s", strings.Join(args, " "), err, stderr)
	}
	return string(out)
}

// storeDown is the StoreDown hook of a front door: the gateway loses its
// store (PostgreSQL: the path cut; SQLite: the write lock held by another
// connection), an app its idem server (the path cut).
func (r *idemRig) storeDown(frontdoor string) func(context.Context) (func(), error) {
	if frontdoor != "gateway" {
		return func(context.Context) (func(), error) { r.idemProxy.Cut(); return r.idemProxy.Restore, nil }
	}
	if r.pgProxy != nil {
		return func(context.Context) (func(), error) { r.pgProxy.Cut(); return r.pgProxy.Restore, nil }
	}
	return func(ctx context.Context) (func(), error) {
		db, err := sql.Open("sqlite", "file:"+r.sqlitePath+"?_pragma=busy_timeout(10000)")
		if err != nil {
			return nil, err
		}
		conn, err := db.Conn(ctx)
		if err == nil {
			_, err = conn.ExecContext(ctx, "BEGIN IMMEDIATE")
		}
		if err != nil {
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

// target is a front door ready for the kit: its URL and how to count.
type target struct {
	url     string
	version string
	count   func(context.Context) (int64, error)
}

// frontDoor starts frontdoor for tenant.
func (r *idemRig) frontDoor(t *testing.T, frontdoor, tenant string) (target, error) {
	token := r.tokens[tenant]
	switch frontdoor {
	case "gateway":
		up := conformance.NewUpstream()
		us := httptest.NewServer(up)
		t.Cleanup(us.Close)
		env := map[string]string{}
		for k, v := range r.env {
			env[k] = v
		}
		env["IDEM_DATABASE_URL"] = r.gwStore
		_, addr, err := start(t, environ(env), "", launch.IdemListening, r.bins.Idem, "gateway", "--listen", "127.0.0.1:0", "--upstream", us.URL, "--tenant", tenant)
		if err != nil {
			return target{}, err
		}
		return target{url: "http://" + addr, version: "idem gateway@tree",
			count: func(context.Context) (int64, error) { return up.Count(), nil }}, nil
	case "idemhttp":
		c, err := client.New("http://"+r.idemProxy.Addr(), client.WithToken(token),
			client.WithRetryPolicy(client.RetryPolicy{MaxAttempts: 2, BaseDelay: 20 * time.Millisecond, AttemptTimeout: 5 * time.Second}))
		if err != nil {
			return target{}, err
		}
		up := conformance.NewUpstream()
		mux := http.NewServeMux()
		mux.Handle("/orders/{id}", idemhttp.Middleware(c, idemhttp.Options{})(up))
		mux.Handle("GET /count", up)
		app := httptest.NewServer(mux)
		t.Cleanup(app.Close)
		return target{url: app.URL, version: "idemhttp@tree"}, nil
	}
	impl := map[string]string{"asgi": "idem-asgi", "wsgi": "idem-wsgi", "express": "idem-express", "fetch": "idem-fetch"}[frontdoor]
	env := map[string]string{"SB_IMPL": impl, "SB_ADDR": "127.0.0.1:0", "IDEM_URL": "http://" + r.idemProxy.Addr(), "IDEM_TOKEN": token,
		"PYTHONPATH": filepath.Join(r.bins.Root, "clients", "python", "src"), "PYTHONUNBUFFERED": "1"}
	argv := []string{filepath.Join(r.bins.Root, ".venv", "bin", "python"), filepath.Join(r.bins.Root, "testkit", "scoreboard", "apps", "python", "app.py")}
	if frontdoor == "express" || frontdoor == "fetch" {
		argv = []string{"node", filepath.Join(r.bins.Root, "testkit", "scoreboard", "apps", "node", "app.mjs")}
	}
	_, line, err := start(t, environ(env), r.bins.Root, appListening, argv...)
	if err != nil {
		return target{}, err
	}
	u, v, _ := strings.Cut(line, " ")
	return target{url: u, version: v}, nil
}

func (r *idemRig) run(t *testing.T, frontdoor string) column {
	c := column{Name: frontdoor, Store: r.store, Idem: true}
	main, err := r.frontDoor(t, frontdoor, "sb")
	if err != nil {
		c.Error = err.Error()
		return c
	}
	short, err := r.frontDoor(t, frontdoor, "sbshort")
	if err != nil {
		c.Error = err.Error()
		return c
	}
	c.Version = main.version
	c.Report = runKit(conformance.Options{Target: main.url, Path: "/orders/1", OtherPath: "/orders/2", Count: main.count, StoreDown: r.storeDown(frontdoor)},
		conformance.Options{Target: short.url, Path: "/orders/1", Count: short.count})
	return c
}

// runKit runs the kit with opts, and the expiry scenario with expiryOpts
// (a target whose published expiry is `expiry`; a zero Target skips it).
func runKit(opts, expiryOpts conformance.Options) conformance.Report {
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	var names []string
	for _, s := range conformance.Scenarios() {
		if s.Name != "expiry" {
			names = append(names, s.Name)
		}
	}
	opts.Scenarios = names
	rep := conformance.Run(ctx, opts)
	exp := conformance.Result{Name: "expiry", Skipped: true, Detail: "no expiry can be set"}
	if expiryOpts.Target != "" {
		expiryOpts.Scenarios, expiryOpts.Expiry, expiryOpts.ReplayHeader = []string{"expiry"}, expiry, opts.ReplayHeader
		if r := conformance.Run(ctx, expiryOpts); len(r.Results) == 1 {
			exp = r.Results[0]
		}
	}
	// In the order of Scenarios().
	var out []conformance.Result
	for _, s := range conformance.Scenarios() {
		if s.Name == "expiry" {
			if exp.Class == "" {
				exp.Class, exp.Ref, exp.Description = s.Class, s.Ref, s.Description
			}
			out = append(out, exp)
			continue
		}
		for _, x := range rep.Results {
			if x.Name == s.Name {
				out = append(out, x)
			}
		}
	}
	rep.Results = out
	return rep
}

// ---------------------------------------------------------------- outside

func runOutside(t *testing.T, bins faultcheck.Bins, o outside) column {
	c := column{Name: o.name}
	startApp := func(ttl bool) (string, string, error) {
		env := map[string]string{"SB_IMPL": o.impl, "SB_ADDR": "127.0.0.1:0", "SB_NODE_MODULES": filepath.Join(*workDir, "node"), "PYTHONUNBUFFERED": "1"}
		if ttl {
			env["SB_EXPIRY_SECONDS"] = fmt.Sprint(int(expiry / time.Second))
		}
		var argv []string
		switch o.lang {
		case "python":
			argv = []string{filepath.Join(*workDir, "venv", "bin", "python"), filepath.Join(bins.Root, "testkit", "scoreboard", "apps", "python", "app.py")}
		case "node":
			argv = []string{"node", filepath.Join(bins.Root, "testkit", "scoreboard", "apps", "node", "app.mjs")}
		case "go":
			argv = []string{filepath.Join(*workDir, "go", "bin", o.impl)}
		}
		if _, err := os.Stat(argv[0]); o.lang != "node" && err != nil {
			return "", "", fmt.Errorf("not installed (%s)", argv[0])
		}
		_, line, err := start(t, environ(env), *workDir, appListening, argv...)
		if err != nil {
			return "", "", err
		}
		u, v, _ := strings.Cut(line, " ")
		return u, v, nil
	}
	u, v, err := startApp(false)
	if err != nil {
		c.Error = err.Error()
		return c
	}
	c.Version = v
	var expiryOpts conformance.Options
	if o.hasTTL {
		su, _, err := startApp(true)
		if err != nil {
			c.Error = err.Error()
			return c
		}
		expiryOpts = conformance.Options{Target: su}
	}
	c.Report = runKit(conformance.Options{Target: u, ReplayHeader: o.replay}, expiryOpts)
	return c
}

// ---------------------------------------------------------------- table

func table(cols []column, root string) string {
	var b strings.Builder
	commit, _ := exec.Command("git", "-C", root, "rev-parse", "--short", "HEAD").Output()
	fmt.Fprintf(&b, "# Conformance scoreboard\n\nGenerated by scripts/scoreboard on %s from idem %s.\n\n",
		time.Now().UTC().Format("2006-01-02"), strings.TrimSpace(string(commit)))
	fmt.Fprintln(&b, "Cells: pass, FAIL, skip (the target offers no way to run it). idem's front doors ran on SQLite and on PostgreSQL.")
	fmt.Fprintln(&b)
	fmt.Fprint(&b, "| scenario | class |")
	for _, c := range cols {
		name := c.Version
		if c.Store != "" {
			name = c.Name + " (" + map[string]string{"sqlite": "SQLite", "postgres": "PostgreSQL"}[c.Store] + ")"
		}
		if name == "" {
			name = c.Name
		}
		fmt.Fprintf(&b, " %s |", name)
	}
	fmt.Fprint(&b, "\n|---|---|")
	for range cols {
		fmt.Fprint(&b, "---|")
	}
	fmt.Fprintln(&b)
	for _, s := range conformance.Scenarios() {
		fmt.Fprintf(&b, "| `%s` | %s |", s.Name, s.Class)
		for _, c := range cols {
			cell := "—"
			if c.Error == "" {
				for _, x := range c.Report.Results {
					if x.Name == s.Name {
						cell = map[string]string{"pass": "pass", "fail": "FAIL", "skip": "skip"}[x.Outcome()]
					}
				}
			}
			fmt.Fprintf(&b, " %s |", cell)
		}
		fmt.Fprintln(&b)
	}
	for _, class := range conformance.Classes {
		fmt.Fprintf(&b, "| **%s passed** | |", class)
		for _, c := range cols {
			p, f, _ := c.Report.ClassCounts(class)
			if c.Error != "" {
				fmt.Fprint(&b, " — |")
				continue
			}
			fmt.Fprintf(&b, " %d/%d |", p, p+f)
		}
		fmt.Fprintln(&b)
	}
	fmt.Fprint(&b, "\n## Why each failure failed\n\n")
	for _, c := range cols {
		if c.Error != "" {
			fmt.Fprintf(&b, "- **%s**: did not run: %s\n", c.Name, firstLine(c.Error))
			continue
		}
		for _, x := range c.Report.Results {
			if x.Outcome() == "fail" {
				name := c.Version
				if c.Store != "" {
					name = c.Name + " (" + c.Store + ")"
				}
				fmt.Fprintf(&b, "- **%s** `%s`: %s\n", name, x.Name, firstLine(x.Detail))
			}
		}
	}
	return b.String()
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	if len(s) > 240 {
		s = s[:240] + "…"
	}
	return strings.ReplaceAll(s, "|", "\\|")
}
