package main

// The storm test (issue 28, item 4): many logical callers, each with a
// client of its own (its own per-process retry budget, as in a fleet),
// calling claim→complete on fresh keys at a steady rate; then the store
// goes away for a while (every request that needs it gets 503
// store_unavailable with Retry-After), then it comes back. Per second:
// logical calls, attempts reaching idem, amplification, retries refused by
// the fleet budget and by the per-process budget, successes, and side
// effects (a duplicate is a key whose work ran twice). Run once with the
// tenant's fleet budget off (retry_budget_percent 100) and once on.
//
// It starts everything itself, on loopback only: a cut proxy (testkit/
// cutproxy) in front of the PostgreSQL named by -database-url (a loopback
// host), the idem binary -server-bin on 127.0.0.1:0 behind it, a sink
// that records every side effect (the ledger the duplicates are counted
// from), and the callers in worker processes of all three SDKs (-workers:
// `loadgen storm-worker` for Go, testkit/storm/worker.py for Python,
// testkit/storm/worker.mjs for Node; stormworker.go says what they share),
// the callers split evenly among them, one SDK client per caller. The
// outage is the proxy cut: every store connection closed and new ones
// refused. Every phase is bounded in time; the run stops by itself.

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/idem-dev/idem/testkit/cutproxy"
)

// stormConfig is the command line of `loadgen storm`.
type stormConfig struct {
	serverBin   string
	databaseURL string
	callers     int
	period      time.Duration
	steady      time.Duration
	outage      time.Duration
	recovery    time.Duration
	percent     int
	budgets     []string // "off", "on"
	jsonOut     string
	svgOut      string
	workers     []string // one SDK per worker process: go, python, node
	python      string   // the Python interpreter (with httpx)
	node        string   // the Node.js binary
	workerDir   string   // testkit/storm
	self        string   // this binary, for the Go workers
}

func parseStorm(args []string, stderr io.Writer) (stormConfig, error) {
	fs := flag.NewFlagSet("loadgen storm", flag.ContinueOnError)
	fs.SetOutput(stderr)
	c := stormConfig{}
	fs.StringVar(&c.serverBin, "server-bin", "", "the idem server binary")
	fs.StringVar(&c.databaseURL, "database-url", os.Getenv("TEST_DATABASE_URL"), "PostgreSQL URL on a loopback host (a schema of its own: search_path)")
	fs.IntVar(&c.callers, "callers", 1000, "logical callers, each with a client of its own (at most 2000)")
	fs.DurationVar(&c.period, "period", 10*time.Second, "time between two calls of one caller")
	fs.DurationVar(&c.steady, "steady", 10*time.Second, "steady phase before the outage")
	fs.DurationVar(&c.outage, "outage", 10*time.Second, "store outage")
	fs.DurationVar(&c.recovery, "recovery", 15*time.Second, "phase after the outage")
	fs.IntVar(&c.percent, "percent", 10, "retry_budget_percent of the run with the budget on")
	budget := fs.String("budget", "off,on", "the runs: off, on, or off,on")
	fs.StringVar(&c.jsonOut, "json", "", "write the per-second figures as JSON to this file")
	fs.StringVar(&c.svgOut, "svg", "", "write the chart (attempts/s and amplification, budget off vs on) to this SVG file")
	workers := fs.String("workers", "go:2,python:1,node:1", "worker processes per SDK (go, python, node), the callers split evenly among them")
	fs.StringVar(&c.python, "python", "python3", "the Python interpreter of the Python workers (httpx installed; PYTHONPATH naming the SDK)")
	fs.StringVar(&c.node, "node", "node", "the Node.js binary of the Node workers")
	fs.StringVar(&c.workerDir, "worker-dir", "testkit/storm", "the directory of worker.py and worker.mjs")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	for _, w := range strings.Split(*workers, ",") {
		sdk, count, ok := strings.Cut(w, ":")
		n, err := strconv.Atoi(count)
		if !ok || err != nil || n < 0 || n > 16 || (sdk != "go" && sdk != "python" && sdk != "node") {
			return c, fmt.Errorf("-workers: want sdk:count,… (go, python, node; 0..16 each), got %q", w)
		}
		for range n {
			c.workers = append(c.workers, sdk)
		}
	}
	if len(c.workers) == 0 {
		return c, errors.New("-workers: no worker")
	}
	c.budgets = strings.Split(*budget, ",")
	for _, b := range c.budgets {
		if b != "off" && b != "on" {
			return c, fmt.Errorf("-budget: want off, on or off,on, got %q", *budget)
		}
	}
	if c.serverBin == "" {
		return c, errors.New("-server-bin is required")
	}
	u, err := url.Parse(c.databaseURL)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return c, errors.New("-database-url must be a postgres:// URL")
	}
	if ip := net.ParseIP(u.Hostname()); !strings.EqualFold(u.Hostname(), "localhost") && (ip == nil || !ip.IsLoopback()) {
		return c, fmt.Errorf("-database-url: host %q must be loopback: loadgen only loads this machine", u.Hostname())
	}
	if c.callers < len(c.workers) || c.callers > 2000 {
		return c, fmt.Errorf("-callers must be %d..2000 (one per worker at least), got %d", len(c.workers), c.callers)
	}
	if c.period < 100*time.Millisecond || c.period > time.Minute {
		return c, fmt.Errorf("-period must be in [100ms, 1m], got %s", c.period)
	}
	for _, d := range []time.Duration{c.steady, c.outage, c.recovery} {
		if d < time.Second || d > time.Minute {
			return c, fmt.Errorf("-steady, -outage and -recovery must be in [1s, 1m], got %s", d)
		}
	}
	if c.percent < 0 || c.percent > 100 {
		return c, fmt.Errorf("-percent must be 0..100, got %d", c.percent)
	}
	return c, nil
}

// second is what one second of a run saw; calls are counted in the second
// they started, attempts in the second they were sent.
type second struct {
	Calls        int64   `json:"calls"`           // logical calls started (Do)
	Succeeded    int64   `json:"succeeded"`       // of those, ended with the response
	Attempts     int64   `json:"attempts"`        // HTTP requests reaching idem
	First        int64   `json:"first"`           // of those, first attempts of an HTTP call
	FleetRefused int64   `json:"fleet_refused"`   // retries refused by idem's fleet budget (429)
	FleetSignal  int64   `json:"fleet_signal"`    // retries not sent: the failure said Idem-Retry-Budget: exhausted
	ProcRefused  int64   `json:"process_refused"` // retries a client's own budget did not make
	SideEffects  int64   `json:"side_effects"`    // runs of the work (each one POST to the sink)
	Amplify      float64 `json:"amplification"`   // attempts ÷ first attempts
}

// add adds o's counts to s.
func (s *second) add(o second) {
	s.Calls += o.Calls
	s.Succeeded += o.Succeeded
	s.Attempts += o.Attempts
	s.First += o.First
	s.FleetRefused += o.FleetRefused
	s.FleetSignal += o.FleetSignal
	s.ProcRefused += o.ProcRefused
	s.SideEffects += o.SideEffects
}

// stormRun is one run: the per-second figures and the outage's seconds.
type stormRun struct {
	Budget      string           `json:"budget"`
	Percent     int              `json:"retry_budget_percent"`
	Seconds     []second         `json:"seconds"`
	OutageStart int              `json:"outage_start"`
	OutageEnd   int              `json:"outage_end"`
	SideEffects int64            `json:"side_effects"`          // in the sink's ledger
	Duplicates  int64            `json:"duplicates"`            // keys the ledger holds more than once
	Reported    int64            `json:"reported_side_effects"` // the workers' own count of their work's runs
	Processes   []processSummary `json:"processes"`
	// Server is what idem's metrics counted for the tenant: its retries
	// by cause, admitted and refused.
	Server string `json:"server"`
}

// processSummary is one worker process's totals over the run.
type processSummary struct {
	SDK     string `json:"sdk"`
	Callers int    `json:"callers"`
	LateMS  int64  `json:"late_ms"`
	// Errors counts its failed logical calls by what ended them.
	Errors map[string]int64 `json:"errors"`
	second
}

func runStorm(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cfg, err := parseStorm(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "loadgen storm: %v\n", err)
		return 2
	}
	if cfg.self, err = os.Executable(); err != nil {
		fmt.Fprintf(stderr, "loadgen storm: %v\n", err)
		return 1
	}
	runs, err := storm(ctx, cfg, stdout)
	if err != nil {
		fmt.Fprintf(stderr, "loadgen storm: %v\n", err)
		return 1
	}
	if cfg.jsonOut != "" {
		b, _ := json.MarshalIndent(runs, "", "  ")
		if err := os.WriteFile(cfg.jsonOut, b, 0o644); err != nil {
			fmt.Fprintf(stderr, "loadgen storm: %v\n", err)
			return 1
		}
	}
	if cfg.svgOut != "" {
		if err := os.WriteFile(cfg.svgOut, []byte(stormSVG(runs, cfg)), 0o644); err != nil {
			fmt.Fprintf(stderr, "loadgen storm: %v\n", err)
			return 1
		}
	}
	code := 0
	for _, r := range runs {
		if !r.report(stdout) {
			code = 1
		}
	}
	return code
}

func storm(ctx context.Context, cfg stormConfig, stdout io.Writer) ([]stormRun, error) {
	u, _ := url.Parse(cfg.databaseURL)
	proxy, err := cutproxy.New(u.Host)
	if err != nil {
		return nil, err
	}
	defer proxy.Close()
	u.Host = proxy.Addr()
	secret := randomHex(32)
	env := append(os.Environ(), "IDEM_DATABASE_URL="+u.String(), "IDEM_JWT_HS256_SECRET="+secret, "IDEM_CREATE_DB=1")
	cli := func(args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, cfg.serverBin, args...)
		cmd.Env = env
		out, err := cmd.Output()
		if err != nil {
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				return "", fmt.Errorf("idem %s: %v: %s", strings.Join(args, " "), err, ee.Stderr)
			}
			return "", err
		}
		return strings.TrimSpace(string(out)), nil
	}
	base, stop, err := startStormServer(ctx, cfg.serverBin, env)
	if err != nil {
		return nil, err
	}
	defer stop()
	fmt.Fprintf(stdout, "storm: %d callers in %d processes (%s), one call each per %s (%.0f logical calls/s), steady %s, store outage %s, recovery %s; server %s, store through a cut proxy\n",
		cfg.callers, len(cfg.workers), strings.Join(cfg.workers, ","), cfg.period, float64(cfg.callers)/cfg.period.Seconds(), cfg.steady, cfg.outage, cfg.recovery, base)

	var runs []stormRun
	for _, b := range cfg.budgets {
		pct := 100
		if b == "on" {
			pct = cfg.percent
		}
		tenant := "storm-" + b + "-" + randomHex(3)
		if _, err := cli("tenant", "create", tenant, "--retry-budget-percent", fmt.Sprint(pct)); err != nil {
			return nil, err
		}
		tok, err := cli("token", "--tenant", tenant, "--scope", "keys:write", "--ttl", "1h")
		if err != nil {
			return nil, err
		}
		r, err := stormPhase(ctx, cfg, base, tok, proxy)
		if err != nil {
			return nil, err
		}
		r.Server = tenantRetries(base, tenant)
		r.Budget, r.Percent = b, pct
		runs = append(runs, r)
	}
	return runs, nil
}

// startStormServer starts `idem serve` on 127.0.0.1:0 and returns its URL.
func startStormServer(ctx context.Context, bin string, env []string) (string, func(), error) {
	cmd := exec.CommandContext(ctx, bin, "serve")
	cmd.Env = append(env, "IDEM_ADDR=127.0.0.1:0", "IDEM_LOG_FORMAT=json", "IDEM_LOG_LEVEL=info")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return "", nil, err
	}
	if err := cmd.Start(); err != nil {
		return "", nil, err
	}
	stop := func() {
		_ = cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	}
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		sent := false
		for sc.Scan() {
			if sent {
				continue // drain
			}
			var rec struct{ Msg, Addr string }
			if json.Unmarshal(sc.Bytes(), &rec) == nil && rec.Msg == "listening" && rec.Addr != "" {
				addr <- rec.Addr
				sent = true
			}
		}
	}()
	select {
	case a := <-addr:
		return "http://" + a, stop, nil
	case <-time.After(60 * time.Second):
		stop()
		return "", nil, errors.New("the server did not listen within 60 s")
	}
}

// stormPhase runs one steady → outage → recovery sequence for one tenant:
// the workers started and made ready, one start for all, the store cut at
// steady and restored after outage, the workers' seconds merged, and the
// duplicates read from the sink's ledger.
func stormPhase(ctx context.Context, cfg stormConfig, base, token string, proxy *cutproxy.Proxy) (stormRun, error) {
	total := cfg.steady + cfg.outage + cfg.recovery
	n := int(math.Ceil(total.Seconds()))
	sink, err := newEffectSink()
	if err != nil {
		return stormRun{}, err
	}
	defer sink.close()

	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var procs []*workerProc
	defer func() {
		for _, p := range procs {
			p.stop()
		}
	}()
	for k, sdk := range cfg.workers {
		p, err := startWorker(wctx, cfg, sdk, workerConfig{Base: base, Token: token, Index: k, Stride: len(cfg.workers), Total: cfg.callers,
			PeriodMS: cfg.period.Milliseconds(), RunMS: total.Milliseconds(), Seconds: n, Sink: sink.url})
		if err != nil {
			return stormRun{}, err
		}
		procs = append(procs, p)
	}
	for _, p := range procs {
		if err := p.ready(60 * time.Second); err != nil {
			return stormRun{}, err
		}
	}
	start := time.Now().Add(500 * time.Millisecond).Truncate(time.Millisecond)
	for _, p := range procs {
		if _, err := fmt.Fprintf(p.stdin, "%d\n", start.UnixMilli()); err != nil {
			return stormRun{}, fmt.Errorf("%s worker: %w", p.sdk, err)
		}
	}
	// The outage: the store's path cut, then restored.
	sleepUntil(ctx, start.Add(cfg.steady))
	proxy.Cut()
	sleepUntil(ctx, start.Add(cfg.steady+cfg.outage))
	proxy.Restore()

	r := stormRun{OutageStart: int(cfg.steady / time.Second), OutageEnd: int((cfg.steady + cfg.outage) / time.Second)}
	r.Seconds = make([]second, n)
	for _, p := range procs {
		// Every call a worker started ends within its deadline (the
		// preset's 10 s, and the complete's grace after the work).
		res, err := p.result(total + 90*time.Second)
		if err != nil {
			return stormRun{}, err
		}
		sum := processSummary{SDK: res.SDK, Callers: res.Callers, LateMS: res.LateMS, Errors: res.Errors}
		for i, x := range res.Seconds {
			if i < n {
				r.Seconds[i].add(x)
			}
		}
		sum.second = res.Totals
		r.Reported += sum.SideEffects
		r.Processes = append(r.Processes, sum)
	}
	for i := range r.Seconds {
		if x := &r.Seconds[i]; x.First > 0 {
			x.Amplify = float64(x.Attempts) / float64(x.First)
		}
	}
	r.SideEffects, r.Duplicates = sink.ledger()
	return r, nil
}

// tenantRetries reads tenant's retries by cause, and those refused, from
// idem's /metrics.
func tenantRetries(base, tenant string) string {
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	var parts []string
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if !strings.Contains(l, `tenant="`+tenant+`"`) {
			continue
		}
		if strings.HasPrefix(l, "idem_attempts_total{") && strings.Contains(l, `attempt="retry"`) || strings.HasPrefix(l, "idem_retries_refused_total{") {
			name, v, _ := strings.Cut(l, " ")
			name = strings.Replace(name, `,tenant="`+tenant+`"`, "", 1)
			name = strings.Replace(name, `tenant="`+tenant+`",`, "", 1)
			parts = append(parts, name+" "+v)
		}
	}
	return strings.Join(parts, "; ")
}

func sleepUntil(ctx context.Context, t time.Time) {
	select {
	case <-time.After(time.Until(t)):
	case <-ctx.Done():
	}
}

// workerProc is one running worker process.
type workerProc struct {
	sdk   string
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string // its stdout, line by line
	done  chan error
}

// startWorker starts one worker of sdk with its configuration.
func startWorker(ctx context.Context, cfg stormConfig, sdk string, wc workerConfig) (*workerProc, error) {
	var cmd *exec.Cmd
	switch sdk {
	case "go":
		cmd = exec.CommandContext(ctx, cfg.self, "storm-worker")
	case "python":
		cmd = exec.CommandContext(ctx, cfg.python, filepath.Join(cfg.workerDir, "worker.py"))
	case "node":
		cmd = exec.CommandContext(ctx, cfg.node, filepath.Join(cfg.workerDir, "worker.mjs"))
	}
	b, _ := json.Marshal(wc)
	cmd.Env = append(os.Environ(), "STORM_WORKER="+string(b))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("%s worker: %w", sdk, err)
	}
	p := &workerProc{sdk: sdk, cmd: cmd, stdin: stdin, lines: make(chan string, 4), done: make(chan error, 1)}
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 16<<20)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
		close(p.lines)
		p.done <- cmd.Wait()
	}()
	return p, nil
}

// ready waits for the worker's "ready" line.
func (p *workerProc) ready(within time.Duration) error {
	select {
	case l, ok := <-p.lines:
		if !ok || l != "ready" {
			return fmt.Errorf("%s worker: not ready (%q)", p.sdk, l)
		}
		return nil
	case <-time.After(within):
		return fmt.Errorf("%s worker: not ready within %s", p.sdk, within)
	}
}

// result waits for the worker's result line and its exit.
func (p *workerProc) result(within time.Duration) (workerResult, error) {
	var res workerResult
	timeout := time.After(within)
	select {
	case l, ok := <-p.lines:
		if !ok {
			return res, fmt.Errorf("%s worker: exited without a result: %v", p.sdk, <-p.done)
		}
		if err := json.Unmarshal([]byte(l), &res); err != nil {
			return res, fmt.Errorf("%s worker: result %q: %w", p.sdk, l, err)
		}
	case <-timeout:
		return res, fmt.Errorf("%s worker: no result within %s", p.sdk, within)
	}
	_ = p.stdin.Close()
	for range p.lines {
	}
	select {
	case err := <-p.done:
		if err != nil {
			return res, fmt.Errorf("%s worker: %w", p.sdk, err)
		}
	case <-timeout:
		return res, fmt.Errorf("%s worker: did not exit within %s", p.sdk, within)
	}
	return res, nil
}

// stop kills a worker still running (after a failure elsewhere).
func (p *workerProc) stop() {
	if p.cmd.ProcessState == nil && p.cmd.Process != nil {
		_ = p.cmd.Process.Kill()
	}
}

// effectSink is the ledger of side effects: every run of a worker's work
// is one POST /effect/{key}; a key recorded twice is a duplicate, counted
// here rather than assumed from what the workers report.
type effectSink struct {
	srv *http.Server
	url string

	mu   sync.Mutex
	keys map[string]int
}

func newEffectSink() (*effectSink, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &effectSink{url: "http://" + ln.Addr().String(), keys: map[string]int{}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /effect/{key}", func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.keys[r.PathValue("key")]++
		s.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	})
	s.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = s.srv.Serve(ln) }()
	return s, nil
}

// ledger returns the side effects recorded and the keys recorded more than
// once.
func (s *effectSink) ledger() (effects, duplicates int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, n := range s.keys {
		effects += int64(n)
		if n > 1 {
			duplicates++
		}
	}
	return effects, duplicates
}

func (s *effectSink) close() { _ = s.srv.Close() }

// report prints the per-second table and the goals of issue 28; it
// returns false when a goal of the budget-on run (or 0 duplicates) fails.
func (r stormRun) report(w io.Writer) bool {
	fmt.Fprintf(w, "\n== fleet budget %s (retry_budget_percent %d); outage seconds %d-%d ==\n", r.Budget, r.Percent, r.OutageStart, r.OutageEnd-1)
	fmt.Fprintf(w, "%4s %7s %9s %9s %7s %7s %9s %9s %9s\n", "s", "calls", "attempts", "first", "ampl", "ok%", "fleet429", "signalled", "procbudg")
	for i, s := range r.Seconds {
		ok := 0.0
		if s.Calls > 0 {
			ok = 100 * float64(s.Succeeded) / float64(s.Calls)
		}
		mark := ""
		if i >= r.OutageStart && i < r.OutageEnd {
			mark = " outage"
		}
		fmt.Fprintf(w, "%4d %7d %9d %9d %7.2f %7.1f %9d %9d %9d%s\n", i, s.Calls, s.Attempts, s.First, s.Amplify, ok, s.FleetRefused, s.FleetSignal, s.ProcRefused, mark)
	}
	sum := func(from, to int, f func(second) int64) float64 {
		var t int64
		for i := max(from, 0); i < min(to, len(r.Seconds)); i++ {
			t += f(r.Seconds[i])
		}
		return float64(t)
	}
	attempts := func(s second) int64 { return s.Attempts }
	first := func(s second) int64 { return s.First }
	steadyRate := sum(1, r.OutageStart, attempts) / float64(max(r.OutageStart-1, 1))
	outageAmp := sum(r.OutageStart, r.OutageEnd, attempts) / math.Max(sum(r.OutageStart, r.OutageEnd, first), 1)
	// Attempts past the fleet budget: those that did work (or reached the
	// store's turn), refusals left out.
	admittedAmp := (sum(r.OutageStart, r.OutageEnd, attempts) - sum(r.OutageStart, r.OutageEnd, func(s second) int64 { return s.FleetRefused })) /
		math.Max(sum(r.OutageStart, r.OutageEnd, first), 1)
	waveRatio := sum(r.OutageEnd, r.OutageEnd+5, attempts) / 5 / math.Max(steadyRate, 1)
	calls := sum(r.OutageEnd+5, len(r.Seconds)-1, func(s second) int64 { return s.Calls })
	okAfter := sum(r.OutageEnd+5, len(r.Seconds)-1, func(s second) int64 { return s.Succeeded })
	successAfter := 100 * okAfter / math.Max(calls, 1)
	fmt.Fprintf(w, "%-7s %7s %7s %9s %9s %9s %9s %9s %9s %7s\n", "process", "callers", "calls", "succeeded", "attempts", "fleet429", "signalled", "procbudg", "effects", "late")
	for _, p := range r.Processes {
		fmt.Fprintf(w, "%-7s %7d %7d %9d %9d %9d %9d %9d %9d %5dms\n", p.SDK, p.Callers, p.Calls, p.Succeeded, p.Attempts, p.FleetRefused, p.FleetSignal, p.ProcRefused, p.SideEffects, p.LateMS)
	}
	for _, p := range r.Processes {
		keys := slices.Sorted(maps.Keys(p.Errors))
		var parts []string
		for _, k := range keys {
			parts = append(parts, fmt.Sprintf("%s %d", k, p.Errors[k]))
		}
		fmt.Fprintf(w, "failed calls, %s: %s\n", p.SDK, strings.Join(parts, ", "))
	}
	fmt.Fprintf(w, "server: %s\n", r.Server)
	fmt.Fprintf(w, "side effects in the sink's ledger %d (the workers counted %d), keys recorded more than once (duplicates) %d\n", r.SideEffects, r.Reported, r.Duplicates)
	fmt.Fprintf(w, "outage: attempts %.2f x first attempts (goal with the budget on: <= 1.1); past the fleet budget (refusals left out) %.2f x\n", outageAmp, admittedAmp)
	fmt.Fprintf(w, "outage: %.0f retries refused (429 retry_budget_exhausted), %.0f not sent (the failure said Idem-Retry-Budget: exhausted)\n",
		sum(r.OutageStart, r.OutageEnd, func(s second) int64 { return s.FleetRefused }), sum(r.OutageStart, r.OutageEnd, func(s second) int64 { return s.FleetSignal }))
	fmt.Fprintf(w, "first 5 s after recovery: attempts %.2f x the steady rate of %.0f/s (goal: <= 1.5)\n", waveRatio, steadyRate)
	fmt.Fprintf(w, "from 5 s after recovery: %.2f %% of logical calls succeeded (goal: >= 99)\n", successAfter)
	fmt.Fprintf(w, "RESULT storm budget=%s percent=%d outage_amplification=%.3f outage_admitted=%.3f recovery_wave=%.3f success_after=%.2f duplicates=%d\n",
		r.Budget, r.Percent, outageAmp, admittedAmp, waveRatio, successAfter, r.Duplicates)
	return r.Duplicates == 0 && r.SideEffects == r.Reported
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// stormSVG draws attempts per second and amplification over time, one line
// per run (budget off, on), the outage shaded: plain SVG, no script, no
// external asset.
func stormSVG(runs []stormRun, cfg stormConfig) string {
	const w, h, left, right, top, gap, ph = 760, 560, 60, 20, 40, 60, 180
	colors := map[string]string{"off": "#c0392b", "on": "#2471a3"}
	n := 0
	maxAtt, maxAmp := 1.0, 1.0
	for _, r := range runs {
		n = max(n, len(r.Seconds))
		for _, s := range r.Seconds {
			maxAtt = math.Max(maxAtt, float64(s.Attempts))
			maxAmp = math.Max(maxAmp, s.Amplify)
		}
	}
	maxAtt = math.Ceil(maxAtt/100) * 100
	maxAmp = math.Ceil(maxAmp)
	x := func(i float64) float64 { return left + i*(w-left-right)/float64(max(n-1, 1)) }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 %d %d" width="%d" height="%d" font-family="sans-serif" font-size="12" role="img" aria-label="Storm test: attempts per second and amplification, fleet budget off and on">`+"\n", w, h, w, h)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="#fff"/>`+"\n", w, h)
	fmt.Fprintf(&b, `<text x="%d" y="20" font-size="14" font-weight="bold">Storm: %d callers, %.0f logical calls/s, %s store outage</text>`+"\n", left, cfg.callers, float64(cfg.callers)/cfg.period.Seconds(), cfg.outage)
	panel := func(y0 float64, title string, maxV float64, val func(second) float64) {
		if len(runs) > 0 {
			r := runs[0]
			fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%d" fill="#eee"/>`+"\n", x(float64(r.OutageStart)), y0, x(float64(r.OutageEnd))-x(float64(r.OutageStart)), ph)
			fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" fill="#666">store outage</text>`+"\n", x(float64(r.OutageStart))+4, y0+14)
		}
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" font-weight="bold">%s</text>`+"\n", left, y0-8, title)
		for k := 0; k <= 4; k++ {
			v := maxV * float64(k) / 4
			y := y0 + ph - ph*float64(k)/4
			fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ccc"/><text x="%d" y="%.1f" text-anchor="end">%g</text>`+"\n", left, y, w-right, y, left-6, y+4, math.Round(v*10)/10)
		}
		for _, r := range runs {
			var pts []string
			for i, s := range r.Seconds {
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(float64(i)), y0+ph-ph*math.Min(val(s), maxV)/maxV))
			}
			fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`+"\n", colors[r.Budget], strings.Join(pts, " "))
		}
	}
	panel(top+30, "Attempts reaching idem per second", maxAtt, func(s second) float64 { return float64(s.Attempts) })
	if len(runs) > 0 {
		var pts []string
		for i, s := range runs[0].Seconds {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(float64(i)), top+30+ph-ph*math.Min(float64(s.First), maxAtt)/maxAtt))
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="#555" stroke-dasharray="4 3" points="%s"/>`+"\n", strings.Join(pts, " "))
	}
	panel(top+30+ph+gap, "Amplification (attempts ÷ first attempts)", maxAmp, func(s second) float64 { return s.Amplify })
	yAxis := float64(top + 30 + 2*ph + gap)
	for i := 0; i < n; i += 5 {
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%ds</text>`+"\n", x(float64(i)), yAxis+16, i)
	}
	ly := yAxis + 40
	lx := float64(left)
	for _, r := range runs {
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="2"/><text x="%.1f" y="%.1f">fleet budget %s (%d %%)</text>`+"\n",
			lx, ly, lx+24, ly, colors[r.Budget], lx+30, ly+4, r.Budget, r.Percent)
		lx += 220
	}
	fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#555" stroke-dasharray="4 3"/><text x="%.1f" y="%.1f">first attempts</text>`+"\n", lx, ly, lx+24, ly, lx+30, ly+4)
	b.WriteString("</svg>\n")
	return b.String()
}
