package faultcheck

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"
)

// A Fault is a kind of fault the generator may put in a schedule.
type Fault = string

// The fault kinds. Concurrent duplicates and retries at random delays are
// in every schedule.
const (
	FaultDisconnect  Fault = "disconnect"  // the client goes away before the body, mid-body or mid-answer
	FaultStream      Fault = "stream"      // streamed answers, and clients that go away mid-stream
	FaultHandlerFail Fault = "handlerfail" // the handler raises/panics, answers 5xx, cuts its stream, or is slower than the lease
	FaultStoreCut    Fault = "storecut"    // the path to the store (gateway: PostgreSQL) or to the idem server (apps) cut, then restored
	FaultFreeze      Fault = "freeze"      // the store frozen: the idem server stopped (apps), the gateway's SQLite write lock held
	FaultKill9       Fault = "kill9"       // the gateway (gateway) or the idem server (apps) killed with -9 and restarted
	FaultSettings    Fault = "settings"    // the tenant disabled, or its lease_seconds_max lowered under the lease, mid-flight, then restored
	FaultSquat       Fault = "squat"       // an unscoped caller sends "<scope>:<key>", another caller's scoped key
	FaultDupScope    Fault = "dupscope"    // the scope header sent twice (the caller's and "mallory")
	FaultHog         Fault = "hog"         // another tenant declares large bodies to the idem server and drips them
	FaultQuota       Fault = "quota"       // the tenant's storage quota set just above its usage, then many new keys at once
	// FaultListenerDown: requests sent with Prefer: wait while the idem
	// server's key-event subscriptions fail for a while (its LISTEN
	// connection reconnecting; apps only: the server is listenerserve).
	FaultListenerDown Fault = "listenerdown"
	// FaultBudget: the tenant's fleet retry budget spent (retry_budget_percent
	// 0, retries sent until the front door refuses one), then the
	// schedule's callers send some requests as retries (Idem-Attempt above
	// 1): the front door refuses them 429 retry_budget_exhausted, leaving
	// their keys as they were, and serves first attempts (docs/frontdoor.md
	// rule 9).
	FaultBudget Fault = "budget"
	// FaultReuse: once a key settled completed (its request replayed),
	// its caller sends another request with it (another pad): the answer
	// is 422 fingerprint_mismatch, never the first request's. Every front
	// door answers replays from its replay cache, which has to tell the
	// two apart (invariant 12).
	FaultReuse Fault = "reuse"
	// FaultFinishBudget: the tenant's fleet retry budget kept spent (its
	// retry_budget_percent 0 and the floor's retries sent to the idem
	// server over and over) while the path to the idem server is cut, then
	// restored: the front doors' completes that failed in the cut are
	// retried into a spent budget (apps only: the gateway claims in its
	// store, not through the API).
	FaultFinishBudget Fault = "finishbudget"
)

// AllFaults is every fault kind, the default set.
var AllFaults = []Fault{FaultDisconnect, FaultStream, FaultHandlerFail, FaultStoreCut, FaultFreeze, FaultKill9,
	FaultSettings, FaultSquat, FaultDupScope, FaultHog, FaultQuota, FaultListenerDown, FaultBudget, FaultReuse, FaultFinishBudget}

// KnownFailing lists, per front door, the fault kinds that find a hole of
// issue 21 still open on this branch (the hole's number in the value): the
// default run leaves them out until the fix merges; -faultcheck.faults=all
// runs them. Empty it as the fixes land. Nothing else is left out.
var KnownFailing = map[string]map[Fault]string{}

// OptIn lists the fault kinds the default run leaves out, and why: they
// change the rig for the whole run, so the default keeps driving the real
// binary. -faultcheck.faults=all or a list naming them runs them.
var OptIn = map[Fault]string{
	FaultListenerDown: "opt-in: the apps' idem server is then listenerserve, not the idem binary",
}

// quotaIdents is how many keys a quota schedule completes at once.
const quotaIdents = 24

// Op is one request of a schedule.
type Op struct {
	At         time.Duration // after the schedule's start
	Ident      int           // index into Schedule.Idents
	Disconnect string        // "", before_body, mid_body, mid_answer, mid_stream
	DropAfter  time.Duration // mid_answer: how long after the request the client goes away
	DupScope   bool          // send the scope header twice (the caller's, then "mallory")
	Wait       int           // listenerdown: send Prefer: wait=Wait
	Attempt    string        // budget: send Idem-Attempt: Attempt (a retry)
}

// Ident is one (scope, key) of a schedule with the one request its caller
// sends with it.
type Ident struct {
	Scope string // "" unscoped
	Key   string
	Route string // closed (fail closed) or open (gateway: fail_open)
	Mode  string // the handler's mode (PROTOCOL.md)
	Pad   string
	Squat bool // the key spells another caller's scoped key
}

// FaultAt is one fault of a schedule.
type FaultAt struct {
	At   time.Duration
	Kind Fault
	What string // storecut: ""; settings: disable or lease_max; kill9: ""
	For  time.Duration
}

// Schedule is one seeded schedule.
type Schedule struct {
	Seed   uint64
	Index  int
	Idents []Ident
	Ops    []Op
	Faults []FaultAt
	Hog    bool
	Quota  bool
	// Budget: the tenant's fleet retry budget is spent before the
	// schedule's requests (FaultBudget).
	Budget bool
	// Reuse are the idents whose key is sent once more after the settle
	// phase, with another request (FaultReuse).
	Reuse []int
}

// Env is what a front door offers the generator.
type Env struct {
	FrontDoor string
	Scoped    bool // the front door keys by a scope header
	FailOpen  bool // the gateway's fail_open route
	// UnscopedRoute: callers without a scope use the route "unscoped" (the
	// gateway's scoped routes refuse a request without the scope header).
	UnscopedRoute bool
	StoreCut      bool // a path to cut exists
	Freeze        bool // the store can be frozen
	ListenerDown  bool // the idem server's key-event subscriptions can be held down
	FinishBudget  bool // the idem server's retry budget is on the front door's path (apps)
	Lease         time.Duration
}

// Generate makes schedule index of seed with the enabled faults. The same
// (seed, index, faults, env) always gives the same schedule.
func Generate(seed uint64, index int, faults []Fault, env Env) Schedule {
	r := rand.New(rand.NewPCG(seed, uint64(index)))
	on := func(f Fault) bool { return slices.Contains(faults, f) }
	s := Schedule{Seed: seed, Index: index}
	scopes := []string{""}
	if env.Scoped {
		scopes = []string{"alice", "bob", ""}
	}
	modes := []string{"ok", "ok", "slow:150", "slow:400", "status:503"}
	if on(FaultStream) {
		modes = append(modes, "stream:4:60", "stream:6:40", "stream:3:120")
	}
	if on(FaultHandlerFail) {
		modes = append(modes, "raise", "status:500", "cutstream:4", fmt.Sprintf("slow:%d", (env.Lease+500*time.Millisecond).Milliseconds()))
	}
	nIdents := 3 + r.IntN(4)
	if on(FaultQuota) && r.IntN(3) == 0 {
		s.Quota = true
		// More keys than the store has connections: with every answer
		// stored the usage passes the documented overshoot (QuotaOvershoot),
		// so an unbounded complete shows.
		nIdents = quotaIdents
	}
	for i := range nIdents {
		id := Ident{
			Scope: scopes[r.IntN(len(scopes))],
			Key:   fmt.Sprintf("fc%d-%d-%d", seed, index, i),
			Route: "closed",
			Mode:  modes[r.IntN(len(modes))],
			Pad:   strings.Repeat("p", r.IntN(64)),
		}
		if env.FailOpen && r.IntN(2) == 0 {
			id.Route = "open"
		}
		if env.UnscopedRoute && id.Scope == "" {
			id.Route = "unscoped"
		}
		if s.Quota {
			id.Mode, id.Pad = "slow:300", strings.Repeat("q", 3000)
		}
		s.Idents = append(s.Idents, id)
	}
	// Squatters: an unscoped caller whose key spells a scoped caller's.
	if on(FaultSquat) && env.Scoped {
		for i, id := range s.Idents[:nIdents] {
			if id.Scope != "" && r.IntN(2) == 0 {
				s.Idents = append(s.Idents, Ident{Scope: "", Key: id.Scope + ":" + id.Key, Route: squatRoute(env, id.Route), Mode: "ok", Pad: "squat", Squat: true})
				// The squatter goes first half the time, the owner the other half.
				at := time.Duration(r.IntN(300)) * time.Millisecond
				s.Ops = append(s.Ops, Op{At: at, Ident: len(s.Idents) - 1}, Op{At: at + time.Duration(r.IntN(200)-100)*time.Millisecond, Ident: i})
			}
		}
	}
	disconnects := []string{""}
	if on(FaultDisconnect) {
		disconnects = append(disconnects, "before_body", "mid_body", "mid_answer")
	}
	if on(FaultStream) {
		disconnects = append(disconnects, "mid_stream", "mid_answer")
	}
	for i, id := range s.Idents {
		if id.Squat {
			continue
		}
		n := 2 + r.IntN(3)
		if s.Quota {
			// each key once or twice: about the burst of a quota
			// schedule when it had 10 keys (36 requests on average, 30
			// then), within the tenant's shares of the server's
			// in-flight budget and of the store's pool
			n = 1 + r.IntN(2)
		}
		for range n {
			op := Op{At: time.Duration(r.IntN(900)) * time.Millisecond, Ident: i}
			if r.IntN(3) == 0 {
				op.At = time.Duration(r.IntN(30)) * time.Millisecond // a burst of concurrent duplicates
			}
			if s.Quota {
				op.At = time.Duration(r.IntN(20)) * time.Millisecond
			} else if r.IntN(2) == 0 {
				op.Disconnect = disconnects[r.IntN(len(disconnects))]
				if op.Disconnect == "mid_answer" {
					op.DropAfter = time.Duration(20+r.IntN(300)) * time.Millisecond
				}
			}
			s.Ops = append(s.Ops, op)
		}
		if on(FaultDupScope) && env.Scoped && id.Scope != "" && r.IntN(2) == 0 {
			s.Ops = append(s.Ops, Op{At: time.Duration(r.IntN(900)) * time.Millisecond, Ident: i, DupScope: true})
		}
	}
	if !s.Quota {
		if on(FaultStoreCut) && env.StoreCut && r.IntN(2) == 0 {
			s.Faults = append(s.Faults, FaultAt{At: time.Duration(r.IntN(700)) * time.Millisecond, Kind: FaultStoreCut, For: time.Duration(100+r.IntN(600)) * time.Millisecond})
		}
		if on(FaultFreeze) && env.Freeze && r.IntN(3) == 0 {
			s.Faults = append(s.Faults, FaultAt{At: time.Duration(r.IntN(700)) * time.Millisecond, Kind: FaultFreeze, For: time.Duration(200+r.IntN(1300)) * time.Millisecond})
		}
		if on(FaultKill9) && r.IntN(3) == 0 {
			s.Faults = append(s.Faults, FaultAt{At: time.Duration(r.IntN(800)) * time.Millisecond, Kind: FaultKill9})
		}
		if on(FaultSettings) && r.IntN(2) == 0 {
			what := []string{"disable", "lease_max"}[r.IntN(2)]
			s.Faults = append(s.Faults, FaultAt{At: time.Duration(r.IntN(300)) * time.Millisecond, Kind: FaultSettings, What: what, For: time.Duration(400+r.IntN(600)) * time.Millisecond})
		}
		// The gateway reaches its store directly: the idem server's budget
		// is not on its path.
		s.Hog = on(FaultHog) && env.FrontDoor != "gateway" && r.IntN(2) == 0
	}
	// Drawn last, so that the schedules of the other kinds stay as they were.
	if on(FaultListenerDown) && env.ListenerDown && !s.Quota {
		for i := range s.Ops {
			if r.IntN(3) != 0 && !s.Ops[i].DupScope {
				s.Ops[i].Wait = 5
			}
		}
		s.Faults = append(s.Faults, FaultAt{At: time.Duration(r.IntN(400)) * time.Millisecond, Kind: FaultListenerDown, For: time.Duration(1200+r.IntN(800)) * time.Millisecond})
	}
	// Drawn after the others, so that the schedules without it stay as
	// they were. Every second schedule has it, so a default run (two
	// schedules per front door and store) always spends the budget once.
	if on(FaultBudget) && (index%2 == 1 || r.IntN(3) == 0) {
		s.Budget = true
		retries := []string{"2;cause=timeout", "3;cause=unavailable", "2;cause=network"}
		for i := range s.Ops {
			// The first key's caller only ever retries: its key must stay
			// unknown until the settle's first attempt runs it.
			if !s.Ops[i].DupScope && (s.Ops[i].Ident == 0 || r.IntN(2) == 0) {
				s.Ops[i].Attempt = retries[r.IntN(len(retries))]
			}
		}
	}
	// Drawn after the budget, for the same reason.
	if on(FaultReuse) && !s.Quota {
		for i, id := range s.Idents {
			if !id.Squat && r.IntN(2) == 0 {
				s.Reuse = append(s.Reuse, i)
			}
		}
	}
	// Drawn after reuse, for the same reason.
	if on(FaultFinishBudget) && env.FinishBudget && env.StoreCut && !s.Quota && r.IntN(3) == 0 {
		// The cut is short and timed for a complete: when a slow
		// handler of the schedule finishes. A complete that fails in it
		// is retried after it (the SDKs wait up to a second before their
		// first retry), into the spent budget; a longer cut could use up
		// the complete's attempts themselves, which is no budget's doing.
		f := FaultAt{At: time.Duration(r.IntN(500)) * time.Millisecond, Kind: FaultFinishBudget, For: 60 * time.Millisecond}
		var slow []Op
		for _, op := range s.Ops {
			if m := s.Idents[op.Ident].Mode; (m == "slow:150" || m == "slow:400") && op.Disconnect == "" && !op.DupScope {
				slow = append(slow, op)
			}
		}
		if len(slow) > 0 {
			op := slow[r.IntN(len(slow))]
			var ms int
			_, _ = fmt.Sscanf(s.Idents[op.Ident].Mode, "slow:%d", &ms)
			f.At = op.At + time.Duration(ms)*time.Millisecond
		}
		s.Faults = append(s.Faults, f)
	}
	slices.SortStableFunc(s.Ops, func(a, b Op) int { return int(a.At - b.At) })
	return s
}

// String prints the schedule, one line per op and fault, as the failure
// report shows it.
func (s Schedule) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "schedule %d of seed %d", s.Index, s.Seed)
	if s.Hog {
		b.WriteString(" [hog: another tenant drips large bodies to the idem server throughout]")
	}
	if s.Quota {
		b.WriteString(" [quota: storage quota set just above the usage, max_response_bytes 4096]")
	}
	if s.Budget {
		b.WriteString(" [budget: retry_budget_percent 0 and the fleet retry budget spent before the requests]")
	}
	b.WriteString("\n")
	for i, id := range s.Idents {
		fmt.Fprintf(&b, "  key %d: scope=%q key=%q route=%s mode=%s pad=%dB", i, id.Scope, id.Key, id.Route, id.Mode, len(id.Pad))
		if id.Squat {
			b.WriteString(" (squats another caller's scoped key)")
		}
		b.WriteString("\n")
	}
	for _, i := range s.Reuse {
		fmt.Fprintf(&b, "  after settling: key %d replayed, then sent with another request (pad %q)\n", i, s.Idents[i].reusePad())
	}
	for _, f := range s.Faults {
		fmt.Fprintf(&b, "  +%-6s fault %s %s for %s\n", f.At.Round(time.Millisecond), f.Kind, f.What, f.For)
	}
	for _, o := range s.Ops {
		fmt.Fprintf(&b, "  +%-6s send key %d", o.At.Round(time.Millisecond), o.Ident)
		if o.Disconnect != "" {
			fmt.Fprintf(&b, " then disconnect %s", o.Disconnect)
			if o.DropAfter > 0 {
				fmt.Fprintf(&b, " after %s", o.DropAfter)
			}
		}
		if o.DupScope {
			b.WriteString(" with the scope header twice (caller's, then mallory)")
		}
		if o.Wait > 0 {
			fmt.Fprintf(&b, " with Prefer: wait=%d", o.Wait)
		}
		if o.Attempt != "" {
			fmt.Fprintf(&b, " as a retry (Idem-Attempt: %s)", o.Attempt)
		}
		b.WriteString("\n")
	}
	return b.String()
}

func squatRoute(env Env, route string) string {
	if env.UnscopedRoute {
		return "unscoped"
	}
	return route
}
