package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/pprof"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-dev/idem/testkit/benchapp"
)

// modeApp is the app-level benchmark of issue 23: the same small app
// (testkit/benchapp, POST /orders doing one INSERT) served unprotected,
// behind client/idemhttp calling a real idem server on PostgreSQL, and
// behind an in-process PostgreSQL idempotency layer (benchapp.Lib), each
// in a process of its own, with CPU read per process from /proc: the apps,
// the idem server, and the PostgreSQL backends of each (by datname and
// application_name in pg_stat_activity).
const modeApp = "app"

// The scenarios of the app mode.
const (
	scenarioFresh  = "fresh"
	scenarioReplay = "replay"
)

// clkTck is USER_HZ, the unit of utime and stime in /proc/PID/stat: 100
// on every Linux architecture Go runs on.
const clkTck = 100

// appOptions are the app mode's own flags.
type appOptions struct {
	idemBin     string // the idem server binary (required)
	floorBin    string // postgres/internal/benchfloor (optional: goal 5)
	databaseURL string // a loopback PostgreSQL server; schemas are made and dropped
	clients     []int
	scenarios   []string
	profile     string // where to write the idem server's CPU profile of the first fresh pair phase
	appProfile  string // where to write the idem app's CPU profile of the same phase
	pool        int    // each app's connection pool (the idem server keeps its default, 10)
}

// parseClients reads "16,64".
func parseClients(s string) ([]int, error) {
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > 256 {
			return nil, fmt.Errorf("-clients %q: want a comma-separated list of 1..256", s)
		}
		out = append(out, n)
	}
	return out, nil
}

// parseScenarios reads "fresh,replay".
func parseScenarios(s string) ([]string, error) {
	var out []string
	for f := range strings.SplitSeq(s, ",") {
		f = strings.TrimSpace(f)
		if f != scenarioFresh && f != scenarioReplay {
			return nil, fmt.Errorf("-scenarios %q: want fresh, replay or both", s)
		}
		out = append(out, f)
	}
	return out, nil
}

// checkLoopbackDatabase accepts a postgres URL whose host is loopback or a
// Unix socket: CPU is read from /proc, so PostgreSQL must run here.
func checkLoopbackDatabase(raw string) error {
	cfg, err := pgx.ParseConfig(raw)
	if err != nil {
		return fmt.Errorf("-database-url: %w", err)
	}
	if strings.HasPrefix(cfg.Host, "/") || strings.EqualFold(cfg.Host, "localhost") {
		return nil
	}
	if ip := net.ParseIP(cfg.Host); ip != nil && ip.IsLoopback() {
		return nil
	}
	return fmt.Errorf("-database-url: host %q is not loopback: the app mode reads PostgreSQL's CPU from /proc, so the server must run on this machine", cfg.Host)
}

// withParams returns base with query parameters set.
func withParams(base string, kv ...string) (string, error) {
	u, err := url.Parse(base)
	if err != nil {
		return "", err
	}
	q := u.Query()
	for i := 0; i+1 < len(kv); i += 2 {
		q.Set(kv[i], kv[i+1])
	}
	u.RawQuery = q.Encode()
	return u.String(), nil
}

// serveApp is `loadgen -serve-app VARIANT ADDR`: the bench app in a process
// of its own, its database from BENCHAPP_DATABASE_URL, the idem server (the
// idem variant) from BENCHAPP_IDEM_URL and IDEM_TOKEN. It prints "app
// listening on ADDR" and serves until SIGINT/SIGTERM.
func serveApp(ctx context.Context, variant, addr string, stdout, stderr io.Writer) int {
	host, _, err := net.SplitHostPort(addr)
	if ip := net.ParseIP(host); err != nil || ip == nil || !ip.IsLoopback() {
		fmt.Fprintf(stderr, "loadgen: -serve-app %q: must be a loopback host:port\n", addr)
		return 2
	}
	cfg, err := pgxpool.ParseConfig(os.Getenv("BENCHAPP_DATABASE_URL"))
	if err != nil {
		fmt.Fprintf(stderr, "loadgen: BENCHAPP_DATABASE_URL: %v\n", err)
		return 2
	}
	cfg.MaxConns = 10
	if n, err := strconv.Atoi(os.Getenv("BENCHAPP_POOL")); err == nil && n > 0 {
		cfg.MaxConns = int32(min(n, 256))
	}
	db, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		fmt.Fprintf(stderr, "loadgen: %v\n", err)
		return 1
	}
	defer db.Close()
	if err := benchapp.Migrate(ctx, db); err != nil {
		fmt.Fprintf(stderr, "loadgen: %v\n", err)
		return 1
	}
	h, err := benchapp.New(benchapp.Config{Variant: variant, DB: db, IdemURL: os.Getenv("BENCHAPP_IDEM_URL"), IdemToken: os.Getenv("IDEM_TOKEN")})
	if err != nil {
		fmt.Fprintf(stderr, "loadgen: %v\n", err)
		return 2
	}
	if os.Getenv("BENCHAPP_PPROF") == "1" {
		pl, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			fmt.Fprintf(stderr, "loadgen: %v\n", err)
			return 1
		}
		mux := http.NewServeMux()
		mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
		ps := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = ps.Serve(pl) }()
		defer ps.Close()
		fmt.Fprintf(stdout, "app pprof on %s\n", pl.Addr())
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Fprintf(stderr, "loadgen: %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "app listening on %s\n", ln.Addr())
	return serveUntilDone(ctx, ln, h, stderr)
}

// proc is a process the app mode started.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  string // stdout and stderr
	done chan struct{}
	err  error
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

// startProc starts bin with args and env (added to this process's) and
// waits, at most a minute, for a line of its output matching ready; it
// returns the first submatch.
func startProc(ctx context.Context, dir, name, bin string, args, env []string, ready *regexp.Regexp) (*proc, string, error) {
	p := &proc{name: name, log: filepath.Join(dir, name+".log"), done: make(chan struct{})}
	f, err := os.Create(p.log)
	if err != nil {
		return nil, "", err
	}
	defer f.Close()
	p.cmd = exec.Command(bin, args...)
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stdout, p.cmd.Stderr = f, f
	if err := p.cmd.Start(); err != nil {
		return nil, "", fmt.Errorf("start %s: %w", name, err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		data, _ := os.ReadFile(p.log)
		if m := ready.FindSubmatch(data); m != nil {
			return p, string(m[1]), nil
		}
		select {
		case <-p.done:
			return nil, "", fmt.Errorf("%s exited (%v):\n%s", name, p.err, tail(p.log))
		case <-time.After(50 * time.Millisecond):
		}
	}
	p.stop()
	return nil, "", fmt.Errorf("%s did not start within a minute:\n%s", name, tail(p.log))
}

// stop ends the process (SIGTERM, then SIGKILL after 10 s).
func (p *proc) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// tail is the end of a log, for an error.
func tail(path string) string {
	data, _ := os.ReadFile(path)
	if len(data) > 2000 {
		data = data[len(data)-2000:]
	}
	return string(data)
}

// runCLI runs the idem binary once and returns its trimmed stdout.
func runCLI(ctx context.Context, bin string, env []string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), env...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("idem %s: %w: %s", strings.Join(args, " "), err, errOut.String())
	}
	return strings.TrimSpace(out.String()), nil
}

// procTicks is utime+stime of pid, in clock ticks; ok is false when the
// process is gone.
func procTicks(pid int) (uint64, bool) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(string(data[i+1:]))
	if len(f) < 13 {
		return 0, false
	}
	u, err1 := strconv.ParseUint(f[11], 10, 64)
	s, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return u + s, true
}

// The roles CPU is attributed to.
const (
	roleAppUnprotected = "app-unprotected"
	roleAppIdem        = "app-idem"
	roleAppLibrary     = "app-library"
	roleIdem           = "idem"
	roleFloor          = "floor"
	// The PostgreSQL backends of a role are "pg-" + role.
	rolePGBackground = "pg-background" // walwriter, checkpointer, … of the whole server: not attributed
)

// meter reads the CPU of the processes and PostgreSQL backends of a run.
type meter struct {
	admin   *pgx.Conn
	datname string
	appName map[string]string // role → application_name of its backends
	procs   map[string]int    // role → pid
}

// sample is the ticks of every pid of every role at one moment.
type sample map[string]map[int]uint64

func (m *meter) sample(ctx context.Context) (sample, error) {
	s := sample{}
	for role, pid := range m.procs {
		t, _ := procTicks(pid)
		s[role] = map[int]uint64{pid: t}
	}
	rows, err := m.admin.Query(ctx, `SELECT pid, coalesce(application_name, ''), coalesce(backend_type, ''), coalesce(datname, '') FROM pg_stat_activity`)
	if err != nil {
		return nil, fmt.Errorf("read pg_stat_activity: %w", err)
	}
	byName := map[string]string{}
	for role, n := range m.appName {
		byName[n] = "pg-" + role
	}
	for rows.Next() {
		var (
			pid                int
			app, kind, datname string
		)
		if err := rows.Scan(&pid, &app, &kind, &datname); err != nil {
			return nil, err
		}
		role := ""
		switch {
		case kind == "client backend" && datname == m.datname && byName[app] != "":
			role = byName[app]
		case kind != "client backend" && kind != "":
			role = rolePGBackground
		default:
			continue
		}
		if s[role] == nil {
			s[role] = map[int]uint64{}
		}
		if t, ok := procTicks(pid); ok {
			s[role][pid] = t
		}
	}
	return s, rows.Err()
}

// cpu is CPU seconds per role between two samples. A pid new in b counts
// from zero (a backend started during the phase); a pid of a that is gone
// in b loses what it spent in the phase (counted in lost).
func cpu(a, b sample) (map[string]float64, int) {
	out := map[string]float64{}
	lost := 0
	for role, pids := range b {
		for pid, t := range pids {
			out[role] += float64(t-min(t, a[role][pid])) / clkTck
		}
	}
	for role, pids := range a {
		for pid := range pids {
			if _, ok := b[role][pid]; !ok {
				lost++
			}
		}
	}
	return out, lost
}

// appRun is one app mode run: what it started and where.
type appRun struct {
	cfg      config
	opts     appOptions
	dir      string
	id       string
	admin    *pgx.Conn
	schemas  []string
	procs    []*proc
	m        *meter
	addr     map[string]string // role → host:port
	token    string
	pprof    string            // the idem server's pprof address, with -idem-profile
	appPprof string            // the idem app's, with -app-profile
	replay   map[string]string // variant → the key prefix of its prepared replay keys
}

func (r *appRun) close() {
	for _, p := range slices.Backward(r.procs) {
		p.stop()
	}
	if r.admin != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		for _, s := range r.schemas {
			_, _ = r.admin.Exec(ctx, "DROP SCHEMA IF EXISTS "+s+" CASCADE")
		}
		_ = r.admin.Close(ctx)
		cancel()
	}
	_ = os.RemoveAll(r.dir)
}

var (
	reIdemListening  = regexp.MustCompile(`"msg":"listening","addr":"([^"]+)"`)
	reIdemPprof      = regexp.MustCompile(`"msg":"serving /debug/pprof/","addr":"([^"]+)"`)
	reAppListening   = regexp.MustCompile(`app listening on (\S+)`)
	reAppPprof       = regexp.MustCompile(`app pprof on (\S+)`)
	reFloorListening = regexp.MustCompile(`"msg":"listening","addr":"([^"]+)"`)
)

// setup creates the schemas and starts the idem server, the floor server
// (with -floor-bin) and the three apps.
func (r *appRun) setup(ctx context.Context) error {
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		return err
	}
	r.id = hex.EncodeToString(b[:])
	dir, err := os.MkdirTemp("", "loadgen-app-")
	if err != nil {
		return err
	}
	r.dir = dir
	r.admin, err = pgx.Connect(ctx, r.opts.databaseURL)
	if err != nil {
		return fmt.Errorf("connect to -database-url: %w", err)
	}
	r.m = &meter{admin: r.admin, datname: r.admin.Config().Database, appName: map[string]string{}, procs: map[string]int{}}
	r.addr = map[string]string{}
	roleURL := map[string]string{}
	for _, role := range []string{roleAppUnprotected, roleAppIdem, roleAppLibrary, roleIdem, roleFloor} {
		if role == roleFloor && r.opts.floorBin == "" {
			continue
		}
		schema := "appbench_" + r.id + "_" + strings.ReplaceAll(role, "-", "_")
		if _, err := r.admin.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
			return fmt.Errorf("create schema: %w", err)
		}
		r.schemas = append(r.schemas, schema)
		name := "appbench-" + r.id + "-" + role
		u, err := withParams(r.opts.databaseURL, "search_path", schema, "application_name", name)
		if err != nil {
			return err
		}
		roleURL[role] = u
		r.m.appName[role] = name
	}

	secret := make([]byte, 32)
	_, _ = rand.Read(secret)
	idemEnv := []string{"IDEM_JWT_HS256_SECRET=" + hex.EncodeToString(secret), "IDEM_CREATE_DB=1"}
	ledger := append(slices.Clone(idemEnv), "IDEM_DATABASE_URL="+roleURL[roleIdem])
	if _, err := runCLI(ctx, r.opts.idemBin, ledger, "tenant", "create", "bench"); err != nil {
		return err
	}
	if r.token, err = runCLI(ctx, r.opts.idemBin, ledger, "token", "--tenant", "bench", "--scope", "keys:write", "--ttl", "4h"); err != nil {
		return err
	}
	serveEnv := append(slices.Clone(ledger), "IDEM_ADDR=127.0.0.1:0")
	if r.opts.profile != "" {
		serveEnv = append(serveEnv, "IDEM_PPROF_ADDR=127.0.0.1:0")
	}
	p, addr, err := startProc(ctx, dir, roleIdem, r.opts.idemBin, []string{"serve"}, serveEnv, reIdemListening)
	if err != nil {
		return err
	}
	r.procs = append(r.procs, p)
	r.addr[roleIdem], r.m.procs[roleIdem] = addr, p.pid()
	if r.opts.profile != "" {
		if m := reIdemPprof.FindStringSubmatch(readAll(p.log)); m != nil {
			r.pprof = m[1]
		}
		if r.pprof == "" {
			return errors.New("-idem-profile: the idem server did not log its pprof address")
		}
	}

	if r.opts.floorBin != "" {
		floor := append(slices.Clone(idemEnv), "IDEM_DATABASE_URL="+roleURL[roleFloor])
		if _, err := runCLI(ctx, r.opts.idemBin, floor, "tenant", "create", "bench"); err != nil {
			return err
		}
		p, addr, err := startProc(ctx, dir, roleFloor, r.opts.floorBin, []string{"-addr", "127.0.0.1:0"}, floor, reFloorListening)
		if err != nil {
			return err
		}
		r.procs = append(r.procs, p)
		r.addr[roleFloor], r.m.procs[roleFloor] = addr, p.pid()
	}

	self, err := os.Executable()
	if err != nil {
		return err
	}
	for _, v := range benchapp.Variants {
		role := "app-" + v
		env := []string{"BENCHAPP_DATABASE_URL=" + roleURL[role], "BENCHAPP_POOL=" + strconv.Itoa(r.opts.pool)}
		if v == benchapp.Idem {
			env = append(env, "BENCHAPP_IDEM_URL=http://"+r.addr[roleIdem], "IDEM_TOKEN="+r.token)
			if r.opts.appProfile != "" {
				env = append(env, "BENCHAPP_PPROF=1")
			}
		}
		p, addr, err := startProc(ctx, dir, role, self, []string{"-serve-app", v, "127.0.0.1:0"}, env, reAppListening)
		if err != nil {
			return err
		}
		if v == benchapp.Idem && r.opts.appProfile != "" {
			if m := reAppPprof.FindStringSubmatch(readAll(p.log)); m != nil {
				r.appPprof = m[1]
			}
		}
		r.procs = append(r.procs, p)
		r.addr[role], r.m.procs[role] = addr, p.pid()
	}
	return nil
}

func readAll(path string) string {
	data, _ := os.ReadFile(path)
	return string(data)
}

// newAppLoader is a load generator of the frontdoor modes (POST /orders
// with an Idempotency-Key) against role's app.
func (r *appRun) newAppLoader(role, mode string, clients int) (*loader, error) {
	u, err := checkLoopbackURL("http://" + r.addr[role])
	if err != nil {
		return nil, err
	}
	cfg := r.cfg
	cfg.baseURL, cfg.mode, cfg.concurrency, cfg.path, cfg.requests = u, mode, clients, "/orders", 0
	return newLoader(cfg)
}

// orders counts the rows of an app's orders table.
func (r *appRun) orders(ctx context.Context, role string) (int64, error) {
	var n int64
	err := r.admin.QueryRow(ctx, "SELECT count(*) FROM appbench_"+r.id+"_"+strings.ReplaceAll(role, "-", "_")+".orders").Scan(&n)
	return n, err
}

// prepareReplays sends every replay key once to the protected apps.
func (r *appRun) prepareReplays(ctx context.Context) error {
	r.replay = map[string]string{}
	for _, role := range []string{roleAppIdem, roleAppLibrary} {
		l, err := r.newAppLoader(role, modeFrontdoorReplay, 16)
		if err != nil {
			return err
		}
		if err := l.prepareReplay(ctx); err != nil {
			return fmt.Errorf("%s: %w", role, err)
		}
		l.client.CloseIdleConnections()
		r.replay[role] = l.prefix
	}
	return nil
}

// gen is one load generator of a phase: its loader and the roles whose
// CPU its requests are charged with.
type gen struct {
	name  string
	l     *loader
	roles []string
	rep   *report
}

// phaseResult is one measured phase.
type phaseResult struct {
	gens    []*gen
	cpu     map[string]float64 // CPU seconds by role ("pg-" + role for backends)
	lost    int                // backends that ended during the phase
	elapsed time.Duration
	orders  map[string]int64 // rows the phase added to each app's orders table
	conns   [2]int           // the idem app's connections to the idem server: open at the end, closed during the phase
}

// phase runs gens at the same moment for the configured duration and reads
// the CPU of every role around it.
func (r *appRun) phase(ctx context.Context, profile bool, gens ...*gen) (*phaseResult, error) {
	res := &phaseResult{gens: gens, orders: map[string]int64{}}
	before := map[string]int64{}
	for _, role := range []string{roleAppUnprotected, roleAppIdem, roleAppLibrary} {
		n, err := r.orders(ctx, role)
		if err != nil {
			return nil, err
		}
		before[role] = n
	}
	_, idemPort, _ := net.SplitHostPort(r.addr[roleIdem])
	socks := socketsTo(idemPort, r.m.procs[roleAppIdem])
	a, err := r.m.sample(ctx)
	if err != nil {
		return nil, err
	}
	// The profiles (over the phase less a second) are waited for after
	// the phase's CPU is read.
	var wg, profiles sync.WaitGroup
	var profErr, appProfErr error
	if profile && r.opts.profile != "" {
		profiles.Go(func() { profErr = r.fetchProfile(ctx, r.pprof, r.opts.profile) })
	}
	if profile && r.opts.appProfile != "" {
		profiles.Go(func() { appProfErr = r.fetchProfile(ctx, r.appPprof, r.opts.appProfile) })
	}
	start := time.Now()
	for _, g := range gens {
		wg.Go(func() { g.rep = g.l.load(ctx) })
	}
	wg.Wait()
	res.elapsed = time.Since(start)
	b, err := r.m.sample(ctx)
	profiles.Wait()
	if err != nil {
		return nil, err
	}
	res.cpu, res.lost = cpu(a, b)
	for _, role := range []string{roleAppUnprotected, roleAppIdem, roleAppLibrary} {
		n, err := r.orders(ctx, role)
		if err != nil {
			return nil, err
		}
		res.orders[role] = n - before[role]
	}
	end := socketsTo(idemPort, r.m.procs[roleAppIdem])
	res.conns[0] = end.established
	for a := range end.timeWait {
		if !socks.timeWait[a] {
			res.conns[1]++
		}
	}
	for _, g := range gens {
		g.l.client.CloseIdleConnections()
	}
	if profErr != nil {
		return nil, fmt.Errorf("-idem-profile: %w", profErr)
	}
	if appProfErr != nil {
		return nil, fmt.Errorf("-app-profile: %w", appProfErr)
	}
	return res, ctx.Err()
}

// fetchProfile saves a CPU profile of the process serving pprof at addr
// over most of a phase.
func (r *appRun) fetchProfile(ctx context.Context, addr, path string) error {
	if addr == "" {
		return errors.New("the process did not log its pprof address")
	}
	secs := max(1, int(r.cfg.duration.Seconds())-1)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", addr, secs), nil)
	if err != nil {
		return err
	}
	resp, err := (&http.Client{Timeout: time.Duration(secs+30) * time.Second}).Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("pprof answered %s", resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

// sockets are this machine's TCP sockets to one port (/proc/net/tcp and
// tcp6): those owned by one process and established, and the local
// address of each in TIME_WAIT (closed by this side within the last
// minute; such a socket has no owner any more).
type sockets struct {
	established int
	timeWait    map[string]bool
}

// socketsTo reads the sockets whose remote port is port; established
// counts only those of process pid.
func socketsTo(port string, pid int) sockets {
	out := sockets{timeWait: map[string]bool{}}
	p, err := strconv.Atoi(port)
	if err != nil {
		return out
	}
	owned := map[string]bool{}
	if fds, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/fd"); err == nil {
		for _, fd := range fds {
			l, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/fd/" + fd.Name())
			if err == nil && strings.HasPrefix(l, "socket:[") {
				owned[strings.TrimSuffix(strings.TrimPrefix(l, "socket:["), "]")] = true
			}
		}
	}
	want := fmt.Sprintf(":%04X", p)
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		fh, err := os.Open(f)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(fh)
		for sc.Scan() {
			fl := strings.Fields(sc.Text())
			if len(fl) < 10 || !strings.HasSuffix(fl[2], want) {
				continue
			}
			switch fl[3] {
			case "01":
				if owned[fl[9]] {
					out.established++
				}
			case "06":
				out.timeWait[fl[1]] = true
			}
		}
		_ = fh.Close()
	}
	return out
}
