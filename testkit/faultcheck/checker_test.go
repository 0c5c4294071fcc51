package faultcheck

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestQuotaBoundIsTheDocumentedOne: quota-bounds-storage allows what
// openapi.yaml promises for storage_quota_bytes (one answer per store
// connection writing at once, and each key's few bytes), and still finds a
// quota that bounds nothing (hole 4: every answer of the schedule stored).
func TestQuotaBoundIsTheDocumentedOne(t *testing.T) {
	var s Schedule
	for i := 0; ; i++ {
		if s = Generate(1, i, []Fault{FaultQuota}, Env{FrontDoor: "gateway", Scoped: true, Lease: Lease}); s.Quota {
			break
		}
	}
	var answer, claims int64
	for _, id := range s.Idents {
		b, _ := json.Marshal(runBody{Run: "go12345-67", Req: id.Key, Scope: id.Scope, Pad: id.Pad})
		answer = max(answer, int64(len(b)))
		claims += int64(len(id.Key) + 100)
	}
	const quota = 8192
	check := func(used int64, writers int) []Violation {
		h := &History{Quota: quota, QuotaUsed: used, QuotaWriters: writers}
		return Check(s, h, nil, nil).Violations
	}
	// PostgreSQL: every connection of the pool completed at the edge, each
	// seeing the usage before the others' answers
	racing := quota + int64(poolConns)*answer + int64(len(s.Idents))*100
	if v := check(racing, poolConns); len(v) != 0 {
		t.Errorf("%d racing completes on %d connections, within the documented bound, reported: %v", poolConns, poolConns, v)
	}
	// a quota that bounds nothing: every answer stored
	all := claims + int64(len(s.Idents))*(answer+200)
	if all <= racing {
		t.Fatalf("the quota schedule has too few keys (%d) to tell an unbounded quota (%d bytes) from racing completes (%d)", len(s.Idents), all, racing)
	}
	if v := check(all, poolConns); len(v) != 1 || v[0].Invariant != "quota-bounds-storage" {
		t.Errorf("every answer stored (%d bytes on a quota of %d) not reported: %v", all, quota, v)
	}
	// SQLite's single writer: one answer at the edge, not a pool's worth
	if v := check(quota+4*answer, 1); len(v) != 1 {
		t.Errorf("four answers over on a single writer not reported: %v", v)
	}
}

// TestRefusalAfterTheScheduleBeforesFault: a 503 store_unavailable at the
// start of a schedule that began right after the schedule before restored
// its store cut is the tenant's own fault (the pool still held the
// connections the cut closed; the seed 3082651004 gateway/PostgreSQL
// report); one that no fault of either schedule came near is still
// reported.
func TestRefusalAfterTheScheduleBeforesFault(t *testing.T) {
	t0 := time.Now()
	s := Schedule{Idents: []Ident{{Key: "k", Route: "unscoped", Mode: "ok"}}}
	refused := func(at time.Time) *Sent {
		return &Sent{Op: 0, Ident: identOf("", "k"), Key: "k", Start: at, End: at.Add(time.Millisecond), Status: 503, Complete: true,
			Header: http.Header{"Content-Type": {"application/problem+json"}},
			Resp:   []byte(`{"type":"urn:idem:problem:store_unavailable","title":"Idempotency store unavailable","status":503,"code":"store_unavailable","retryable":true}`)}
	}
	cut := &Injected{Kind: FaultStoreCut, What: "path to the store cut", Start: t0.Add(-400 * time.Millisecond), End: t0.Add(-14 * time.Millisecond)}
	v := Check(s, &History{Sent: []*Sent{refused(t0)}, Before: []*Injected{cut}}, nil, nil).Violations
	if len(v) != 0 {
		t.Errorf("a 503 14ms after the schedule before restored its cut reported: %v", v)
	}
	v = Check(s, &History{Sent: []*Sent{refused(t0)}}, nil, nil).Violations
	if len(v) != 1 || v[0].Invariant != "no-refusal-without-fault" {
		t.Errorf("a 503 without any fault not reported: %v", v)
	}
	v = Check(s, &History{Sent: []*Sent{refused(t0.Add(5 * time.Second))}, Before: []*Injected{cut}}, nil, nil).Violations
	if len(v) != 1 || v[0].Invariant != "no-refusal-without-fault" {
		t.Errorf("a 503 5s after the schedule before's cut not reported: %v", v)
	}
}

// TestBudgetInvariantsCanFail: a budget schedule (every second one) finds a
// front door that never refuses a retry, a refusal without its signal, a
// first attempt refused, and a run of a key whose every request was
// refused; and passes the history of a front door that does it right.
func TestBudgetInvariantsCanFail(t *testing.T) {
	s := Generate(7, 1, []Fault{FaultBudget}, Env{FrontDoor: "express", Scoped: true, Lease: Lease})
	if !s.Budget {
		t.Fatal("schedule 1 has no budget")
	}
	id := s.Idents[0]
	ident := identOf(id.Scope, id.Key)
	t0 := time.Now()
	refusal := func(attempt string, signal bool) *Sent {
		h := http.Header{"Content-Type": {"application/problem+json"}, "Retry-After": {"3"}}
		if signal {
			h.Set("Idem-Retry-Budget", "exhausted")
		}
		return &Sent{Ident: ident, Scope: id.Scope, Key: id.Key, Attempt: attempt, Start: t0, End: t0.Add(time.Millisecond), Complete: true,
			Status: http.StatusTooManyRequests, Header: h,
			Resp: []byte(`{"type":"urn:idem:problem:retry_budget_exhausted","title":"Retry budget exhausted","status":429,"code":"retry_budget_exhausted","retryable":true}`)}
	}
	settle := &Sent{Ident: ident, Scope: id.Scope, Key: id.Key, Settle: true, Start: t0.Add(time.Second), End: t0.Add(time.Second)}
	problems := map[string]Problem{"retry_budget_exhausted": {Code: "retry_budget_exhausted", Status: 429, Retryable: true}}
	names := func(h *History, runs []*Run) map[string]bool {
		out := map[string]bool{}
		for _, v := range Check(s, h, runs, problems).Violations {
			out[v.Invariant] = true
		}
		return out
	}
	good := &History{BudgetSpent: true, Sent: []*Sent{refusal("2;cause=timeout", true), settle}}
	afterSettle := []*Run{{Start: Event{Run: "r1", Key: id.Key, Scope: id.Scope, T: t0.Add(2 * time.Second).UnixMilli()}}}
	if v := names(good, afterSettle); len(v) != 0 {
		t.Errorf("a front door that refuses and leaves the key: %v", v)
	}
	if v := names(&History{Sent: good.Sent}, afterSettle); !v["budget-spent"] {
		t.Errorf("a front door that never refuses a retry: %v", v)
	}
	if v := names(&History{BudgetSpent: true, Sent: []*Sent{refusal("", false), settle}}, afterSettle); !v["first-attempt-served"] || !v["budget-refusal-signals"] {
		t.Errorf("a first attempt refused without the signal: %v", v)
	}
	before := []*Run{{Start: Event{Run: "r0", Key: id.Key, Scope: id.Scope, T: t0.UnixMilli()}}}
	if v := names(good, before); !v["refused-leaves-key"] {
		t.Errorf("a run of a key whose every request was refused: %v", v)
	}
}

// TestLeaseOfAHeldClaim: a run whose claim was made while lease_max was
// lowered holds the lowered 1 s lease even when the server held the claim
// past the fault's end (Prefer: wait) and granted it then: a takeover a
// second after it is legal (the seed 20261202 express/postgres report). A
// run as soon after one claimed under the full lease, or sooner than the
// lowered lease allows, is still reported.
func TestLeaseOfAHeldClaim(t *testing.T) {
	t0 := time.Now().Truncate(time.Millisecond)
	s := Schedule{Idents: []Ident{{Scope: "bob", Key: "k", Route: "closed", Mode: "cutstream:4"}}}
	id := identOf("bob", "k")
	lowered := &Injected{Kind: FaultSettings, What: whatLeaseMax, Start: t0, End: t0.Add(800 * time.Millisecond)}
	run := func(name string, at time.Duration) *Run {
		return &Run{Start: Event{Run: name, Key: "k", Scope: "bob", T: t0.Add(at).UnixMilli()}, Abort: &Event{Run: name, Why: "cutstream"}}
	}
	// held: sent at sentAt with Prefer: wait, answered at endAt
	held := func(sentAt, endAt time.Duration) *Sent {
		return &Sent{Ident: id, Scope: "bob", Key: "k", Wait: 5, Start: t0.Add(sentAt), End: t0.Add(endAt), Status: 500, Complete: true,
			Header: http.Header{"Content-Type": {"text/plain"}}, Resp: []byte("Internal Server Error")}
	}
	lease := func(runs []*Run, sent ...*Sent) []Violation {
		var out []Violation
		for _, v := range Check(s, &History{Sent: sent, Faults: []*Injected{lowered}}, runs, nil).Violations {
			if v.Invariant == "one-run-per-lease" {
				out = append(out, v)
			}
		}
		return out
	}
	// r1 claimed in the fault (1 s); r2 and r3 by claims made in the fault,
	// held past its end, granted a second after the one before
	runs := []*Run{run("r1", 600*time.Millisecond), run("r2", 1970*time.Millisecond), run("r3", 2990*time.Millisecond)}
	if v := lease(runs, held(205*time.Millisecond, 3100*time.Millisecond), held(755*time.Millisecond, 2100*time.Millisecond)); len(v) != 0 {
		t.Errorf("takeovers by claims made under the lowered lease and held past the fault reported: %v", v)
	}
	// the same runs, r2's request sent after the fault: r2's claim was
	// made under the full lease, and r3 ran 1.02 s after r2
	if v := lease(runs, held(1950*time.Millisecond, 3100*time.Millisecond)); len(v) != 1 || !strings.Contains(v[0].Detail, "run r3") {
		t.Errorf("a run 1.02 s after one claimed under the full lease not reported once: %v", v)
	}
	// a request answered before the run started did not claim for it
	if v := lease(runs, held(205*time.Millisecond, 1900*time.Millisecond), held(1950*time.Millisecond, 3100*time.Millisecond)); len(v) != 1 {
		t.Errorf("a request answered before the run counted as its claim: %v", v)
	}
	// under the lowered lease a run 300 ms after another is still a hole
	sent := func(at, end time.Duration) *Sent {
		return &Sent{Ident: id, Scope: "bob", Key: "k", Start: t0.Add(at), End: t0.Add(end), Status: 500, Complete: true,
			Header: http.Header{"Content-Type": {"text/plain"}}, Resp: []byte("Internal Server Error")}
	}
	fast := []*Run{run("r1", 300*time.Millisecond), run("r2", 1500*time.Millisecond), run("r3", 1800*time.Millisecond)}
	if v := lease(fast, sent(290*time.Millisecond, time.Second), sent(1490*time.Millisecond, 2100*time.Millisecond), sent(1790*time.Millisecond, 2400*time.Millisecond)); len(v) != 1 || !strings.Contains(v[0].Detail, "run r3") {
		t.Errorf("a run 300 ms after another claimed under the lowered lease not reported: %v", v)
	}
}

// TestLeaseFromTheClaim: invariant 1 counts a lease from the earliest its
// run's claim can have been made, not from the run's start, which a busy
// app logs late: a run that started 1.03 s after a raised one whose
// handler started a second after its request is legal (seed 20261203,
// asgi/postgres, schedule 26: idem held the second claim until the first
// lease ended). Runs milliseconds apart are still reported, and so is a
// run early after one whose own answer names the request that claimed
// for it, however long another request of the key was held open.
func TestLeaseFromTheClaim(t *testing.T) {
	t0 := time.Now().Truncate(time.Millisecond)
	s := Schedule{Idents: []Ident{{Scope: "bob", Key: "k", Route: "closed", Mode: "raise"}}}
	id := identOf("bob", "k")
	run := func(name string, at time.Duration) *Run {
		return &Run{Start: Event{Run: name, Key: "k", Scope: "bob", T: t0.Add(at).UnixMilli()}, Abort: &Event{Run: name, Why: "raise"}}
	}
	req := func(at, end time.Duration, wait int) *Sent {
		return &Sent{Ident: id, Scope: "bob", Key: "k", Wait: wait, Start: t0.Add(at), End: t0.Add(end), Status: 500, Complete: true,
			Header: http.Header{"Content-Type": {"text/plain"}}, Resp: []byte("Internal Server Error")}
	}
	own := func(at, end time.Duration, r string) *Sent {
		return &Sent{Ident: id, Scope: "bob", Key: "k", Start: t0.Add(at), End: t0.Add(end), Status: 200, Complete: true,
			Header: http.Header{"Content-Type": {"application/json"}}, Resp: []byte(`{"run":"` + r + `","req":"k","scope":"bob","pad":""}`)}
	}
	early := func(runs []*Run, sent ...*Sent) []Violation {
		var out []Violation
		for _, v := range Check(s, &History{Sent: sent}, runs, nil).Violations {
			if v.Invariant == "one-run-per-lease" {
				out = append(out, v)
			}
		}
		return out
	}
	// the report's shape: requests sent at +11 ms (held) and +174 ms; the
	// first run's handler started 2.8 s later, the second 1.03 s after it
	late := []*Run{run("r1", 2830*time.Millisecond), run("r2", 3859*time.Millisecond)}
	if v := early(late, req(11*time.Millisecond, 5*time.Second, 5), req(174*time.Millisecond, 5*time.Second, 5)); len(v) != 0 {
		t.Errorf("a run a lease after the first one's request, started late, reported: %v", v)
	}
	// two runs of requests sent together, milliseconds apart
	together := []*Run{run("r1", 20*time.Millisecond), run("r2", 45*time.Millisecond)}
	if v := early(together, req(0, 3*time.Second, 0), req(5*time.Millisecond, 3*time.Second, 0)); len(v) != 1 || !strings.Contains(v[0].Detail, "run r2") {
		t.Errorf("two runs 25 ms apart not reported once: %v", v)
	}
	// r1 answered its own request, sent at +1 s; another request of the
	// key held open from +0 does not move r1's claim earlier
	named := []*Run{run("r1", 1010*time.Millisecond), run("r2", 1900*time.Millisecond)}
	if v := early(named, req(0, 5*time.Second, 5), own(time.Second, 1200*time.Millisecond, "r1")); len(v) != 1 || !strings.Contains(v[0].Detail, "run r2") {
		t.Errorf("a run 0.9 s after the claim of a run that answered its own request not reported: %v", v)
	}
}

// TestSettledAtAFinalAnswer: the settle phase stops at a key's outcome,
// 409 response_not_replayable included (a quota schedule's keys completed
// without their response), and goes on while the key is in flight or the
// store is not back.
func TestSettledAtAFinalAnswer(t *testing.T) {
	problem := func(status int, code string) *Sent {
		return &Sent{Status: status, Complete: true, Resp: []byte(`{"type":"urn:idem:problem:` + code + `","status":` + strconv.Itoa(status) + `,"code":"` + code + `"}`)}
	}
	for _, c := range []struct {
		snt  *Sent
		mode string
		want bool
	}{
		{problem(409, "response_not_replayable"), "slow:300", true},
		{problem(409, "request_in_flight"), "slow:300", false},
		{problem(503, "store_unavailable"), "ok", false},
		{&Sent{Status: 503, Complete: true, Resp: []byte(`{"run":"r1","req":"k","scope":"","pad":""}`)}, "status:503", true},
		{&Sent{Status: 201, Complete: true, Resp: []byte(`{"run":"r1","req":"k","scope":"","pad":""}`)}, "ok", true},
		{&Sent{Status: 200}, "cutstream:4", true},
		{&Sent{}, "ok", false},
	} {
		if got := settled(c.snt, c.mode); got != c.want {
			t.Errorf("settled(%d %s, %s) = %v, want %v", c.snt.Status, c.snt.Resp, c.mode, got, c.want)
		}
	}
}
