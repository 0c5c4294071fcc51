package retrybudget

import (
	"math"
	"sync"
	"time"
)

// Defaults of the budget (RETRY-PROTOCOL.md; web/docs/retries).
const (
	// DefaultWindow is the sliding window (IDEM_RETRY_BUDGET_WINDOW).
	DefaultWindow = 10 * time.Second
	// Floor is the retries a tenant may always make per window, whatever
	// its first attempts: a quiet tenant (a handful of calls a minute)
	// could otherwise never retry at all.
	Floor = 10
	// DefaultPercent is retry_budget_percent of a tenant never seen, until
	// its settings are read (idem.DefaultRetryBudgetPercent).
	DefaultPercent = 10
	// Off is the percent that turns the budget off.
	Off = 100
	// slots is how many sub-windows the window slides by.
	slots = 10
)

// Budget is one replica's retry budget of every tenant. It is safe for
// concurrent use; its cost per request is one map lookup under a mutex.
type Budget struct {
	window time.Duration
	slot   time.Duration
	now    func() time.Time

	mu      sync.Mutex
	tenants map[string]*tenant
	sweep   int // admissions since the last sweep of idle tenants
}

// Kind is the kind of call a request is. A retry spends the allowance of
// the first attempts of its own kind: a claim retried during a store
// outage is a share of the claims, not of the completes that came with
// them before the outage and stopped with it (a complete only follows a
// claim that succeeded), which would have let the retries be twice the
// share (web/docs/retries#budget). Envoy's retry_budget (per upstream
// cluster), Finagle's RetryBudget (per client of one service) and gRPC's
// retryThrottling (per channel) all weigh the retries against the traffic
// of the same calls that fail together; a tenant's kinds of call are
// idem's equivalent. The floor stays the tenant's, whatever the kind.
type Kind uint8

// The kinds of call. KindOther, the zero Kind, is every request that is
// not one of the four writes of a key (reads, lists, the tenant's own
// settings).
const (
	KindOther Kind = iota
	KindClaim
	KindCheckpoint
	KindComplete
	KindRelease
	kinds
)

// String is the kind's name, as in the path of its call.
// Finishing reports whether k is a write that finishes a claim
// (checkpoint, complete, release): the budget never refuses or flags its
// retries, since giving one up would leave work that ran unrecorded.
func (k Kind) Finishing() bool {
	return k == KindCheckpoint || k == KindComplete || k == KindRelease
}

func (k Kind) String() string {
	switch k {
	case KindClaim:
		return "claim"
	case KindCheckpoint:
		return "checkpoint"
	case KindComplete:
		return "complete"
	case KindRelease:
		return "release"
	}
	return "other"
}

// tenant is one tenant's window: slots counters, each for slot-long span
// of time, the span's number kept with it so a stale slot reads as empty.
type tenant struct {
	percent int
	// slots is a ring of the window's slots and one more: the oldest,
	// partly out of the window, that room counts for the part still in it.
	slots [slots + 1]slot
	// minutes is the last hour of the tenant, one counts per minute of
	// the clock (span = Unix time / HistoryBucket), for the dashboard.
	minutes [HistoryBuckets]counts
}

type counts struct {
	span    int64 // time / slot width
	first   int64
	retries int64 // retries admitted
	refused int64
	offered int64 // retryable failures answered without the exhausted signal
}

// slot is one slot of the window: its span and the counts of each kind of
// call in it (their own span unused).
type slot struct {
	span int64
	kind [kinds]counts
}

// New returns a Budget with a window of window (DefaultWindow when zero or
// less) read on clock now (time.Now when nil).
func New(window time.Duration, now func() time.Time) *Budget {
	if window <= 0 {
		window = DefaultWindow
	}
	if now == nil {
		now = time.Now
	}
	slot := max(window/slots, time.Millisecond)
	return &Budget{window: slot * slots, slot: slot, now: now, tenants: map[string]*tenant{}}
}

// Window returns the sliding window.
func (b *Budget) Window() time.Duration { return b.window }

// Decision is the answer of Admit.
type Decision struct {
	// Allowed is false for a retry the budget refuses.
	Allowed bool
	// RetryAfter, for a refused retry, is the time until the oldest
	// retries admitted leave the window.
	RetryAfter time.Duration
}

// SetPercent records the tenant's retry_budget_percent, read with the
// tenant's settings after Admit: the budget decides before the tenant is
// looked up (which may reach the store), on the percent of the tenant's
// last request, at most a tenant cache period old.
func (b *Budget) SetPercent(id string, percent int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if t, ok := b.tenants[id]; ok {
		t.percent = percent
	}
}

// Admit counts one request of tenant id, of kind k, and decides it. A
// first attempt is always admitted. A retry is admitted while the retries
// of its kind admitted in the window are fewer than percent % of the first
// attempts of that kind in the window, or while the tenant's retries
// admitted in the window, of every kind, are fewer than Floor; so the
// admitted retries of a kind never pass the larger of the two. A percent
// of Off (100) or more admits every retry. Refused retries are counted
// apart and never use the allowance: a storm of refusals does not keep the
// budget shut once it is over.
func (b *Budget) Admit(id string, k Kind, a Attempt) Decision {
	now := b.now()
	span := now.UnixNano() / int64(b.slot)
	if k >= kinds {
		k = KindOther
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	t, ok := b.tenants[id]
	if !ok {
		b.sweepIdle(span)
		t = &tenant{percent: DefaultPercent}
		b.tenants[id] = t
	}
	c := &t.current(span).kind[k]
	m := t.minute(minuteOf(now))
	if !a.Retry() {
		c.first++
		m.first++
		return Decision{Allowed: true}
	}
	if t.percent >= Off || t.room(b.at(now), k, func(c *counts) int64 { return c.retries }) {
		c.retries++
		m.retries++
		return Decision{Allowed: true}
	}
	c.refused++
	m.refused++
	return Decision{RetryAfter: b.untilOldestRetry(t, span, k, now)}
}

// position is a moment within the window's slots: the slot's span and how
// far into it, 0 to 1.
type position struct {
	span int64
	frac float64
}

func (b *Budget) at(now time.Time) position {
	ns := now.UnixNano()
	return position{span: ns / int64(b.slot), frac: float64(ns%int64(b.slot)) / float64(b.slot)}
}

// room reports whether a retry of kind k fits the allowance of the window
// ending at p, used(c) being what a slot's counts of a kind have used of
// it: under percent % of the kind's first attempts, or, over every kind,
// under the floor. The window is the current slot, the slots-1 before it
// and the part of the oldest slot still in it (a share of its counts), so
// it slides smoothly: dropping the oldest slot whole when a slot begins
// would take a tenth of the first attempts out at once, and the retries
// invited just before the boundary would be refused just after it.
// Called with b.mu held.
func (t *tenant) room(p position, k Kind, used func(*counts) int64) bool {
	var first, usedK, usedAll float64
	for i := range t.slots {
		s := &t.slots[i]
		if s.span < p.span-slots || s.span > p.span {
			continue
		}
		w := 1.0
		if s.span == p.span-slots {
			w = 1 - p.frac
		}
		first += w * float64(s.kind[k].first)
		usedK += w * float64(used(&s.kind[k]))
		for j := range s.kind {
			usedAll += w * float64(used(&s.kind[j]))
		}
	}
	return usedK < math.Floor(first*float64(t.percent)/100) || usedAll < Floor
}

// Invite is asked, for a retryable failure (503, other 5xx, 429, 409
// request_in_flight) of a request of kind k about to be answered to tenant
// id, whether the answer should say the budget is spent
// (Idem-Retry-Budget: exhausted), so that no caller sends a retry only to
// have it refused: a refusal is itself an attempt reaching idem, and a
// caller would otherwise learn of the budget only from its own. It is
// spent when neither the retries admitted in the window nor the failures
// already answered without the signal (each invites a retry) leave room in
// the allowance Admit uses for a retry of kind k. Otherwise the failure is
// counted as one such invitation, so a burst of failures invites no more
// retries than the allowance however long the callers wait before
// retrying (a Retry-After of a second lets a whole second of failures
// through a signal that only looked at admitted retries). A percent of
// Off, or a tenant Admit has not seen, is never spent.
func (b *Budget) Invite(id string, k Kind) bool {
	now := b.now()
	p := b.at(now)
	if k >= kinds {
		k = KindOther
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	t, ok := b.tenants[id]
	if !ok || t.percent >= Off {
		return false
	}
	if !t.room(p, k, func(c *counts) int64 { return c.retries }) ||
		!t.room(p, k, func(c *counts) int64 { return c.offered }) {
		return true
	}
	t.current(p.span).kind[k].offered++
	return false
}

// current returns the slot of span, emptied when it held an older span.
func (t *tenant) current(span int64) *slot {
	s := &t.slots[span%(slots+1)]
	if s.span != span {
		*s = slot{span: span}
	}
	return s
}

// sum adds up the slots within the window ending at span, every kind.
func (t *tenant) sum(span int64) (first, retries, refused int64) {
	for i := range t.slots {
		s := &t.slots[i]
		if s.span > span-slots && s.span <= span {
			for j := range s.kind {
				first += s.kind[j].first
				retries += s.kind[j].retries
				refused += s.kind[j].refused
			}
		}
	}
	return first, retries, refused
}

// untilOldestRetry is the time until the oldest slot holding admitted
// retries of kind k (of any kind when it has none: the floor's) leaves
// the window: the earliest a refused retry of that kind may find room.
func (b *Budget) untilOldestRetry(t *tenant, span int64, k Kind, now time.Time) time.Duration {
	oldest, oldestAny := int64(math.MaxInt64), int64(math.MaxInt64)
	for i := range t.slots {
		s := &t.slots[i]
		if s.span <= span-slots || s.span > span {
			continue
		}
		if s.kind[k].retries > 0 {
			oldest = min(oldest, s.span)
		}
		for j := range s.kind {
			if s.kind[j].retries > 0 {
				oldestAny = min(oldestAny, s.span)
			}
		}
	}
	if oldest == math.MaxInt64 {
		oldest = oldestAny // no retry of this kind: the floor's retries must leave
	}
	if oldest == math.MaxInt64 {
		return b.slot
	}
	leaves := time.Unix(0, (oldest+slots+1)*int64(b.slot)) // the slot wholly out of the window
	return max(leaves.Sub(now), time.Millisecond)
}

// sweepIdle drops tenants with nothing in the window nor in the last hour
// (deleted tenants, or ones whose callers went quiet) once per 1024 new
// tenants, so the map holds about the tenants active within an hour: its
// memory is bounded by them, about 4.5 KiB each. Called with b.mu held.
func (b *Budget) sweepIdle(span int64) {
	b.sweep++
	if b.sweep < 1024 {
		return
	}
	b.sweep = 0
	b.dropIdle(span, minuteOf(b.now()))
}

// dropIdle drops the tenants with nothing in the window ending at span nor
// in the hour ending at minute.
func (b *Budget) dropIdle(span, minute int64) {
	for id, t := range b.tenants {
		if f, r, x := t.sum(span); f == 0 && r == 0 && x == 0 && !t.seenSince(minute) {
			delete(b.tenants, id)
		}
	}
}

// Stats is one tenant's window as Snapshot reads it, every kind of call.
type Stats struct {
	Tenant  string
	First   int64 // first attempts
	Retries int64 // retries admitted
	Refused int64 // retries refused
}

// Amplification is attempts reaching the replica (first, admitted and
// refused retries) per first attempt; a window of retries only counts as
// if it held one first attempt.
func (s Stats) Amplification() float64 {
	return float64(s.First+s.Retries+s.Refused) / float64(max(s.First, 1))
}

// Snapshot returns the window of every tenant with attempts in it, and
// drops the tenants idle for an hour.
func (b *Budget) Snapshot() []Stats {
	now := b.now()
	span := now.UnixNano() / int64(b.slot)
	b.mu.Lock()
	defer b.mu.Unlock()
	b.dropIdle(span, minuteOf(now))
	out := make([]Stats, 0, len(b.tenants))
	for id, t := range b.tenants {
		f, r, x := t.sum(span)
		if f == 0 && r == 0 && x == 0 {
			continue
		}
		out = append(out, Stats{Tenant: id, First: f, Retries: r, Refused: x})
	}
	return out
}
