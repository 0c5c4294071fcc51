// Package keyevents is waiting for a key: the in-process fan-out both
// drivers build their idem.KeyEvents on (Broadcast: SQLite publishes after
// each commit, PostgreSQL what its LISTEN connection hears), and the
// Waiters that hold a claim of a key in flight until it changes.
package keyevents

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-dev/idem"
)

// subscriber is the source's side of one Subscription: the channel it
// signals, and the key it is filed under.
type subscriber struct {
	c  chan struct{}
	id keyID
}

func (s *subscriber) signal() {
	select {
	case s.c <- struct{}{}:
	default:
	}
}

type keyID struct{ tenant, key string }

// Broadcast fans key events out to the subscriptions of one process. Both
// stores build their idem.KeyEvents on it: SQLite publishes after each commit
// that changes a key, PostgreSQL publishes what its one listening
// connection hears. The zero value is ready to use.
type Broadcast struct {
	mu   sync.Mutex
	subs map[keyID]map[*subscriber]struct{}
	n    int
}

// Subscribe adds a subscription to (tenantID, key); it is live on return.
func (b *Broadcast) Subscribe(tenantID, key string) *idem.Subscription {
	s := &subscriber{c: make(chan struct{}, 1), id: keyID{tenantID, key}}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.subs == nil {
		b.subs = make(map[keyID]map[*subscriber]struct{})
	}
	set := b.subs[s.id]
	if set == nil {
		set = make(map[*subscriber]struct{})
		b.subs[s.id] = set
	}
	set[s] = struct{}{}
	b.n++
	return idem.NewSubscription(s.c, func() { b.remove(s) })
}

func (b *Broadcast) remove(s *subscriber) {
	b.mu.Lock()
	defer b.mu.Unlock()
	set := b.subs[s.id]
	if _, ok := set[s]; !ok {
		return
	}
	delete(set, s)
	b.n--
	if len(set) == 0 {
		delete(b.subs, s.id)
	}
}

// Publish signals every subscription to (tenantID, key).
func (b *Broadcast) Publish(tenantID, key string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for s := range b.subs[keyID{tenantID, key}] {
		s.signal()
	}
}

// PublishTenant signals every subscription to a key of tenantID (the
// tenant was deleted with all of its keys).
func (b *Broadcast) PublishTenant(tenantID string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for id, set := range b.subs {
		if id.tenant == tenantID {
			for s := range set {
				s.signal()
			}
		}
	}
}

// PublishAll signals every subscription: the source may have missed events
// (a listening connection was lost, another process wrote the file).
func (b *Broadcast) PublishAll() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, set := range b.subs {
		for s := range set {
			s.signal()
		}
	}
}

// Len returns the number of live subscriptions.
func (b *Broadcast) Len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.n
}

// Waiters holds claims of keys in flight until the holder finishes, for one
// replica: at most a fixed number at once, each woken by its key's events
// or by a timer at the end of the holder's lease — never by polling.
// A nil *Waiters never waits.
type Waiters struct {
	events    idem.KeyEvents
	limit     int64
	perTenant int64
	n         atomic.Int64
	mu        sync.Mutex
	byTenant  map[string]int64
	closed    chan struct{}
	once      sync.Once
}

// NewWaiters returns Waiters on events that hold at most limit claims at
// once; past it a claim gets the immediate request_in_flight. events nil or
// limit <= 0 gives Waiters that never wait.
func NewWaiters(events idem.KeyEvents, limit int) *Waiters {
	return &Waiters{events: events, limit: int64(limit), perTenant: int64(limit), byTenant: map[string]int64{}, closed: make(chan struct{})}
}

// NewSharedWaiters is NewWaiters for many tenants: one tenant holds at
// most TenantShare of limit, so that its held claims — as many as it
// likes to send — never take every place and leave the other tenants'
// waits refused at once.
func NewSharedWaiters(events idem.KeyEvents, limit int) *Waiters {
	w := NewWaiters(events, limit)
	w.perTenant = TenantShare(limit)
	return w
}

// TenantShare is the most claims one tenant may have held at once by
// Waiters of limit places shared by many tenants: half of them (rounded
// up, at least one).
func TenantShare(limit int) int64 { return int64(max((limit+1)/2, 1)) }

// Waiting returns how many claims are held now.
func (w *Waiters) Waiting() int {
	if w == nil {
		return 0
	}
	return int(w.n.Load())
}

// Close wakes every held claim, which answers the request_in_flight it
// would have answered at the end of its wait (Retry-After = lease left),
// and makes later claims answer at once. The server calls it when a
// graceful shutdown begins, so no held request delays it.
func (w *Waiters) Close() {
	if w != nil {
		w.once.Do(func() { close(w.closed) })
	}
}

// leaseSlack is added to the lease left before a waiter claims again at the
// lease's end, so the database clock has surely passed it.
const leaseSlack = 5 * time.Millisecond

// Claim claims p on store; when the key is in flight it holds the claim up
// to wait (and no longer than ctx's deadline) and claims again each time
// the key may have changed and when the holder's lease ends. It returns
// the first outcome that is not request_in_flight — the replay after a
// completion, a new claim after a release, a takeover after the lease ran
// out — or, when the wait runs out, the outcome of one last claim (the
// request_in_flight with RetryAfter = the lease left then, or
// store_unavailable when the store went away meanwhile), or when the
// Waiters close, that request_in_flight with RetryAfter = the lease left
// now.
//
// applied reports whether the wait was honoured: false when wait <= 0, or
// when the claim found the key in flight and could not wait (the waiter
// limit was reached, the event source is down, the Waiters are closed) and
// answered at once. An event source that is down answers the outcome of
// one more claim made after Subscribe failed (it may have taken a while:
// the key may have changed, the lease shortened). A caller whose context ends gets its error: a client
// that went away frees its place at once.
//
// Each store call is bounded on its own (storemw.WithDeadline); the wait is
// not a store call.
func (w *Waiters) Claim(ctx context.Context, store idem.Store, p idem.ClaimParams, wait time.Duration) (res idem.ClaimResult, applied bool, err error) {
	res, err = store.Claim(ctx, p)
	if wait <= 0 || w == nil || w.events == nil {
		return res, false, err
	}
	if !isInFlight(err) {
		return res, true, err
	}
	deadline := time.Now().Add(wait)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	if !w.acquire(p.TenantID) {
		return res, false, err
	}
	defer w.release(p.TenantID)
	sub, serr := w.events.Subscribe(ctx, p.TenantID, p.Key)
	if serr != nil {
		if ctx.Err() != nil {
			return res, false, fmt.Errorf("wait for key: %w", ctx.Err())
		}
		// The source cannot listen (PostgreSQL's Subscribe waited up to
		// its listenTimeout for a reconnecting LISTEN connection): answer
		// without waiting, but what the key is now, as at the end of a
		// wait — the replay of a completion made meanwhile, the 409 with
		// the lease left now, store_unavailable when the store went away
		// too — never the first claim's stale 409.
		res, err = store.Claim(ctx, p)
		return res, false, err
	}
	defer sub.Close()

	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	slept := false // whether the claim has waited at all
	for {
		// Claim again now that the subscription is live: a change made
		// between the first claim and Subscribe is not missed. Each round
		// that finds the key in flight Watches it before sleeping: after
		// a release the key may be held again, by a row nobody flagged.
		at := time.Now()
		res, err = store.Claim(ctx, p)
		if !isInFlight(err) {
			return res, true, err
		}
		left := time.Until(deadline)
		if left <= 0 {
			return res, true, err
		}
		inFlight, werr := w.events.Watch(ctx, p.TenantID, p.Key)
		if werr != nil {
			if ctx.Err() != nil {
				return res, true, fmt.Errorf("wait for key: %w", ctx.Err())
			}
			// Without the flag a completion may go unheard: answer now
			// rather than risk sleeping to the lease's end; a store that
			// does not answer is store_unavailable, not in flight.
			if idem.ErrorCode(werr) == idem.CodeStoreUnavailable {
				return res, slept, werr
			}
			return res, slept, aged(err, time.Since(at))
		}
		if !inFlight {
			continue // changed since the claim: claim again
		}
		timer.Reset(min(left, retryAfterOf(err)+leaseSlack))
		slept = true
		select {
		case <-sub.C:
		case <-timer.C:
			if time.Until(deadline) <= 0 {
				// Claim once more: the answer is the key's state now
				// (the lease left now, or a completion no event
				// announced), and store_unavailable when the store went
				// away while the claim slept — no event announces that.
				res, err = store.Claim(ctx, p)
				return res, true, err
			}
		case <-w.closed:
			return res, true, aged(err, time.Since(at))
		case <-ctx.Done():
			return res, true, fmt.Errorf("wait for key: %w", ctx.Err())
		}
	}
}

// acquire takes a waiter's place for tenant, or reports false at the
// limit, at the tenant's share of it, or after Close.
func (w *Waiters) acquire(tenant string) bool {
	select {
	case <-w.closed:
		return false
	default:
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.n.Load() >= w.limit || w.byTenant[tenant] >= w.perTenant {
		return false
	}
	w.n.Add(1)
	w.byTenant[tenant]++
	return true
}

// release gives back a place acquire took for tenant.
func (w *Waiters) release(tenant string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.n.Add(-1)
	if w.byTenant[tenant]--; w.byTenant[tenant] <= 0 {
		delete(w.byTenant, tenant)
	}
}

func isInFlight(err error) bool { return idem.ErrorCode(err) == idem.CodeRequestInFlight }

func retryAfterOf(err error) time.Duration {
	var e *idem.Error
	if errors.As(err, &e) {
		return e.RetryAfter
	}
	return 0
}

// aged returns the request_in_flight err with its RetryAfter shortened by
// the time passed since the claim that returned it.
func aged(err error, passed time.Duration) error {
	var e *idem.Error
	if !errors.As(err, &e) {
		return err
	}
	c := *e
	c.RetryAfter = max(c.RetryAfter-passed, 0)
	return &c
}
