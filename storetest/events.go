package storetest

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/keyevents"
)

// eventWait bounds how long a test waits for a key event; events normally
// arrive within milliseconds.
const eventWait = 10 * time.Second

// subscribe subscribes to (tenant, key) on the store's idem.KeyEvents, which
// every store must have.
func (b *bundle) subscribe(t *testing.T, tenant, key string) *idem.Subscription {
	t.Helper()
	ev := b.store.KeyEvents()
	require.NotNil(t, ev, "the store must have idem.KeyEvents")
	sub, err := ev.Subscribe(b.ctx, tenant, key)
	require.NoError(t, err)
	t.Cleanup(sub.Close)
	return sub
}

// watch Watches (tenant, key), which must be in flight: from then on its
// completion or deletion wakes the key's subscriptions.
func (b *bundle) watch(t *testing.T, tenant, key string) {
	t.Helper()
	inFlight, err := b.store.KeyEvents().Watch(b.ctx, tenant, key)
	require.NoError(t, err)
	require.True(t, inFlight, "Watch of %s/%s, which is in flight", tenant, key)
}

func requireEvent(t *testing.T, sub *idem.Subscription, what string) {
	t.Helper()
	select {
	case <-sub.C:
	case <-time.After(eventWait):
		require.FailNow(t, "no key event", "%s did not wake the subscription within %s", what, eventWait)
	}
}

// requireNoEvent checks, right after an event was delivered to another
// subscription of the same change, that sub was not woken by it.
func requireNoEvent(t *testing.T, sub *idem.Subscription, what string) {
	t.Helper()
	select {
	case <-sub.C:
		require.FailNow(t, "unexpected key event", "%s woke a subscription to another key", what)
	default:
	}
}

// testEventsWake: completing, releasing, reaping a key and deleting its
// tenant wake the key's subscriptions once committed, when the key was
// Watched in flight; a subscription to another key or to the same key of
// another tenant is not woken.
func testEventsWake(t *testing.T, s *suite) {
	b := s.setup(t, "acme", "beta")
	done := b.subscribe(t, "acme", "done")
	released := b.subscribe(t, "acme", "released")
	other := b.subscribe(t, "beta", "done")

	rec := b.create(t, "acme", "done")
	b.create(t, "beta", "done")
	b.watch(t, "acme", "done")
	b.complete(t, "acme", "done", rec.FencingToken, response(1))
	requireEvent(t, done, "a completion")
	requireNoEvent(t, released, "a completion")
	requireNoEvent(t, other, "a completion in another tenant")

	rec = b.create(t, "acme", "released")
	b.watch(t, "acme", "released")
	require.NoError(t, b.store.Release(b.ctx, idem.ReleaseParams{TenantID: "acme", Key: "released", FencingToken: rec.FencingToken}))
	requireEvent(t, released, "a release")
	requireNoEvent(t, other, "a release in another tenant")

	reaped := b.subscribe(t, "acme", "reaped")
	p := ClaimParams("acme", "reaped")
	p.Lease = 10 * time.Second
	p.ReaperThreshold = time.Minute
	b.claim(t, p)
	b.watch(t, "acme", "reaped")
	b.advance(2 * time.Minute)
	gone, err := b.store.Reap(b.ctx, idem.ReapParams{Limit: 100})
	require.NoError(t, err)
	require.Len(t, gone, 1)
	requireEvent(t, reaped, "a reap")

	deleted := b.subscribe(t, "acme", "tenant-deleted")
	b.create(t, "acme", "tenant-deleted")
	b.watch(t, "acme", "tenant-deleted")
	require.NoError(t, b.store.DeleteTenant(b.ctx, idem.DeleteTenantParams{ID: "acme"}))
	requireEvent(t, deleted, "deleting the tenant")
	requireNoEvent(t, other, "deleting another tenant")
}

// testEventsClose: a closed subscription is removed at once; closing twice
// is harmless, and a key's other subscriptions still hear its events.
func testEventsClose(t *testing.T, s *suite) {
	b := s.setup(t, "acme")
	gone := b.subscribe(t, "acme", "k")
	kept := b.subscribe(t, "acme", "k")
	gone.Close()
	gone.Close()
	rec := b.create(t, "acme", "k")
	b.watch(t, "acme", "k")
	b.complete(t, "acme", "k", rec.FencingToken, response(1))
	requireEvent(t, kept, "a completion")
	requireNoEvent(t, gone, "a completion (closed subscription)")
}

// testEventsResolve: an operator's release or completion of an orphan
// wakes the key's subscriptions like the worker's own would.
func testEventsResolve(t *testing.T, s *suite) {
	b := s.setup(t, "acme")
	for _, action := range []idem.ResolveAction{idem.ResolveRelease, idem.ResolveComplete} {
		key := "resolved-" + string(action)
		sub := b.subscribe(t, "acme", key)
		rec := b.orphan(t, "acme", key)
		b.watch(t, "acme", key)
		b.resolve(t, resolution("acme", key, action, rec.FencingToken))
		requireEvent(t, sub, "resolving an orphan ("+string(action)+")")
	}
}

// testEventsWatch: Watch reports whether the key is in flight — false for
// an absent and a completed key — and may be called again and again.
func testEventsWatch(t *testing.T, s *suite) {
	b := s.setup(t, "acme")
	ev := b.store.KeyEvents()
	absent, err := ev.Watch(b.ctx, "acme", "absent")
	require.NoError(t, err)
	rec := b.create(t, "acme", "k")
	b.watch(t, "acme", "k")
	b.watch(t, "acme", "k")
	b.complete(t, "acme", "k", rec.FencingToken, response(1))
	completed, err := ev.Watch(b.ctx, "acme", "k")
	require.NoError(t, err)
	require.False(t, absent, "Watch of an absent key")
	require.False(t, completed, "Watch of a completed key")
}

// raceRounds bounds the rounds of the waiter races; each round takes a few
// milliseconds when the waiter is woken, eventWait when it is not.
const raceRounds = 40

// waitFor is how long a raced waiter waits: well past any wake-up, and a
// failing round ends there.
const waitFor = 5 * time.Second

// startWaiter runs w.Claim of (tenant, key) in the background and returns
// its outcome's channel once the waiter holds its place.
func (b *bundle) startWaiter(t *testing.T, w *keyevents.Waiters, tenant, key string) <-chan waitOutcome {
	t.Helper()
	out := make(chan waitOutcome, 1)
	before := w.Waiting()
	go func() {
		res, applied, err := w.Claim(b.ctx, b.store, ClaimParams(tenant, key), waitFor)
		out <- waitOutcome{res, applied, err}
	}()
	for w.Waiting() == before {
		select {
		case o := <-out:
			out <- o // answered without holding a place (the key was free)
			return out
		default:
			runtime.Gosched()
		}
	}
	return out
}

type waitOutcome struct {
	res     idem.ClaimResult
	applied bool
	err     error
}

func requireWoken(t *testing.T, out <-chan waitOutcome, what string) waitOutcome {
	t.Helper()
	select {
	case o := <-out:
		require.NotEqual(t, idem.CodeRequestInFlight, idem.ErrorCode(o.err),
			"%s: the waiter was not woken (it answered request_in_flight at the end of its wait)", what)
		require.NoError(t, o.err, what)
		return o
	case <-time.After(waitFor + eventWait):
		require.FailNow(t, "waiter never answered", what)
		return waitOutcome{}
	}
}

// testEventsWaiterRacesComplete: a claim that starts waiting just as the
// holder completes is woken (or finds the completion at once) in every
// round — the store must never let a completion slip between a waiter's
// last look at the key and its sleep. The holder completes after a varying
// number of yields, so the rounds cover the waiter's subscribe, claim,
// Watch and sleep.
func testEventsWaiterRacesComplete(t *testing.T, s *suite) {
	b := s.setup(t, "acme")
	w := keyevents.NewWaiters(b.store.KeyEvents(), 4)
	t.Cleanup(w.Close)
	for i := range raceRounds {
		key := fmt.Sprintf("race-%d", i)
		rec := b.create(t, "acme", key)
		out := b.startWaiter(t, w, "acme", key)
		for range i * 20 {
			runtime.Gosched()
		}
		b.complete(t, "acme", key, rec.FencingToken, response(i))
		o := requireWoken(t, out, fmt.Sprintf("round %d", i))
		require.Equal(t, idem.ActionReplay, o.res.Action, "round %d", i)
		require.Equal(t, response(i).Body, o.res.Record.Response.Body, "round %d: the holder's response", i)
	}
}

// watchSignal is the store's KeyEvents that also signals each Watch that
// returned: the waiter that called it sleeps next, without a store call.
type watchSignal struct {
	idem.KeyEvents
	watched chan struct{}
}

func (w watchSignal) Watch(ctx context.Context, tenantID, key string) (bool, error) {
	inFlight, err := w.KeyEvents.Watch(ctx, tenantID, key)
	select {
	case w.watched <- struct{}{}:
	default:
	}
	return inFlight, err
}

// testEventsWaiterAcrossReclaim: a waiter asleep on a key that is released
// and claimed again by another request is woken by the release, finds the
// key in flight again and is woken by the new holder's completion (the
// new holder's record must be watched too).
func testEventsWaiterAcrossReclaim(t *testing.T, s *suite) {
	b := s.setup(t, "acme")
	events := watchSignal{b.store.KeyEvents(), make(chan struct{}, 1)}
	w := keyevents.NewWaiters(events, 4)
	t.Cleanup(w.Close)
	reclaimed := 0
	for i := range raceRounds / 4 {
		key := fmt.Sprintf("reclaim-%d", i)
		first := b.create(t, "acme", key)
		select {
		case <-events.watched: // a Watch of the round before
		default:
		}
		out := b.startWaiter(t, w, "acme", key)
		select {
		case <-events.watched: // the waiter is going to sleep
		case <-time.After(eventWait):
			require.FailNow(t, "the waiter never watched the key", "round %d", i)
		}
		require.NoError(t, b.store.Release(b.ctx, idem.ReleaseParams{TenantID: "acme", Key: key, FencingToken: first.FencingToken}))
		second, err := b.store.Claim(b.ctx, ClaimParams("acme", key))
		if err != nil {
			// the waiter claimed the released key first: it holds it now
			requireCode(t, err, idem.ErrRequestInFlight)
			o := requireWoken(t, out, fmt.Sprintf("round %d", i))
			require.Equal(t, idem.ActionCreate, o.res.Action, "round %d", i)
			continue
		}
		require.Equal(t, idem.ActionCreate, second.Action, "round %d", i)
		reclaimed++
		b.complete(t, "acme", key, second.Record.FencingToken, response(i))
		o := requireWoken(t, out, fmt.Sprintf("round %d", i))
		require.Equal(t, idem.ActionReplay, o.res.Action, "round %d", i)
	}
	require.Positive(t, reclaimed, "no round had the key claimed again while the waiter waited")
}
