// Package faultcheck is idem's fault-injecting invariant checker, in the
// style of Jepsen's checkers, FoundationDB's simulation tests and
// TigerBeetle's VOPR: a seeded generator of request schedules and faults
// (generator.go), a history of everything sent, seen and injected
// (history.go), a checker of the promise's invariants over the history and
// the app's own side-effect log (checker.go), and a runner that starts the
// real idem binary, the front door under test and the counting app
// (runner.go). One seed reproduces a schedule. The apps speak
// PROTOCOL.md. It is a test harness: product code never imports it.
package faultcheck

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"
	"time"
)

// Sent is one request of a schedule as the client sent it and what it saw.
type Sent struct {
	Op         int      // index of the op in the schedule (-1: settle)
	Ident      string   // the caller's record identity: scope + "\x00" + key
	Scope      string   // the caller's own scope ("" unscoped)
	Headers    []string // the scope header's values as sent (two: ambiguous)
	Key        string   // Idempotency-Key as sent
	Path       string
	Body       []byte
	Disconnect string // "", before_body, mid_body, mid_answer, mid_stream
	Settle     bool   // sent after the faults ended, to read the key's outcome
	Reuse      bool   // another request with a key that settled completed (FaultReuse)
	Wait       int    // Prefer: wait=Wait sent (0: none)
	Attempt    string // Idem-Attempt sent ("": none, a first attempt)

	Start, End time.Time
	Status     int
	Header     http.Header
	Resp       []byte
	Complete   bool   // the whole answer was read
	Err        string // transport error or the client's own disconnect
}

// Replayed says whether the answer carried Idempotent-Replayed: true.
func (s *Sent) Replayed() bool {
	return s.Header != nil && strings.EqualFold(s.Header.Get("Idempotent-Replayed"), "true")
}

// Injected is one fault as the runner injected it.
type Injected struct {
	Kind       string // a Fault
	What       string
	Start, End time.Time
}

// History is everything one schedule sent, saw and injected.
type History struct {
	mu     sync.Mutex
	Sent   []*Sent
	Faults []*Injected
	// Before is the faults of the schedule run just before on the same
	// rig. A schedule starts as soon as the one before settled, and its
	// settle ends at the first answers after the faults, so the effects of
	// a fault that ended there (a pool still holding connections a cut
	// closed) may reach this schedule's first requests within
	// faultAfterglow: they are this tenant's own faults all the same.
	Before []*Injected
	// QuotaUsed and Quota are the tenant's stored bytes after a quota
	// schedule and the quota it ran under.
	QuotaUsed, Quota int64
	// QuotaWriters is how many writes of the tenant's records the store
	// may run at once (Rig.QuotaWriters).
	QuotaWriters int
	// BudgetSpent says whether the front door refused a retry (429
	// retry_budget_exhausted) before a budget schedule's requests.
	BudgetSpent bool
}

func (h *History) add(s *Sent) {
	h.mu.Lock()
	h.Sent = append(h.Sent, s)
	h.mu.Unlock()
}

func (h *History) fault(kind, what string, start, end time.Time) {
	h.mu.Lock()
	h.Faults = append(h.Faults, &Injected{Kind: kind, What: what, Start: start, End: end})
	h.mu.Unlock()
}

// overlaps says whether a fault of one of kinds ran within [from, to].
func (h *History) overlaps(from, to time.Time, kinds ...string) *Injected {
	for _, f := range append(h.Before[:len(h.Before):len(h.Before)], h.Faults...) {
		for _, k := range kinds {
			if f.Kind == k && !f.Start.After(to) && !f.End.Before(from) {
				return f
			}
		}
	}
	return nil
}

// Event is one line of an app's side-effect log (PROTOCOL.md).
type Event struct {
	Ev         string `json:"ev"`
	Run        string `json:"run"`
	Key        string `json:"key"`
	Scope      string `json:"scope"`
	Req        string `json:"req"`
	Mode       string `json:"mode"`
	T          int64  `json:"t"`
	Status     int    `json:"status"`
	BodySHA256 string `json:"body_sha256"`
	Len        int    `json:"len"`
	Why        string `json:"why"`
}

// Run is one handler invocation: its start line and, if it finished, its
// end line.
type Run struct {
	Start Event
	End   *Event
	Abort *Event
}

// readLog reads the side-effect log from offset and returns the runs by id
// in start order.
func readLog(path string, offset int64) ([]*Run, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if _, err := f.Seek(offset, 0); err != nil {
		return nil, err
	}
	byID := map[string]*Run{}
	var order []*Run
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		var e Event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return nil, fmt.Errorf("side-effect log line %q: %w", sc.Text(), err)
		}
		switch e.Ev {
		case "start":
			r := &Run{Start: e}
			byID[e.Run] = r
			order = append(order, r)
		case "end", "abort":
			r := byID[e.Run]
			if r == nil {
				return nil, fmt.Errorf("side-effect log: %s of run %s that never started", e.Ev, e.Run)
			}
			if e.Ev == "end" {
				r.End = &e
			} else {
				r.Abort = &e
			}
		default:
			return nil, fmt.Errorf("side-effect log: unknown event %q", e.Ev)
		}
	}
	sort.SliceStable(order, func(i, j int) bool { return order[i].Start.T < order[j].Start.T })
	return order, sc.Err()
}

// String is one line of a dump of the history.
func (s *Sent) String() string {
	return fmt.Sprintf("+%s op %d key %q scope %q headers %q attempt=%q disconnect=%q settle=%v: status %d replayed=%v complete=%v err=%q body %.200q",
		s.Start.Format("15:04:05.000"), s.Op, s.Key, s.Scope, s.Headers, s.Attempt, s.Disconnect, s.Settle, s.Status, s.Replayed(), s.Complete, s.Err, s.Resp)
}
