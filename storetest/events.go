package storetest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem"
)

// eventWait bounds how long a test waits for a key event; events normally
// arrive within milliseconds.
const eventWait = 10 * time.Second

// subscribe subscribes to (tenant, key) on the store's idem.KeyEvents, which
// every store must implement.
func (b *bundle) subscribe(t *testing.T, tenant, key string) *idem.Subscription {
	t.Helper()
	ev, ok := b.store.(idem.KeyEvents)
	require.True(t, ok, "the store must implement idem.KeyEvents")
	sub, err := ev.Subscribe(b.ctx, tenant, key)
	require.NoError(t, err)
	t.Cleanup(sub.Close)
	return sub
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
// tenant wake the key's subscriptions once committed; a subscription to
// another key or to the same key of another tenant is not woken.
func testEventsWake(t *testing.T, s *suite) {
	b := s.setup(t)
	b.tenant(t, "acme")
	b.tenant(t, "beta")
	done := b.subscribe(t, "acme", "done")
	released := b.subscribe(t, "acme", "released")
	other := b.subscribe(t, "beta", "done")

	rec := b.create(t, "acme", "done")
	b.create(t, "beta", "done")
	b.complete(t, "acme", "done", rec.FencingToken, response(1))
	requireEvent(t, done, "a completion")
	requireNoEvent(t, released, "a completion")
	requireNoEvent(t, other, "a completion in another tenant")

	rec = b.create(t, "acme", "released")
	require.NoError(t, b.store.Release(b.ctx, idem.ReleaseParams{TenantID: "acme", Key: "released", FencingToken: rec.FencingToken}))
	requireEvent(t, released, "a release")
	requireNoEvent(t, other, "a release in another tenant")

	reaped := b.subscribe(t, "acme", "reaped")
	p := ClaimParams("acme", "reaped")
	p.Lease = 10 * time.Second
	p.ReaperThreshold = time.Minute
	b.claim(t, p)
	b.advance(2 * time.Minute)
	gone, err := b.store.Reap(b.ctx, idem.ReapParams{Limit: 100})
	require.NoError(t, err)
	require.Len(t, gone, 1)
	requireEvent(t, reaped, "a reap")

	deleted := b.subscribe(t, "acme", "tenant-deleted")
	b.create(t, "acme", "tenant-deleted")
	require.NoError(t, b.store.DeleteTenant(b.ctx, "acme"))
	requireEvent(t, deleted, "deleting the tenant")
	requireNoEvent(t, other, "deleting another tenant")
}

// testEventsClose: a closed subscription is removed at once; closing twice
// is harmless, and a key's other subscriptions still hear its events.
func testEventsClose(t *testing.T, s *suite) {
	b := s.setup(t)
	b.tenant(t, "acme")
	gone := b.subscribe(t, "acme", "k")
	kept := b.subscribe(t, "acme", "k")
	gone.Close()
	gone.Close()
	rec := b.create(t, "acme", "k")
	b.complete(t, "acme", "k", rec.FencingToken, response(1))
	requireEvent(t, kept, "a completion")
	requireNoEvent(t, gone, "a completion (closed subscription)")
}

// testEventsResolve: an operator's release or completion of an orphan
// wakes the key's subscriptions like the worker's own would.
func testEventsResolve(t *testing.T, s *suite) {
	b := s.setup(t)
	b.tenant(t, "acme")
	for _, action := range []idem.ResolveAction{idem.ResolveRelease, idem.ResolveComplete} {
		key := "resolved-" + string(action)
		sub := b.subscribe(t, "acme", key)
		rec := b.orphan(t, "acme", key)
		b.resolve(t, resolution("acme", key, action, rec.FencingToken))
		requireEvent(t, sub, "resolving an orphan ("+string(action)+")")
	}
}
