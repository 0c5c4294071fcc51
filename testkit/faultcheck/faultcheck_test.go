package faultcheck

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"
)

var (
	flagSeed       = flag.Uint64("faultcheck.seed", 0, "seed of the schedules (0: a random one, printed)")
	flagSchedules  = flag.Int("faultcheck.schedules", 2, "schedules per front door and store (with -faultcheck.duration: at least)")
	flagDuration   = flag.Duration("faultcheck.duration", 0, "run schedules per front door and store until this much time has passed (long runs: scripts/faultcheck 2h)")
	flagFrontDoors = flag.String("faultcheck.frontdoors", "gateway,idemhttp,asgi,wsgi,express,fetch", "front doors to drive")
	flagStores     = flag.String("faultcheck.stores", "sqlite,postgres", "stores to run on")
	flagDump       = flag.Bool("faultcheck.dump", false, "log every request and answer of every schedule")
	flagLogDir     = flag.String("faultcheck.logdir", "", "append every process's whole stderr to files in this directory (a failure report shows only the last lines)")
	flagFaults     = flag.String("faultcheck.faults", "default", "fault kinds: default (all but KnownFailing and OptIn), all, or a comma list of "+strings.Join(AllFaults, ","))
)

var bins Bins //nolint:gochecknoglobals // built once by TestMain, read-only afterwards

func TestMain(m *testing.M) {
	flag.Parse()
	LogDir = *flagLogDir
	dir, err := os.MkdirTemp("", "idem-faultcheck-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "faultcheck:", err)
		os.Exit(1)
	}
	if bins, err = Build(dir); err != nil {
		fmt.Fprintln(os.Stderr, "faultcheck:", err)
		_ = os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// faultsFor is the fault kinds to run on frontdoor.
func faultsFor(frontdoor string) (on []Fault, left map[Fault]string) {
	switch *flagFaults {
	case "all":
		return AllFaults, nil
	case "default":
		left = map[Fault]string{}
		for _, f := range AllFaults {
			if why, ok := OptIn[f]; ok {
				left[f] = why
				continue
			}
			if hole, ok := KnownFailing[frontdoor][f]; ok {
				left[f] = hole
				continue
			}
			on = append(on, f)
		}
		return on, left
	}
	for _, f := range strings.Split(*flagFaults, ",") {
		if f = strings.TrimSpace(f); f != "" {
			on = append(on, f)
		}
	}
	return on, nil
}

// TestFaultCheck drives every front door on both stores with seeded
// schedules of duplicates, disconnects, failing handlers and faults, and
// checks the invariants of the promise over what the clients saw and what
// the handlers did (see the package doc and docs/reliability.md). A failure
// prints the seed, the schedule, the violations and the command that
// reproduces it.
func TestFaultCheck(t *testing.T) {
	seed := *flagSeed
	if seed == 0 {
		seed = rand.Uint64N(1 << 32)
	}
	t.Logf("faultcheck seed %d (reproduce with -faultcheck.seed=%d)", seed, seed)
	for _, fd := range strings.Split(*flagFrontDoors, ",") {
		fd = strings.TrimSpace(fd)
		if fd == "" {
			continue
		}
		t.Run(fd, func(t *testing.T) {
			// Front doors run side by side, at most -parallel (GOMAXPROCS)
			// at once: their processes mostly wait on leases and sleeps.
			t.Parallel()
			if _, err := AppArgv(bins, fd); err != nil {
				if os.Getenv("IDEM_REQUIRE_EXAMPLES") == "1" {
					t.Fatalf("front door %s cannot run but IDEM_REQUIRE_EXAMPLES=1: %v", fd, err)
				}
				t.Skipf("front door %s cannot run: %v (IDEM_REQUIRE_EXAMPLES=1 fails instead)", fd, err)
			}
			for _, store := range strings.Split(*flagStores, ",") {
				store = strings.TrimSpace(store)
				t.Run(store, func(t *testing.T) { runFrontDoor(t, seed, fd, store) })
			}
		})
	}
}

func runFrontDoor(t *testing.T, seed uint64, fd, store string) {
	faults, left := faultsFor(fd)
	if len(left) > 0 {
		var l []string
		for f, hole := range left {
			l = append(l, f+" ("+hole+")")
		}
		sort.Strings(l)
		t.Logf("left out (KnownFailing: until their holes are fixed; OptIn; -faultcheck.faults=all runs them): %s", strings.Join(l, ", "))
	}
	r := NewRig(t, bins, fd, store, faults...)
	problems, err := LoadProblems(bins.Root)
	if err != nil {
		t.Fatal(err)
	}
	env := Env{FrontDoor: fd, Scoped: true, FailOpen: fd == "gateway", UnscopedRoute: fd == "gateway", StoreCut: r.CanCut(), Freeze: r.CanFreeze(), ListenerDown: r.CanListenerDown(), FinishBudget: fd != "gateway", Lease: Lease}
	if !r.CanCut() && slices.Contains(faults, FaultStoreCut) {
		t.Logf("fault storecut not run: the gateway on SQLite has no path to cut")
	}
	if !r.CanFreeze() && slices.Contains(faults, FaultFreeze) {
		t.Logf("fault freeze not run: the gateway's PostgreSQL is shared (no process to stop, no file lock)")
	}
	if !r.CanListenerDown() && slices.Contains(faults, FaultListenerDown) {
		t.Logf("fault listenerdown not run: the gateway binary opens its own store (no listenerserve)")
	}
	started := time.Now()
	stats := map[string]int{}
	var takeovers int
	for i := 0; i < *flagSchedules || (*flagDuration > 0 && time.Since(started) < *flagDuration); i++ {
		s := Generate(seed, i, faults, env)
		h := Execute(r, s)
		all, err := readLog(r.LogPath, 0)
		if err != nil {
			t.Fatalf("faultcheck: %v", err)
		}
		var runs []*Run
		mark := fmt.Sprintf("fc%d-%d-", seed, i)
		for _, run := range all {
			if strings.Contains(run.Start.Key, mark) {
				runs = append(runs, run)
			}
		}
		rep := Check(s, h, runs, problems)
		if *flagDump {
			t.Logf("%s", s)
			for _, x := range h.Sent {
				t.Logf("  %s", x)
			}
		}
		stats["schedules"]++
		stats["requests"] += rep.Requests
		stats["runs"] += rep.Runs
		for _, f := range h.Faults {
			stats["fault "+f.Kind]++
		}
		takeovers += len(rep.Takeovers)
		if len(rep.Violations) > 0 {
			var b strings.Builder
			fmt.Fprintf(&b, "faultcheck: %s on %s, seed %d: %d violation(s); the first:\n  %s\n\n", fd, store, seed, len(rep.Violations), rep.Violations[0])
			b.WriteString(s.String())
			b.WriteString("faults injected:\n")
			for _, f := range h.Faults {
				fmt.Fprintf(&b, "  %s %s (%s)\n", f.Kind, f.What, f.End.Sub(f.Start).Round(time.Millisecond))
			}
			if len(h.Before) > 0 && len(h.Sent) > 0 {
				first := h.Sent[0].Start
				for _, x := range h.Sent {
					if x.Start.Before(first) {
						first = x.Start
					}
				}
				b.WriteString("faults of the schedule before (their afterglow may reach this one):\n")
				for _, f := range h.Before {
					fmt.Fprintf(&b, "  %s %s, ended %s before this schedule's first request\n", f.Kind, f.What, first.Sub(f.End).Round(time.Millisecond))
				}
			}
			b.WriteString("every violation:\n")
			for _, v := range rep.Violations {
				fmt.Fprintf(&b, "  %s\n", v)
			}
			for _, tk := range rep.Takeovers {
				fmt.Fprintf(&b, "  (legal) %s\n", tk)
			}
			fmt.Fprintf(&b, "reproduce: go test ./testkit/faultcheck -run 'TestFaultCheck/%s/%s' -faultcheck.seed=%d -faultcheck.schedules=%d -faultcheck.faults=%s\n",
				fd, store, seed, i+1, strings.Join(faults, ","))
			t.Error(b.String())
			t.Logf("%s", r.Stderr())
			break
		}
	}
	var keys []string
	for k := range stats {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s=%d", k, stats[k]))
	}
	t.Logf("FAULTCHECK-SUMMARY %s/%s seed=%d %s takeovers=%d failed=%v took=%s", fd, store, seed, strings.Join(parts, " "), takeovers, t.Failed(), time.Since(started).Round(time.Second))
}
