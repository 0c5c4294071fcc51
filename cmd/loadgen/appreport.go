package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"
)

// appRound is one round of one cell (scenario × clients).
type appRound struct {
	floor  *phaseResult // both generators on the unprotected app
	pair   *phaseResult // idem app and library app at once
	server *phaseResult // idem server and the bare floor server at once (fresh, with -floor-bin)
}

// appCell is a scenario at a client count, over the rounds.
type appCell struct {
	scenario string
	clients  int
	rounds   []appRound
}

// appReport is the outcome of the app mode.
type appReport struct {
	cfg        config
	opts       appOptions
	cells      []*appCell
	violations []string
	load       [2]string // load average at the start and the end
	genCPU     float64   // this process's CPU (the load generators), seconds
	elapsed    time.Duration
	schemas    []string // the schemas the run made (and dropped)
}

// runApp runs the app mode: setup, a warm-up, then per round every cell.
func runApp(ctx context.Context, cfg config, opts appOptions) (*appReport, error) {
	rep := &appReport{cfg: cfg, opts: opts, load: [2]string{loadAvg(), ""}}
	begin := time.Now()
	cpu0, _ := procTicks(os.Getpid())
	r := &appRun{cfg: cfg, opts: opts}
	defer r.close()
	err := r.setup(ctx)
	rep.schemas = r.schemas
	if err != nil {
		return nil, err
	}

	// Warm-up (not measured): pools, caches and the tenant's settings.
	warm := r.cfg
	warm.duration = min(2*time.Second, cfg.duration)
	r.cfg = warm
	var gens []*gen
	for _, role := range []string{roleAppUnprotected, roleAppIdem, roleAppLibrary} {
		l, err := r.newAppLoader(role, modeFrontdoor, slices.Max(opts.clients))
		if err != nil {
			return nil, err
		}
		gens = append(gens, &gen{name: role, l: l})
	}
	if opts.floorBin != "" {
		for _, role := range []string{roleIdem, roleFloor} {
			l, err := r.newServerLoader(role, slices.Max(opts.clients))
			if err != nil {
				return nil, err
			}
			gens = append(gens, &gen{name: role, l: l})
		}
	}
	if _, err := r.phase(ctx, false, gens...); err != nil {
		return nil, fmt.Errorf("warm-up: %w", err)
	}
	r.cfg = cfg
	if slices.Contains(opts.scenarios, scenarioReplay) {
		if err := r.prepareReplays(ctx); err != nil {
			return nil, err
		}
	}

	for _, s := range opts.scenarios {
		for _, c := range opts.clients {
			rep.cells = append(rep.cells, &appCell{scenario: s, clients: c})
		}
	}
	profiled := false
	for round := range cfg.rounds {
		for _, cell := range rep.cells {
			var rr appRound
			var err error
			if rr.floor, err = r.floorPhase(ctx, cell.clients); err != nil {
				return nil, err
			}
			profile := false
			if (opts.profile != "" || opts.appProfile != "") && !profiled && cell.scenario == scenarioFresh {
				profile, profiled = true, true
			}
			if rr.pair, err = r.pairPhase(ctx, cell.scenario, cell.clients, profile); err != nil {
				return nil, err
			}
			if opts.floorBin != "" && cell.scenario == scenarioFresh {
				if rr.server, err = r.serverPhase(ctx, cell.clients); err != nil {
					return nil, err
				}
			}
			rep.violations = append(rep.violations, rr.check(fmt.Sprintf("round %d, %s, %d clients", round+1, cell.scenario, cell.clients), cell.scenario)...)
			cell.rounds = append(cell.rounds, rr)
		}
	}
	cpu1, _ := procTicks(os.Getpid())
	rep.genCPU = float64(cpu1-cpu0) / clkTck
	rep.elapsed = time.Since(begin)
	rep.load[1] = loadAvg()
	return rep, nil
}

// newServerLoader is a lifecycle load generator (claim + complete) against
// the idem server or the floor server directly.
func (r *appRun) newServerLoader(role string, clients int) (*loader, error) {
	u, err := checkLoopbackURL("http://" + r.addr[role])
	if err != nil {
		return nil, err
	}
	cfg := r.cfg
	cfg.baseURL, cfg.mode, cfg.concurrency, cfg.token, cfg.requests = u, modeLifecycle, clients, r.token, 0
	return newLoader(cfg)
}

func (r *appRun) floorPhase(ctx context.Context, clients int) (*phaseResult, error) {
	var gens []*gen
	for i := range 2 {
		l, err := r.newAppLoader(roleAppUnprotected, modeFrontdoor, clients)
		if err != nil {
			return nil, err
		}
		gens = append(gens, &gen{name: fmt.Sprintf("unprotected-%d", i+1), l: l, roles: []string{roleAppUnprotected}})
	}
	return r.phase(ctx, false, gens...)
}

func (r *appRun) pairPhase(ctx context.Context, scenario string, clients int, profile bool) (*phaseResult, error) {
	mode := modeFrontdoor
	if scenario == scenarioReplay {
		mode = modeFrontdoorReplay
	}
	li, err := r.newAppLoader(roleAppIdem, mode, clients)
	if err != nil {
		return nil, err
	}
	ll, err := r.newAppLoader(roleAppLibrary, mode, clients)
	if err != nil {
		return nil, err
	}
	if scenario == scenarioReplay {
		li.prefix, ll.prefix = r.replay[roleAppIdem], r.replay[roleAppLibrary]
	}
	return r.phase(ctx, profile,
		&gen{name: "idem", l: li, roles: []string{roleAppIdem, roleIdem}},
		&gen{name: "library", l: ll, roles: []string{roleAppLibrary}})
}

func (r *appRun) serverPhase(ctx context.Context, clients int) (*phaseResult, error) {
	li, err := r.newServerLoader(roleIdem, clients)
	if err != nil {
		return nil, err
	}
	lf, err := r.newServerLoader(roleFloor, clients)
	if err != nil {
		return nil, err
	}
	return r.phase(ctx, false, &gen{name: "idem-direct", l: li, roles: []string{roleIdem}}, &gen{name: "floor", l: lf, roles: []string{roleFloor}})
}

// requests is what a generator sent, and answered what got an HTTP answer.
func (g *gen) requests() (sent, answered int64) {
	for k, v := range g.rep.tally.outcomes {
		sent += v
		if !strings.HasSuffix(k, "transport error") {
			answered += v
		}
	}
	return sent, answered
}

// check returns what broke in a round: a request not answered or not
// answered as expected, or an app whose handler ran other than once per
// fresh key (and never for a replay).
func (rr appRound) check(where, scenario string) []string {
	var bad []string
	for _, ph := range []*phaseResult{rr.floor, rr.pair, rr.server} {
		if ph == nil {
			continue
		}
		for _, g := range ph.gens {
			sent, answered := g.requests()
			if sent != answered || g.rep.tally.unexpected != 0 {
				bad = append(bad, fmt.Sprintf("%s: %s: %d requests, %d answered, %d not as expected (%v)", where, g.name, sent, answered, g.rep.tally.unexpected, g.rep.tally.outcomes))
			}
		}
	}
	want := func(role string, got, n int64) {
		if got != n {
			bad = append(bad, fmt.Sprintf("%s: %s: the handler inserted %d orders for %d requests", where, role, got, n))
		}
	}
	n0, _ := rr.floor.gens[0].requests()
	n1, _ := rr.floor.gens[1].requests()
	want(roleAppUnprotected, rr.floor.orders[roleAppUnprotected], n0+n1)
	ni, _ := rr.pair.gens[0].requests()
	nl, _ := rr.pair.gens[1].requests()
	if scenario == scenarioReplay {
		ni, nl = 0, 0 // a replay never runs the handler
	}
	want(roleAppIdem, rr.pair.orders[roleAppIdem], ni)
	want(roleAppLibrary, rr.pair.orders[roleAppLibrary], nl)
	return bad
}

// roundFigures are the figures of one round, per request unless named.
type roundFigures struct {
	rps                                 [3]float64 // per generator: unprotected, idem, library
	cpu                                 [3]float64 // µs per request, all processes
	idemApp, idemServer, idemPGApp      float64
	idemPGLedger, libApp, libPG, unprPG float64
	unprApp                             float64
	serverPerCall                       float64 // the idem server's µs per call under idemhttp
	directPerCall, floorPerCall         float64 // the server phase
	pgBackground                        float64 // ms of CPU per second, the whole server's background processes
	lost                                int
	conns                               [2]int
}

func (rr appRound) figures(scenario string) roundFigures {
	var f roundFigures
	us := func(sec float64, n int64) float64 {
		if n == 0 {
			return 0
		}
		return sec * 1e6 / float64(n)
	}
	n0, _ := rr.floor.gens[0].requests()
	n1, _ := rr.floor.gens[1].requests()
	nu := n0 + n1
	c := rr.floor.cpu
	f.rps[0] = float64(nu) / 2 / rr.floor.elapsed.Seconds()
	f.unprApp, f.unprPG = us(c[roleAppUnprotected], nu), us(c["pg-"+roleAppUnprotected], nu)
	f.cpu[0] = f.unprApp + f.unprPG

	ni, _ := rr.pair.gens[0].requests()
	nl, _ := rr.pair.gens[1].requests()
	c = rr.pair.cpu
	secs := rr.pair.elapsed.Seconds()
	f.rps[1], f.rps[2] = float64(ni)/secs, float64(nl)/secs
	f.idemApp, f.idemServer = us(c[roleAppIdem], ni), us(c[roleIdem], ni)
	f.idemPGApp, f.idemPGLedger = us(c["pg-"+roleAppIdem], ni), us(c["pg-"+roleIdem], ni)
	f.cpu[1] = f.idemApp + f.idemServer + f.idemPGApp + f.idemPGLedger
	f.libApp, f.libPG = us(c[roleAppLibrary], nl), us(c["pg-"+roleAppLibrary], nl)
	f.cpu[2] = f.libApp + f.libPG
	calls := int64(2) // a fresh key: claim + complete
	if scenario == scenarioReplay {
		calls = 1
	}
	f.serverPerCall = us(c[roleIdem], ni*calls)
	f.pgBackground = c[rolePGBackground] * 1e3 / secs
	f.lost = rr.floor.lost + rr.pair.lost
	f.conns = rr.pair.conns
	if rr.server != nil {
		nd, _ := rr.server.gens[0].requests()
		nf, _ := rr.server.gens[1].requests()
		f.directPerCall, f.floorPerCall = us(rr.server.cpu[roleIdem], nd), us(rr.server.cpu[roleFloor], nf)
		f.lost += rr.server.lost
	}
	return f
}

// stat is the median of a figure over the rounds, with its range.
type stat struct{ med, lo, hi float64 }

func statOf(v []float64) stat {
	if len(v) == 0 {
		return stat{}
	}
	s := slices.Clone(v)
	slices.Sort(s)
	m := s[len(s)/2]
	if len(s)%2 == 0 {
		m = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return stat{m, s[0], s[len(s)-1]}
}

// format prints a ratio stat as "0.82 (0.66–0.94)", or its median alone
// for one round.
func (s stat) format(prec int) string {
	if s.lo == s.hi {
		return fmt.Sprintf("%.*f", prec, s.med)
	}
	return fmt.Sprintf("%.*f (%.*f–%.*f)", prec, s.med, prec, s.lo, prec, s.hi)
}

// over is the per-round figure x picked out, as a stat.
func (c *appCell) over(x func(roundFigures) float64) stat {
	var v []float64
	for _, rr := range c.rounds {
		v = append(v, x(rr.figures(c.scenario)))
	}
	return statOf(v)
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// command is how to run this report again.
func (rep *appReport) command() string {
	clients := make([]string, len(rep.opts.clients))
	for i, c := range rep.opts.clients {
		clients[i] = fmt.Sprint(c)
	}
	return fmt.Sprintf("scripts/bench-app %d %d %s %s", int(rep.cfg.duration.Seconds()), rep.cfg.rounds,
		strings.Join(clients, ","), strings.Join(rep.opts.scenarios, ","))
}

func loadAvg() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(data))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// print writes the report and returns the exit code: 1 when a request was
// not answered as expected or an app ran its handler other than once per
// fresh key.
func (rep *appReport) print(w io.Writer) int {
	cmd := rep.command()
	fmt.Fprintf(w, "== app bench (issue 23): POST /orders (one INSERT) served three ways, %s phases, %d round(s), %d CPUs, load average %s at the start, %s at the end (a shared machine: read the ratios)\n",
		rep.cfg.duration, rep.cfg.rounds, runtime.NumCPU(), rep.load[0], rep.load[1])
	fmt.Fprintln(w, "unprotected: the handler alone | idem: client/idemhttp, SDK defaults (client.New(url, client.WithToken(tok)), idemhttp.Options{}), real idem server on PostgreSQL |")
	fmt.Fprintln(w, "library: benchapp.Lib in-process (BEGIN, advisory lock, SELECT … FOR UPDATE, upsert, COMMIT; the handler; the same again: 10 round trips, a replay 4)")
	fmt.Fprintln(w, "each phase: two load generators at the same moment, C clients each (floor: both on the unprotected app; pair: one on idem's app, one on the library's)")
	for _, c := range rep.cells {
		fmt.Fprintf(w, "\n-- %s keys, %d clients (median of %d", c.scenario, c.clients, len(c.rounds))
		if len(c.rounds) > 1 {
			fmt.Fprint(w, ", min–max")
		}
		fmt.Fprintln(w, ")")
		row := func(name string, x ...func(roundFigures) float64) {
			fmt.Fprintf(w, "  %-46s", name)
			for _, f := range x {
				if f == nil {
					fmt.Fprintf(w, " %22s", "-")
					continue
				}
				fmt.Fprintf(w, " %22s", c.over(f).format(0))
			}
			fmt.Fprintln(w)
		}
		fmt.Fprintf(w, "  %-46s %22s %22s %22s\n", "", "unprotected", "idem", "library")
		row("requests/s (per generator)", func(f roundFigures) float64 { return f.rps[0] }, func(f roundFigures) float64 { return f.rps[1] }, func(f roundFigures) float64 { return f.rps[2] })
		row("CPU µs/request, all processes", func(f roundFigures) float64 { return f.cpu[0] }, func(f roundFigures) float64 { return f.cpu[1] }, func(f roundFigures) float64 { return f.cpu[2] })
		row("  the app", func(f roundFigures) float64 { return f.unprApp }, func(f roundFigures) float64 { return f.idemApp }, func(f roundFigures) float64 { return f.libApp })
		row("  the idem server", nil, func(f roundFigures) float64 { return f.idemServer }, nil)
		row("  PostgreSQL, the app's backends", func(f roundFigures) float64 { return f.unprPG }, func(f roundFigures) float64 { return f.idemPGApp }, func(f roundFigures) float64 { return f.libPG })
		row("  PostgreSQL, the idem server's backends", nil, func(f roundFigures) float64 { return f.idemPGLedger }, nil)
		row("idem server CPU µs per call (claim, complete)", nil, func(f roundFigures) float64 { return f.serverPerCall }, nil)
		if c.rounds[0].server != nil {
			fmt.Fprintf(w, "  %-46s %22s %22s  (loadgen lifecycle on each, at once)\n", "server CPU µs per call: idem direct | floor", c.over(func(f roundFigures) float64 { return f.directPerCall }).format(0), c.over(func(f roundFigures) float64 { return f.floorPerCall }).format(0))
		}
		last := c.rounds[len(c.rounds)-1].figures(c.scenario)
		fmt.Fprintf(w, "  the idem app's connections to the idem server (last pair phase): %d open at its end, %d closed during it\n", last.conns[0], last.conns[1])
		fmt.Fprintf(w, "  not attributed: PostgreSQL's background processes (walwriter, checkpointer, bgwriter, autovacuum; the whole server, other jobs' too) %s ms CPU/s; backends ended mid-phase %d\n",
			c.over(func(f roundFigures) float64 { return f.pgBackground }).format(0), last.lost)
	}

	cell := func(s string, n int) *appCell {
		for _, c := range rep.cells {
			if c.scenario == s && c.clients == n {
				return c
			}
		}
		return nil
	}
	fmt.Fprintf(w, "\n== issue 23 goals: ratios against the unprotected app measured in the same run (median of %d rounds", rep.cfg.rounds)
	if rep.cfg.rounds > 1 {
		fmt.Fprint(w, ", min–max")
	}
	fmt.Fprintln(w, ")")
	fmt.Fprintf(w, "command: %s\n", cmd)
	goal := func(label, target string, scenario string, x func(roundFigures) float64) {
		var parts []string
		for _, n := range rep.opts.clients {
			if c := cell(scenario, n); c != nil {
				parts = append(parts, fmt.Sprintf("%d clients %s", n, c.over(x).format(2)))
			}
		}
		if len(parts) == 0 {
			return
		}
		fmt.Fprintf(w, "  %-74s %s   goal %s\n", label, strings.Join(parts, "; "), target)
	}
	cpuIdem := func(f roundFigures) float64 { return ratio(f.cpu[1], f.cpu[0]) }
	cpuLib := func(f roundFigures) float64 { return ratio(f.cpu[2], f.cpu[0]) }
	goal("1. fresh: CPU per request, all processes, idem ÷ unprotected", "≤ 4.5", scenarioFresh, cpuIdem)
	goal("   (the library ÷ unprotected)", "-", scenarioFresh, cpuLib)
	goal("   fresh: requests/s, idem ÷ unprotected", "≥ 0.25 at 16", scenarioFresh, func(f roundFigures) float64 { return ratio(f.rps[1], f.rps[0]) })
	goal("   (the library ÷ unprotected)", "-", scenarioFresh, func(f roundFigures) float64 { return ratio(f.rps[2], f.rps[0]) })
	goal("   (idem ÷ the library: requests/s)", "-", scenarioFresh, func(f roundFigures) float64 { return ratio(f.rps[1], f.rps[2]) })
	goal("2. replays: CPU per request, all processes, idem ÷ unprotected", "≤ 1.3", scenarioReplay, cpuIdem)
	goal("   (the library ÷ unprotected)", "-", scenarioReplay, cpuLib)
	goal("   (idem ÷ the library: requests/s)", "-", scenarioReplay, func(f roundFigures) float64 { return ratio(f.rps[1], f.rps[2]) })
	if c := cell(scenarioFresh, rep.opts.clients[0]); c != nil {
		last := c.rounds[len(c.rounds)-1].figures(c.scenario)
		fmt.Fprintf(w, "  %-74s %d clients: %d connections open, %d closed during the phase   goal: none closed\n",
			"3. SDK defaults: the idem app's connections to idem (fresh, last phase)", c.clients, last.conns[0], last.conns[1])
		fmt.Fprintf(w, "  %-74s not measured by this bench\n", "   Python and Node clients")
	}
	goal("4. fresh: PostgreSQL CPU per request, idem (app + ledger) ÷ the library", "≤ 1", scenarioFresh, func(f roundFigures) float64 { return ratio(f.idemPGApp+f.idemPGLedger, f.libPG) })
	goal("   (the ledger's backends alone ÷ the library's PostgreSQL less the app's INSERT)", "-", scenarioFresh, func(f roundFigures) float64 { return ratio(f.idemPGLedger, f.libPG-f.idemPGApp) })
	if rep.opts.floorBin != "" {
		goal("5. the idem server's CPU per call ÷ the bare floor server (lifecycle)", "≤ 1.2", scenarioFresh, func(f roundFigures) float64 { return ratio(f.directPerCall, f.floorPerCall) })
	} else {
		fmt.Fprintf(w, "  %-74s not measured (run with -floor-bin; or scripts/bench-floor)\n", "5. the idem server's CPU per call ÷ the bare floor server")
	}
	fmt.Fprintf(w, "not attributed: the load generators (this process: %.1f s CPU over %s), PostgreSQL's background processes (above)\n", rep.genCPU, rep.elapsed.Round(time.Second))

	code := 0
	for _, v := range rep.violations {
		fmt.Fprintf(w, "VIOLATION: %s\n", v)
		code = 1
	}
	var answered, sent int64
	for _, c := range rep.cells {
		for _, rr := range c.rounds {
			for _, ph := range []*phaseResult{rr.floor, rr.pair, rr.server} {
				if ph == nil {
					continue
				}
				for _, g := range ph.gens {
					s, a := g.requests()
					sent, answered = sent+s, answered+a
				}
			}
		}
	}
	fmt.Fprintf(w, "RESULT mode=app rounds=%d seconds=%g requests=%d answered=%d violations=%d", rep.cfg.rounds, rep.cfg.duration.Seconds(), sent, answered, len(rep.violations))
	for _, c := range rep.cells {
		p := fmt.Sprintf("%s_%d_", c.scenario, c.clients)
		fmt.Fprintf(w, " %scpu_idem=%.2f %scpu_library=%.2f %srps_idem=%.2f %srps_library=%.2f %spg_idem_library=%.2f",
			p, c.over(cpuIdem).med, p, c.over(cpuLib).med,
			p, c.over(func(f roundFigures) float64 { return ratio(f.rps[1], f.rps[0]) }).med,
			p, c.over(func(f roundFigures) float64 { return ratio(f.rps[2], f.rps[0]) }).med,
			p, c.over(func(f roundFigures) float64 { return ratio(f.idemPGApp+f.idemPGLedger, f.libPG) }).med)
		if c.rounds[0].server != nil {
			fmt.Fprintf(w, " %sserver_floor=%.2f", p, c.over(func(f roundFigures) float64 { return ratio(f.directPerCall, f.floorPerCall) }).med)
		}
	}
	fmt.Fprintln(w)
	return code
}
