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
// host), the idem binary -server-bin on 127.0.0.1:0 behind it, and the
// callers in this process (the Go SDK, one client.Client per caller). The
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
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-dev/idem/client"
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
	if err := fs.Parse(args); err != nil {
		return c, err
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
	if c.callers < 1 || c.callers > 2000 {
		return c, fmt.Errorf("-callers must be 1..2000, got %d", c.callers)
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
	Amplify      float64 `json:"amplification"`   // attempts ÷ first attempts
}

// stormRun is one run: the per-second figures and the outage's seconds.
type stormRun struct {
	Budget      string   `json:"budget"`
	Percent     int      `json:"retry_budget_percent"`
	Seconds     []second `json:"seconds"`
	OutageStart int      `json:"outage_start"`
	OutageEnd   int      `json:"outage_end"`
	SideEffects int64    `json:"side_effects"`
	Duplicates  int64    `json:"duplicates"`
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
	fmt.Fprintf(stdout, "storm: %d callers, one call each per %s (%.0f logical calls/s), steady %s, store outage %s, recovery %s; server %s, store through a cut proxy\n",
		cfg.callers, cfg.period, float64(cfg.callers)/cfg.period.Seconds(), cfg.steady, cfg.outage, cfg.recovery, base)

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

// stormPhase runs one steady → outage → recovery sequence for one tenant.
func stormPhase(ctx context.Context, cfg stormConfig, base, token string, proxy *cutproxy.Proxy) (stormRun, error) {
	total := cfg.steady + cfg.outage + cfg.recovery
	n := int(math.Ceil(total.Seconds()))
	secs := make([]struct {
		calls, ok, attempts, first, fleet, signal, proc atomic.Int64
	}, n+60)
	start := time.Now()
	at := func() int { return min(int(time.Since(start)/time.Second), len(secs)-1) }

	// One transport for all (a process's sockets are not the point); one
	// client each, so each caller has its own per-process retry budget.
	hc := &http.Client{Transport: client.NewTransport()}
	hook := func(info client.AttemptInfo) {
		s := &secs[at()]
		s.attempts.Add(1)
		if info.Attempt == 1 {
			s.first.Add(1)
		}
		switch info.GiveUp {
		case "fleet-budget":
			s.fleet.Add(1)
		case "fleet-signal":
			s.signal.Add(1)
		case "budget":
			s.proc.Add(1)
		}
	}
	var effects sync.Map // key → *atomic.Int64 (runs of the work)
	var effectCount atomic.Int64
	var wg sync.WaitGroup
	runCtx, cancel := context.WithTimeout(ctx, total)
	defer cancel()
	for i := range cfg.callers {
		c, err := client.New(base, client.WithToken(token), client.WithHTTPClient(hc), client.Interactive(), client.WithAttemptHook(hook))
		if err != nil {
			return stormRun{}, err
		}
		offset := time.Duration(int64(cfg.period) * int64(i) / int64(cfg.callers))
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := time.NewTimer(offset)
			defer t.Stop()
			for seq := 0; ; seq++ {
				select {
				case <-runCtx.Done():
					return
				case <-t.C:
				}
				t.Reset(cfg.period)
				sec := at()
				secs[sec].calls.Add(1)
				key := fmt.Sprintf("storm-%d-%d", i, seq)
				wg.Add(1)
				go func() {
					defer wg.Done()
					_, err := c.Do(context.WithoutCancel(ctx), key, client.Request{Operation: "POST /orders", Payload: map[string]any{"caller": i, "seq": seq}},
						func(context.Context, *client.Claim) (client.Response, error) {
							v, _ := effects.LoadOrStore(key, new(atomic.Int64))
							v.(*atomic.Int64).Add(1)
							effectCount.Add(1)
							return client.Response{Status: 201, Body: []byte(`{"ok":true}`)}, nil
						})
					if err == nil {
						secs[sec].ok.Add(1)
					}
				}()
			}
		}()
	}
	// The outage: the store's path cut, then restored.
	select {
	case <-time.After(cfg.steady):
	case <-ctx.Done():
	}
	proxy.Cut()
	select {
	case <-time.After(cfg.outage):
	case <-ctx.Done():
	}
	proxy.Restore()
	wg.Wait()

	r := stormRun{OutageStart: int(cfg.steady / time.Second), OutageEnd: int((cfg.steady + cfg.outage) / time.Second), SideEffects: effectCount.Load()}
	effects.Range(func(_, v any) bool {
		if v.(*atomic.Int64).Load() > 1 {
			r.Duplicates++
		}
		return true
	})
	for i := range n {
		s := &secs[i]
		x := second{Calls: s.calls.Load(), Succeeded: s.ok.Load(), Attempts: s.attempts.Load(), First: s.first.Load(),
			FleetRefused: s.fleet.Load(), FleetSignal: s.signal.Load(), ProcRefused: s.proc.Load()}
		if x.First > 0 {
			x.Amplify = float64(x.Attempts) / float64(x.First)
		}
		r.Seconds = append(r.Seconds, x)
	}
	return r, nil
}

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
	fmt.Fprintf(w, "side effects %d, duplicates %d\n", r.SideEffects, r.Duplicates)
	fmt.Fprintf(w, "outage: attempts %.2f x first attempts (goal with the budget on: <= 1.1); past the fleet budget (refusals left out) %.2f x\n", outageAmp, admittedAmp)
	fmt.Fprintf(w, "outage: %.0f retries refused (429 retry_budget_exhausted), %.0f not sent (the failure said Idem-Retry-Budget: exhausted)\n",
		sum(r.OutageStart, r.OutageEnd, func(s second) int64 { return s.FleetRefused }), sum(r.OutageStart, r.OutageEnd, func(s second) int64 { return s.FleetSignal }))
	fmt.Fprintf(w, "first 5 s after recovery: attempts %.2f x the steady rate of %.0f/s (goal: <= 1.5)\n", waveRatio, steadyRate)
	fmt.Fprintf(w, "from 5 s after recovery: %.2f %% of logical calls succeeded (goal: >= 99)\n", successAfter)
	fmt.Fprintf(w, "RESULT storm budget=%s percent=%d outage_amplification=%.3f outage_admitted=%.3f recovery_wave=%.3f success_after=%.2f duplicates=%d\n",
		r.Budget, r.Percent, outageAmp, admittedAmp, waveRatio, successAfter, r.Duplicates)
	return r.Duplicates == 0
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
