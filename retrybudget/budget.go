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

// tenant is one tenant's window: slots counters, each for slot-long span
// of time, the span's number kept with it so a stale slot reads as empty.
type tenant struct {
	percent int
	slots   [slots]counts
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

// Admit counts one request of tenant id and decides it. A first attempt is
// always admitted. A retry is admitted while the retries admitted in the
// window are fewer than max(Floor, percent % of the first attempts in the
// window), so the admitted retries never pass that allowance; a percent of
// Off (100) or more admits every retry. Refused retries are counted apart
// and never use the allowance: a storm of refusals does not keep the
// budget shut once it is over.
func (b *Budget) Admit(id string, a Attempt) Decision {
	now := b.now()
	span := now.UnixNano() / int64(b.slot)
	b.mu.Lock()
	defer b.mu.Unlock()
	t, ok := b.tenants[id]
	if !ok {
		b.sweepIdle(span)
		t = &tenant{percent: DefaultPercent}
		b.tenants[id] = t
	}
	c := t.current(span)
	m := t.minute(minuteOf(now))
	if !a.Retry() {
		c.first++
		m.first++
		return Decision{Allowed: true}
	}
	if t.percent >= Off {
		c.retries++
		m.retries++
		return Decision{Allowed: true}
	}
	first, retries, _ := t.sum(span)
	allowance := max(int64(Floor), first*int64(t.percent)/100)
	if retries < allowance {
		c.retries++
		m.retries++
		return Decision{Allowed: true}
	}
	c.refused++
	m.refused++
	return Decision{RetryAfter: b.untilOldestRetry(t, span, now)}
}

// Invite is asked, for a retryable failure (503, other 5xx, 429, 409
// request_in_flight) about to be answered to tenant id, whether the answer
// should say the budget is spent (Idem-Retry-Budget: exhausted), so that no
// caller sends a retry only to have it refused: a refusal is itself an
// attempt reaching idem, and a caller would otherwise learn of the budget
// only from its own. It is spent when the retries admitted in the window,
// or the failures already answered without the signal (each invites a
// retry), reach the allowance Admit uses. Otherwise the failure is counted
// as one such invitation, so a burst of failures invites no more retries
// than the allowance however long the callers wait before retrying (a
// Retry-After of a second lets a whole second of failures through a
// signal that only looked at admitted retries). A percent of Off, or a
// tenant Admit has not seen, is never spent.
func (b *Budget) Invite(id string) bool {
	span := b.now().UnixNano() / int64(b.slot)
	b.mu.Lock()
	defer b.mu.Unlock()
	t, ok := b.tenants[id]
	if !ok || t.percent >= Off {
		return false
	}
	var first, retries, offered int64
	for i := range t.slots {
		c := &t.slots[i]
		if c.span > span-slots && c.span <= span {
			first += c.first
			retries += c.retries
			offered += c.offered
		}
	}
	allowance := max(int64(Floor), first*int64(t.percent)/100)
	if max(retries, offered) >= allowance {
		return true
	}
	t.current(span).offered++
	return false
}

// current returns the slot of span, emptied when it held an older span.
func (t *tenant) current(span int64) *counts {
	c := &t.slots[span%slots]
	if c.span != span {
		*c = counts{span: span}
	}
	return c
}

// sum adds up the slots within the window ending at span.
func (t *tenant) sum(span int64) (first, retries, refused int64) {
	for i := range t.slots {
		c := &t.slots[i]
		if c.span > span-slots && c.span <= span {
			first += c.first
			retries += c.retries
			refused += c.refused
		}
	}
	return first, retries, refused
}

// untilOldestRetry is the time until the oldest slot holding admitted
// retries leaves the window: the earliest a refused retry may find room.
func (b *Budget) untilOldestRetry(t *tenant, span int64, now time.Time) time.Duration {
	oldest := int64(math.MaxInt64)
	for i := range t.slots {
		c := &t.slots[i]
		if c.span > span-slots && c.span <= span && c.retries > 0 {
			oldest = min(oldest, c.span)
		}
	}
	if oldest == math.MaxInt64 {
		return b.slot
	}
	leaves := time.Unix(0, (oldest+slots)*int64(b.slot))
	return max(leaves.Sub(now), time.Millisecond)
}

// sweepIdle drops tenants with nothing in the window nor in the last hour
// (deleted tenants, or ones whose callers went quiet) once per 1024 new
// tenants, so the map holds about the tenants active within an hour: its
// memory is bounded by them, about 2.3 KiB each. Called with b.mu held.
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

// Stats is one tenant's window as Snapshot reads it.
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
