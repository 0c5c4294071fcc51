package faultcheck

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"mime"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"
)

// Problem is one documented problem code (testvectors/frontdoor/policy.json).
type Problem struct {
	Code      string `json:"code"`
	Status    int    `json:"status"`
	Retryable bool   `json:"retryable"`
	Type      string `json:"type"`
}

// LoadProblems reads the documented problems of every front door.
func LoadProblems(root string) (map[string]Problem, error) {
	b, err := os.ReadFile(filepath.Join(root, "testvectors", "frontdoor", "policy.json"))
	if err != nil {
		return nil, err
	}
	var p struct {
		Problems []Problem `json:"problems"`
	}
	if err := json.Unmarshal(b, &p); err != nil {
		return nil, err
	}
	out := map[string]Problem{}
	for _, pr := range p.Problems {
		out[pr.Code] = pr
	}
	return out, nil
}

// Violation is one broken invariant.
type Violation struct {
	Invariant string // one-word name
	Hole      string // the issue-21 hole this invariant's breach is known as, if any
	Detail    string
}

func (v Violation) String() string {
	s := v.Invariant + ": " + v.Detail
	if v.Hole != "" {
		s += " [" + v.Hole + "]"
	}
	return s
}

// Report is the checker's verdict on one schedule.
type Report struct {
	Violations []Violation
	Takeovers  []string // every extra run, named, that was legal
	Runs       int
	Requests   int
}

// slack is how much earlier than a full lease after the first run's claim
// (claimFloor) a takeover may start: the app's log, the checker and the
// store read different clocks of one machine, each late on a loaded one.
// Holes show as runs milliseconds apart, so a quarter of the lease is kept.
const slack = Lease / 4

// reqPad is the pad of a request body (PROTOCOL.md).
func reqPad(body []byte) string {
	var b struct {
		Pad string `json:"pad"`
	}
	_ = json.Unmarshal(body, &b)
	return b.Pad
}

// Check checks the invariants over the history and the runs the app logged
// for the schedule.
func Check(s Schedule, h *History, runs []*Run, problems map[string]Problem) Report {
	rep := Report{Runs: len(runs), Requests: len(h.Sent)}
	routes := map[string]string{}
	squatted := map[string]bool{} // idents in a squat, either side
	for _, id := range s.Idents {
		routes[identOf(id.Scope, id.Key)] = id.Route
		if id.Squat {
			squatted[identOf(id.Scope, id.Key)] = true
			owner, key, _ := strings.Cut(id.Key, ":")
			squatted[identOf(owner, key)] = true
		}
	}
	add := func(inv, hole, f string, a ...any) {
		rep.Violations = append(rep.Violations, Violation{Invariant: inv, Hole: hole, Detail: fmt.Sprintf(f, a...)})
	}
	byRun := map[string]*Run{}
	byIdent := map[string][]*Run{}
	for _, r := range runs {
		byRun[r.Start.Run] = r
		id := identOf(r.Start.Scope, r.Start.Key)
		byIdent[id] = append(byIdent[id], r)
	}
	sent := append([]*Sent(nil), h.Sent...)
	cutBody := map[string]bool{} // idents with a request cut before its whole body
	for _, x := range sent {
		if x.Disconnect == "before_body" || x.Disconnect == "mid_body" {
			cutBody[x.Ident] = true
		}
	}
	sort.SliceStable(sent, func(i, j int) bool { return sent[i].Start.Before(sent[j].Start) })

	// 1. At most one run while a lease holds; every extra run is a
	// takeover after a lease ended, named.
	idents := make([]string, 0, len(byIdent))
	for id := range byIdent {
		idents = append(idents, id)
	}
	sort.Strings(idents)
	for _, id := range idents {
		rs := byIdent[id]
		for i := 1; i < len(rs); i++ {
			a, b := rs[i-1], rs[i]
			gap := time.Duration(b.Start.T-a.Start.T) * time.Millisecond
			sinceClaim := time.UnixMilli(b.Start.T).Sub(claimFloor(sent, id, a))
			lease := leaseOf(h, sent, id, a)
			if sinceClaim < lease-slack && routes[id] == "open" {
				if f := h.overlaps(time.UnixMilli(b.Start.T).Add(-faultAfterglow), time.UnixMilli(b.Start.T), FaultStoreCut, FaultFreeze); f != nil {
					rep.Takeovers = append(rep.Takeovers, fmt.Sprintf("key %s: run %s started %s after run %s unprotected: the route is fail_open and the store was cut or frozen (documented)",
						showIdent(id), b.Start.Run, gap, a.Start.Run))
					continue
				}
			}
			if sinceClaim < lease-slack {
				hole := ""
				if f := h.overlaps(time.UnixMilli(a.Start.T), time.UnixMilli(b.Start.T), FaultSettings); f != nil {
					hole = "issue 21 hole 2 (during: " + f.What + ")"
				}
				add("one-run-per-lease", hole, "key %s: run %s started %s after run %s (%s), %s after the first request that may have claimed for it was sent, while its lease of %s held",
					showIdent(id), b.Start.Run, gap, a.Start.Run, outcome(a), sinceClaim, lease)
				continue
			}
			if a.End != nil && a.End.Status < 500 && h.overlaps(time.UnixMilli(a.Start.T), time.UnixMilli(b.Start.T), FaultFinishBudget) != nil &&
				h.overlaps(time.UnixMilli(a.Start.T), time.UnixMilli(b.Start.T), FaultStoreCut, FaultFreeze, FaultKill9) == nil {
				// The run finished and the path to idem came back within
				// the complete's retries: only a complete given up to the
				// spent fleet budget leaves its key to be run again. A
				// longer cut, a freeze or a kill of idem in the same span
				// can use up the complete's own attempts: a legal takeover
				// (a frozen idem serve cost seed 1697375651 a record so).
				// A complete given up to the SDK's own per-process retry
				// budget, emptied by the faults of the schedule before, is
				// the same loss and reported the same (seed 20261202,
				// asgi and wsgi on SQLite, schedule 12: give_up=budget).
				add("finished-work-recorded", "", "key %s: run %s ran again %s after run %s (%s), whose complete was given up while the tenant's retry budget was spent (a finishing write given up to a retry budget: the tenant's fleet budget, or the SDK's per-process one)",
					showIdent(id), b.Start.Run, gap, a.Start.Run, outcome(a))
				continue
			}
			rep.Takeovers = append(rep.Takeovers, fmt.Sprintf("key %s: run %s took over %s after run %s (%s): its lease had ended",
				showIdent(id), b.Start.Run, gap, a.Start.Run, outcome(a)))
		}
	}

	for _, x := range sent {
		if x.Status == 0 {
			continue
		}
		rb, isRun := parseRunBody(x.Resp)
		// 11. Another request with a completed key is refused, never
		// answered the first request's answer (a replay cache that does
		// not match the fingerprint exactly).
		if x.Reuse {
			switch {
			case !x.Complete:
			case isRun:
				add("no-replay-to-another-request", "", "key %s: a different request (pad %dB) with the completed key got the answer of run %s (pad %dB, status %d, replayed=%v), not 422 fingerprint_mismatch",
					showIdent(x.Ident), len(reqPad(x.Body)), rb.Run, len(rb.Pad), x.Status, x.Replayed())
			case x.Status != http.StatusUnprocessableEntity || problemCode(x.Resp) != "fingerprint_mismatch":
				add("no-replay-to-another-request", "", "key %s: a different request with the completed key got %d %s, not 422 fingerprint_mismatch",
					showIdent(x.Ident), x.Status, clip(x.Resp))
			}
			continue
		}
		// 2. The scope of an answer is the caller's own.
		if strings.HasPrefix(x.Ident, "\x01ambiguous") {
			if x.Status < 400 {
				add("ambiguous-scope-refused", "issue 21 hole 6", "a request with the scope header twice (%q) was accepted: %d, body %s",
					x.Headers, x.Status, clip(x.Resp))
			}
			continue
		}
		if isRun && rb.Scope != x.Scope {
			add("no-cross-scope-answer", "issue 21 hole 5", "caller %q with key %q got an answer of scope %q (run %s, replayed=%v)",
				x.Scope, x.Key, rb.Scope, rb.Run, x.Replayed())
		}
		if !x.Complete {
			continue
		}
		// 3. Every replay, and every first answer, is byte-identical to
		// the full answer of a run that finished.
		if isRun || x.Replayed() {
			r := byRun[rb.Run]
			sum := sha256.Sum256(x.Resp)
			switch {
			case !isRun && storedProblem[problemCode(x.Resp)]:
				// The gateway stores its own 502/504 for an upstream that
				// may have acted (documented); valid-problem checks it.
			case !isRun:
				add("replay-is-a-finished-answer", "issue 21 hole 1", "key %s: a replay (status %d) is not the full answer of any run (cut short?): %s", showIdent(x.Ident), x.Status, clip(x.Resp))
			case r == nil:
				add("replay-is-a-finished-answer", "", "key %s: answer names run %s, which the app never logged", showIdent(x.Ident), rb.Run)
			case r.End == nil:
				add("replay-is-a-finished-answer", "issue 21 hole 1", "key %s: %s answer (status %d, %d bytes) of run %s, which never finished (%s)",
					showIdent(x.Ident), replayWord(x), x.Status, len(x.Resp), rb.Run, outcome(r))
			case hex.EncodeToString(sum[:]) != r.End.BodySHA256 || x.Status != r.End.Status:
				add("replay-is-a-finished-answer", "issue 21 hole 1", "key %s: %s answer (status %d, %d bytes) differs from the full answer of run %s (status %d, %d bytes): %s",
					showIdent(x.Ident), replayWord(x), x.Status, len(x.Resp), rb.Run, r.End.Status, r.End.Len, clip(x.Resp))
			}
		}
		// 4. A caller that only ever sent one request with its key is never
		// told it sent another.
		if x.Status == http.StatusUnprocessableEntity && problemCode(x.Resp) == "fingerprint_mismatch" {
			why, hole := "another caller's record has its key", "issue 21 hole 5"
			if !squatted[x.Ident] {
				why, hole = "no other caller spells its key", ""
				if cutBody[x.Ident] {
					why += "; a request of this key was cut before its whole body arrived: was it claimed with the part that came?"
				}
			}
			add("no-foreign-mismatch", hole, "caller %q with key %q got 422 fingerprint_mismatch though it only ever sent one request with it: %s",
				x.Scope, x.Key, why)
		}
		// 5. Every refusal is valid problem+json with the documented retryable.
		if x.Status >= 400 && !isRun {
			if msg := checkProblem(x, problems); msg != "" {
				add("valid-problem", "", "key %s: %d answer: %s", showIdent(x.Ident), x.Status, msg)
			}
		}
		// 6. A tenant with no fault of its own is never refused as busy.
		if x.Status == http.StatusServiceUnavailable && !isRun &&
			h.overlaps(x.Start.Add(-faultAfterglow), x.End, FaultStoreCut, FaultFreeze, FaultKill9, FaultSettings, FaultFinishBudget) == nil {
			hole := ""
			if h.overlaps(x.Start, x.End, FaultHog) != nil {
				hole = "issue 21 hole 3"
			}
			add("no-refusal-without-fault", hole, "key %s: 503 %s while no fault of its own ran (only: %s)", showIdent(x.Ident), problemCode(x.Resp), faultsDuring(h, x))
		}
	}

	// 7. Nothing acknowledged is lost: a complete answer of a finished run
	// that no fault could have kept from being stored is what the key
	// answers after the faults.
	final := map[string]*Sent{}
	for _, x := range sent {
		if x.Settle {
			final[x.Ident] = x
		}
	}
	for _, x := range sent {
		if x.Settle || !x.Complete || strings.HasPrefix(x.Ident, "\x01ambiguous") {
			continue
		}
		rb, ok := parseRunBody(x.Resp)
		if !ok || byRun[rb.Run] == nil || byRun[rb.Run].End == nil || rb.Scope != x.Scope {
			continue
		}
		if h.overlaps(x.Start.Add(-faultAfterglow), x.End.Add(time.Second), FaultStoreCut, FaultFreeze, FaultKill9, FaultFinishBudget) != nil {
			// The answer may have been sent without being stored: a complete
			// that failed, or a fail_open route's unprotected pass while the
			// store's connections came back (documented).
			continue
		}
		f := final[x.Ident]
		if f == nil || !f.Complete {
			add("acknowledged-not-lost", "", "key %s: acknowledged answer of run %s, but the key gave no answer after the faults", showIdent(x.Ident), rb.Run)
			continue
		}
		frb, _ := parseRunBody(f.Resp)
		if h.Quota > 0 && f.Status == http.StatusConflict && problemCode(f.Resp) == "response_not_replayable" {
			// Under the storage quota a complete without room stores the key
			// as not replayable (docs/frontdoor.md rule 5): the answer went
			// out unstored, and the retry is told so instead of running it
			// again (invariant 1 checks it did not run again).
			continue
		}
		if f.Status != x.Status || string(f.Resp) != string(x.Resp) {
			add("acknowledged-not-lost", "", "key %s: acknowledged answer of run %s (status %d), but after the faults the key answers %d from run %q: %s",
				showIdent(x.Ident), rb.Run, x.Status, f.Status, frb.Run, clip(f.Resp))
		}
	}

	// 8. The storage quota bounds storage, by what openapi.yaml's
	// storage_quota_bytes lets writes racing at the edge store.
	if over := QuotaOvershoot(s, h.QuotaWriters); h.Quota > 0 && h.QuotaUsed > h.Quota+over {
		add("quota-bounds-storage", "issue 21 hole 4", "the tenant stores %d bytes under a storage quota of %d (allowed overshoot %d: one answer per store connection writing at once, %d, and the few bytes of each of the %d keys)",
			h.QuotaUsed, h.Quota, over, h.QuotaWriters, len(s.Idents))
	}

	// 9. A request that asked to wait (Prefer: wait) is not answered the
	// 409 request_in_flight of a claim made before its key was completed:
	// openapi.yaml (claimKey) — a held claim answers the replay as soon as
	// the holder completes, and one that cannot be held answers what a
	// claim then finds, never an older 409. A replay received proves the
	// key completed by then; a 409 received more than staleAfter later
	// came from a claim before the completion (a claim after it replays)
	// that was then held back. Freezes and cuts delay answers: skipped.
	replayed := map[string]time.Time{}
	for _, x := range sent {
		if x.Complete && x.Replayed() {
			if t, ok := replayed[x.Ident]; !ok || x.End.Before(t) {
				replayed[x.Ident] = x.End
			}
		}
	}
	for _, x := range sent {
		r, ok := replayed[x.Ident]
		if x.Wait <= 0 || !x.Complete || !ok || x.Status != http.StatusConflict || problemCode(x.Resp) != "request_in_flight" ||
			!x.End.After(r.Add(staleAfter)) || h.overlaps(r, x.End, FaultStoreCut, FaultFreeze, FaultKill9, FaultFinishBudget) != nil {
			continue
		}
		add("wait-sees-completion", "", "key %s: a request with Prefer: wait=%d (sent %s after the schedule's first) answered 409 request_in_flight %s after a replay of its key was received (completed by then; faults: %s)",
			showIdent(x.Ident), x.Wait, x.Start.Sub(sent[0].Start).Round(time.Millisecond), x.End.Sub(r).Round(time.Millisecond), faultsDuring(h, x))
	}

	// 10. The fleet retry budget at the front door (docs/frontdoor.md rule
	// 9): a budget schedule spent it (the front door counts its callers'
	// retries and refuses past the allowance); a refusal is 429
	// retry_budget_exhausted with Retry-After and Idem-Retry-Budget:
	// exhausted, only ever to a retry (first attempts are always served);
	// and a key whose every request was refused so is left as it was: no
	// run of it starts before the settle's first attempt.
	if s.Budget && !h.BudgetSpent {
		add("budget-spent", "", "the front door refused none of %d retries (Idem-Attempt: 2) at retry_budget_percent 0: it does not count its callers' retries against the fleet retry budget", budgetWarmups)
	}
	refusedOnly := map[string]bool{}
	for _, x := range sent {
		if x.Settle || strings.HasPrefix(x.Ident, "\x01ambiguous") {
			continue
		}
		refused := x.Complete && x.Status == http.StatusTooManyRequests && problemCode(x.Resp) == "retry_budget_exhausted"
		if seen, ok := refusedOnly[x.Ident]; !ok || seen {
			refusedOnly[x.Ident] = refused
		}
		if !refused {
			continue
		}
		if x.Attempt == "" {
			add("first-attempt-served", "", "key %s: a first attempt (no Idem-Attempt) was refused 429 retry_budget_exhausted", showIdent(x.Ident))
		}
		if x.Header.Get("Retry-After") == "" || x.Header.Get("Idem-Retry-Budget") != "exhausted" {
			add("budget-refusal-signals", "", "key %s: 429 retry_budget_exhausted without Retry-After (%q) or Idem-Retry-Budget: exhausted (%q)",
				showIdent(x.Ident), x.Header.Get("Retry-After"), x.Header.Get("Idem-Retry-Budget"))
		}
	}
	for _, id := range slices.Sorted(maps.Keys(refusedOnly)) {
		if !refusedOnly[id] {
			continue
		}
		var settled time.Time
		for _, x := range sent {
			if x.Settle && x.Ident == id {
				settled = x.Start
				break
			}
		}
		for _, r := range byIdent[id] {
			if settled.IsZero() || r.Start.T < settled.UnixMilli() {
				add("refused-leaves-key", "", "key %s: every request of it was refused 429 retry_budget_exhausted, yet run %s started before the settle's first attempt",
					showIdent(id), r.Start.Run)
			}
		}
	}

	return rep
}

// claimFloor is the earliest instant run a's claim can have been granted,
// its lease's start: the start of the request that got a's own answer
// (not a replay) when one did, else of the earliest request of the key
// that was not answered before a started (the one that claimed for a is
// among them). Not a's start: a busy app starts a handler well after idem
// granted its claim, which shortens the gap between two runs' starts and
// not the lease (seed 20261203, asgi/postgres, schedule 26: a raised
// run's handler started about 0.9 s after its grant, and the next claim,
// held by idem until that lease ended, ran 1.03 s after it).
func claimFloor(sent []*Sent, id string, a *Run) time.Time {
	start := time.UnixMilli(a.Start.T)
	within := start.Add(time.Millisecond) // the run's clock counts whole milliseconds
	for _, x := range sent {
		if rb, ok := parseRunBody(x.Resp); ok && x.Ident == id && rb.Run == a.Start.Run && !x.Replayed() && x.Start.Before(within) {
			return x.Start
		}
	}
	floor := start
	for _, x := range sent {
		if x.Ident != id || !x.Start.Before(within) || x.Status != 0 && x.End.Before(start) {
			continue
		}
		if x.Start.Before(floor) {
			floor = x.Start
		}
	}
	return floor
}

// leaseOf is the lease run a's claim was granted: Lease, or the lowered
// default of a lease_max settings fault (1 s) when that claim may have been
// made while the fault held. The server reads the tenant's lease when a
// claim arrives, and a claim of a key in flight may then be held (Prefer:
// wait, or the wait_seconds the SDKs ask for themselves) until the key is
// free, seconds later: a claim made under the lowered default and granted
// after the fault ended runs under a 1 s lease all the same (seed 20261202,
// express/postgres, schedule 30: a held claim's run took over 1.02 s after
// another's). So the fault counts when it ran within the second before the
// run started (the claim just before it), or while a request of the key
// that was still open when the run started (its claim may be the run's)
// was on its way. A request answered before the run started did not claim
// for it; one whose client went away before any answer may still have its
// claim held at the front door.
func leaseOf(h *History, sent []*Sent, id string, a *Run) time.Duration {
	start := time.UnixMilli(a.Start.T)
	if h.leaseLowered(start.Add(-time.Second), start) {
		return time.Second
	}
	for _, x := range sent {
		if x.Ident != id || x.Start.After(start) {
			continue
		}
		if open := !x.End.Before(start) || (x.Status == 0 && x.Disconnect == "mid_answer"); open && h.leaseLowered(x.Start, start) {
			return time.Second
		}
	}
	return Lease
}

// leaseLowered says whether a settings fault lowering lease_seconds_max
// and the default (FaultSettings, whatLeaseMax) ran within [from, to].
func (h *History) leaseLowered(from, to time.Time) bool {
	for _, f := range append(h.Before[:len(h.Before):len(h.Before)], h.Faults...) {
		if f.Kind == FaultSettings && strings.HasPrefix(f.What, whatLeaseMax) && !f.Start.After(to) && !f.End.Before(from) {
			return true
		}
	}
	return false
}

// storedProblem are the problems a front door stores and replays as the
// answer of a run whose outcome it cannot know (the gateway's upstream
// broke or timed out after it had the request).
var storedProblem = map[string]bool{"upstream_unavailable": true, "upstream_timeout": true}

// staleAfter is how much later than a replay of its key a waiting
// request's 409 may arrive and still be the answer of a claim made just
// before the completion (the answer's way back through the front door on
// a loaded machine).
const staleAfter = time.Second

// faultAfterglow is how long after a fault ended its effects may still be
// seen: connection pools reconnect, a restarted server warms up.
const faultAfterglow = 2 * time.Second

// QuotaOvershoot is how far a tenant's stored bytes may pass its quota
// after quota schedule s on a store where writers writes may run at once
// (QuotaWriters). It is what openapi.yaml promises for
// storage_quota_bytes, not less: "The usage may pass it by what writes
// racing at the edge store (at most one response per database connection
// writing at once), the few bytes of each record completed without its
// response, and the recovery points (at most 128 bytes) of lease
// renewals." A complete reads the usage committed when its statement
// starts, so on PostgreSQL the completes running on the pool's other
// connections at that instant are not seen (storetest
// Quota/ConcurrentCompletesBounded holds the stores to the same bound).
// Each writer's write at the edge is at most the schedule's largest answer
// with its headers and its record's key, operation and fingerprint
// (recordBytes); each key may add its unstored response and its lease
// keeper's recovery point (keyBytes).
func QuotaOvershoot(s Schedule, writers int) int64 {
	var answer int64
	for _, id := range s.Idents {
		// the run body names the run, the request, the scope and the pad
		b, _ := json.Marshal(runBody{Run: "xxxxxxxxxxxxxxxxxxxxxxxx", Req: id.Key, Scope: id.Scope, Pad: id.Pad})
		answer = max(answer, int64(len(b)))
	}
	return int64(writers)*(answer+recordBytes) + int64(len(s.Idents))*keyBytes
}

const (
	// recordBytes bounds an answer's stored headers with its record's key,
	// operation and fingerprint.
	recordBytes = 1024
	// keyBytes bounds what a key completed without its response stores
	// beyond its claim: the unstored response (status and an
	// Idem-Not-Replayable header) and a recovery point of at most 128 bytes.
	keyBytes = 256
)

func replayWord(x *Sent) string {
	if x.Replayed() {
		return "replayed"
	}
	return "first"
}

func outcome(r *Run) string {
	switch {
	case r.End != nil:
		return fmt.Sprintf("ended %d", r.End.Status)
	case r.Abort != nil:
		return "aborted: " + r.Abort.Why
	default:
		return "no end line"
	}
}

func showIdent(id string) string {
	scope, key, _ := strings.Cut(id, "\x00")
	if scope == "" {
		return fmt.Sprintf("%q (unscoped)", key)
	}
	return fmt.Sprintf("%q of %q", key, scope)
}

func clip(b []byte) string {
	if len(b) > 160 {
		return fmt.Sprintf("%q…", b[:160])
	}
	return fmt.Sprintf("%q", b)
}

func problemCode(b []byte) string {
	var p struct {
		Code string `json:"code"`
	}
	_ = json.Unmarshal(b, &p)
	return p.Code
}

func faultsDuring(h *History, x *Sent) string {
	var out []string
	for _, f := range h.Before {
		if !f.Start.After(x.End) && !f.End.Add(faultAfterglow).Before(x.Start) {
			out = append(out, f.Kind+" (of the schedule before)")
		}
	}
	for _, f := range h.Faults {
		if !f.Start.After(x.End) && !f.End.Before(x.Start) {
			out = append(out, f.Kind)
		}
	}
	if len(out) == 0 {
		return "none"
	}
	return strings.Join(out, ", ")
}

// checkProblem returns what is wrong with a refusal, or "".
func checkProblem(x *Sent, problems map[string]Problem) string {
	ct, _, _ := mime.ParseMediaType(x.Header.Get("Content-Type"))
	if ct != "application/problem+json" {
		return fmt.Sprintf("Content-Type %q, not application/problem+json: %s", x.Header.Get("Content-Type"), clip(x.Resp))
	}
	var p struct {
		Type      *string `json:"type"`
		Title     *string `json:"title"`
		Status    *int    `json:"status"`
		Code      string  `json:"code"`
		Retryable *bool   `json:"retryable"`
	}
	if err := json.Unmarshal(x.Resp, &p); err != nil {
		return "body is not JSON: " + clip(x.Resp)
	}
	if p.Type == nil || p.Title == nil || p.Status == nil {
		return "type, title or status missing: " + clip(x.Resp)
	}
	if *p.Status != x.Status {
		return fmt.Sprintf("status member %d, answer %d", *p.Status, x.Status)
	}
	if doc, ok := problems[p.Code]; ok {
		if p.Retryable == nil || *p.Retryable != doc.Retryable {
			return fmt.Sprintf("code %s: retryable %v, documented %v", p.Code, deref(p.Retryable), doc.Retryable)
		}
		if doc.Status != x.Status {
			return fmt.Sprintf("code %s: status %d, documented %d", p.Code, x.Status, doc.Status)
		}
	}
	return ""
}

func deref(b *bool) any {
	if b == nil {
		return "missing"
	}
	return *b
}
