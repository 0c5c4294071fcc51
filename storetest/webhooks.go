package storetest

import (
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/eventpayload"
)

func webhookGroup() group {
	return group{"Webhooks", []testCase{
		{"EndpointLifecycle", testWebhookEndpointLifecycle},
		{"EndpointLimitKeptUnderConcurrency", testWebhookEndpointLimit},
		{"LeaseLostQueuedWithRefusal", testWebhookLeaseLost},
		{"ReapedInFlightQueuedByReaper", testWebhookReapedInFlight},
		{"OrphanedOncePerToken", testWebhookOrphanedOnce},
		{"FilterAndDisabledEndpoints", testWebhookFilter},
		{"ClaimLeaseAndFinish", testWebhookClaimLease},
		{"RetryAndDisableAfterSustainedFailure", testWebhookDisable},
		{"ClaimRaceTakesEachOnce", testWebhookClaimRace},
		{"ClaimTakesTenantsAndEndpointsInTurns", testWebhookClaimTurns},
		{"ClaimTakesLeastRecentlyServedTenantFirst", testWebhookClaimServed},
		{"OrphanWatchRaceReportsEachOnce", testWebhookOrphanRace},
		{"TestSend", testWebhookTestSend},
		{"ResolvedQueuedWithResolution", testWebhookResolved},
		{"FinishAfterTenantDeleted", testWebhookFinishAfterTenantDeleted},
	}}
}

// testWebhookFinishAfterTenantDeleted: the outcome of a delivery whose
// tenant (and so endpoint and delivery) was deleted while it was being
// sent is dropped without an error, and the tenant's deletion does not wait
// for it. On PostgreSQL the two racing is TestLockOrderTenantDeleteAndDeliveryFinish.
func testWebhookFinishAfterTenantDeleted(t *testing.T, s *suite) {
	b, e := s.setupEndpoint(t)
	ws := b.webhooks(t)
	b.sendTest(t, e)
	got := b.claimAll(t)
	require.Len(t, got, 1)
	require.NoError(t, b.store.DeleteTenant(b.ctx, idem.DeleteTenantParams{ID: "acme"}))
	for _, ok := range []bool{false, true} {
		require.NoError(t, ws.FinishWebhookDelivery(b.ctx, idem.FinishWebhookDeliveryParams{
			ID: got[0].ID, Attempts: got[0].Attempts, OK: ok, Status: 500, RetryIn: time.Minute,
			DisableAfter: time.Hour, DisableMinFailures: 3,
		}), "finishing (ok=%v) a delivery of a deleted tenant", ok)
	}
	b.advance(time.Hour)
	require.Empty(t, b.claimAll(t), "nothing of the deleted tenant is sent")
}

// webhooks returns the bundle's store's WebhookStore: every store must
// have one.
func (b *bundle) webhooks(t *testing.T) idem.WebhookStore {
	t.Helper()
	ws := b.store.Webhooks()
	require.NotNil(t, ws, "the store keeps no webhook outbox (idem.Driver.Webhooks)")
	return ws
}

// endpoint registers an enabled endpoint of tenant for events (nil: all).
func (b *bundle) endpoint(t *testing.T, tenant string, events ...idem.EventType) idem.WebhookEndpoint {
	t.Helper()
	e, err := b.webhooks(t).CreateWebhookEndpoint(b.ctx, idem.WebhookEndpoint{
		TenantID: tenant, ID: idem.NewWebhookEndpointID(), URL: "https://hooks.example.com/" + tenant,
		Secret: idem.NewWebhookSecret(), Events: events, Enabled: true,
	})
	require.NoError(t, err)
	return e
}

// sendTest queues a webhook.test event for endpoint e (whatever its
// filter) and returns it.
func (b *bundle) sendTest(t *testing.T, e idem.WebhookEndpoint) idem.Event {
	t.Helper()
	ev, err := eventpayload.NewEvent(e.TenantID, idem.EventWebhookTest, b.now(), nil)
	require.NoError(t, err)
	_, err = b.webhooks(t).SendTestEvent(b.ctx, idem.SendTestEventParams{EndpointID: e.ID, Event: ev})
	require.NoError(t, err)
	return ev
}

// setupEndpoint is setup with tenant acme and one endpoint of it
// (b.endpoint, subscribed to events): where most webhook cases start.
func (s *suite) setupEndpoint(t *testing.T, events ...idem.EventType) (*bundle, idem.WebhookEndpoint) {
	t.Helper()
	b := s.setup(t, "acme")
	return b, b.endpoint(t, "acme", events...)
}

// sendSpaced sends n test events to e (sendTest), a millisecond on the
// clock after each, so that events sent one after another are ordered by
// time, and returns their ids in order.
func (b *bundle) sendSpaced(t *testing.T, e idem.WebhookEndpoint, n int) []string {
	t.Helper()
	ids := make([]string, n)
	for i := range ids {
		ids[i] = b.sendTest(t, e).ID
		b.advance(time.Millisecond)
	}
	return ids
}

// deliveries lists an endpoint's delivery log, newest first.
func (b *bundle) deliveries(t *testing.T, e idem.WebhookEndpoint) []idem.WebhookDelivery {
	t.Helper()
	ds, err := b.webhooks(t).ListWebhookDeliveries(b.ctx, idem.ListWebhookDeliveriesParams{TenantID: e.TenantID, EndpointID: e.ID, Limit: 100})
	require.NoError(t, err)
	return ds
}

// eventTypes returns the types of ds, oldest first.
func eventTypes(ds []idem.WebhookDelivery) []idem.EventType {
	out := make([]idem.EventType, len(ds))
	for i, d := range ds {
		out[len(ds)-1-i] = d.EventType
	}
	return out
}

// claimAll claims every due delivery with a 1-minute lease.
func (b *bundle) claimAll(t *testing.T) []idem.WebhookDelivery {
	t.Helper()
	ds, err := b.webhooks(t).ClaimWebhookDeliveries(b.ctx, idem.ClaimWebhookDeliveriesParams{Limit: 100, PerTenant: 100, Served: nil, Lease: time.Minute})
	require.NoError(t, err)
	return ds
}

func testWebhookEndpointLifecycle(t *testing.T, s *suite) {
	b := s.setup(t)
	b.tenant(t, "acme")
	ws := b.webhooks(t)

	_, err := ws.CreateWebhookEndpoint(b.ctx, idem.WebhookEndpoint{TenantID: "ghost", ID: "ep_x", URL: "https://x", Secret: idem.NewWebhookSecret(), Enabled: true})
	requireCode(t, err, idem.ErrTenantUnknown)

	e := b.endpoint(t, "acme", idem.EventKeyOrphaned, idem.EventKeyLeaseLost)
	got, err := ws.GetWebhookEndpoint(b.ctx, idem.GetWebhookEndpointParams{TenantID: "acme", ID: e.ID})
	require.NoError(t, err)
	require.Equal(t, e.URL, got.URL)
	require.Equal(t, e.Secret, got.Secret)
	require.Equal(t, []idem.EventType{idem.EventKeyOrphaned, idem.EventKeyLeaseLost}, got.Events)
	require.True(t, got.Enabled)
	require.Equal(t, b.now(), got.CreatedAt)

	_, err = ws.GetWebhookEndpoint(b.ctx, idem.GetWebhookEndpointParams{TenantID: "other", ID: e.ID})
	requireCode(t, err, idem.ErrWebhookNotFound)

	got.URL, got.Events, got.Enabled = "https://hooks.example.com/v2", nil, false
	upd, err := ws.UpdateWebhookEndpoint(b.ctx, got)
	require.NoError(t, err)
	require.Equal(t, "https://hooks.example.com/v2", upd.URL)
	require.Empty(t, upd.Events)
	require.False(t, upd.Enabled)

	list, err := ws.ListWebhookEndpoints(b.ctx, idem.ListWebhookEndpointsParams{TenantID: "acme"})
	require.NoError(t, err)
	require.Len(t, list, 1)

	require.NoError(t, ws.DeleteWebhookEndpoint(b.ctx, idem.DeleteWebhookEndpointParams{TenantID: "acme", ID: e.ID}))
	requireCode(t, ws.DeleteWebhookEndpoint(b.ctx, idem.DeleteWebhookEndpointParams{TenantID: "acme", ID: e.ID}), idem.ErrWebhookNotFound)
	_, err = ws.UpdateWebhookEndpoint(b.ctx, got)
	requireCode(t, err, idem.ErrWebhookNotFound)
}

// A tenant has at most idem.MaxWebhookEndpoints endpoints, whatever the
// concurrency: of 8 creates racing for the last place one is created and
// the others get webhook_limit_reached; another tenant is not held to the
// first one's count; a delete makes room.
func testWebhookEndpointLimit(t *testing.T, s *suite) {
	b := s.setup(t)
	b.tenant(t, "acme")
	b.tenant(t, "other")
	ws := b.webhooks(t)
	var first idem.WebhookEndpoint
	for i := range idem.MaxWebhookEndpoints - 1 {
		e := b.endpoint(t, "acme")
		if i == 0 {
			first = e
		}
	}
	var mu sync.Mutex
	codes := map[idem.Code]int{}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			_, err := ws.CreateWebhookEndpoint(b.ctx, idem.WebhookEndpoint{TenantID: "acme", ID: idem.NewWebhookEndpointID(),
				URL: "https://hooks.example.com/race", Secret: idem.NewWebhookSecret(), Enabled: true})
			mu.Lock()
			codes[idem.ErrorCode(err)]++
			mu.Unlock()
		})
	}
	wg.Wait()
	require.Equal(t, map[idem.Code]int{"": 1, idem.CodeWebhookLimitReached: 7}, codes)
	list, err := ws.ListWebhookEndpoints(b.ctx, idem.ListWebhookEndpointsParams{TenantID: "acme"})
	require.NoError(t, err)
	require.Len(t, list, idem.MaxWebhookEndpoints)
	b.endpoint(t, "other")

	require.NoError(t, ws.DeleteWebhookEndpoint(b.ctx, idem.DeleteWebhookEndpointParams{TenantID: "acme", ID: first.ID}))
	b.endpoint(t, "acme")
}

// A write with a stale token is refused and its key.lease_lost event is
// stored by the same call; refusals that are not lease_lost store nothing.
func testWebhookLeaseLost(t *testing.T, s *suite) {
	b, e := s.setupEndpoint(t)

	rec := b.create(t, "acme", "k")
	stale := rec.FencingToken
	b.advance(defaultLease + time.Second)
	taken := b.claim(t, ClaimParams("acme", "k"))
	require.Equal(t, idem.ActionTakeover, taken.Action)

	_, err := b.store.Checkpoint(b.ctx, idem.CheckpointParams{TenantID: "acme", Key: "k", FencingToken: stale, RecoveryPoint: "x", Lease: time.Minute})
	requireCode(t, err, idem.ErrLeaseLost)
	_, err = b.store.Complete(b.ctx, idem.CompleteParams{TenantID: "acme", Key: "k", FencingToken: stale, Response: response(1)})
	requireCode(t, err, idem.ErrLeaseLost)
	requireCode(t, b.store.Release(b.ctx, idem.ReleaseParams{TenantID: "acme", Key: "k", FencingToken: stale}), idem.ErrLeaseLost)
	// Not lease_lost: no event.
	requireCode(t, b.store.Release(b.ctx, idem.ReleaseParams{TenantID: "acme", Key: "absent", FencingToken: 1}), idem.ErrKeyNotFound)

	ds := b.deliveries(t, e)
	require.Equal(t, []idem.EventType{idem.EventKeyLeaseLost, idem.EventKeyLeaseLost, idem.EventKeyLeaseLost}, eventTypes(ds))
	writes := map[string]bool{}
	for _, d := range ds {
		require.Equal(t, idem.DeliveryPending, d.State)
		full := b.claimOne(t, d.ID)
		var body struct {
			Type string                    `json:"type"`
			Data eventpayload.KeyEventData `json:"data"`
		}
		require.NoError(t, json.Unmarshal(full.Payload, &body))
		require.Equal(t, "key.lease_lost", body.Type)
		require.Equal(t, "k", body.Data.Key)
		require.Equal(t, stale, body.Data.StaleToken)
		require.Equal(t, taken.Record.FencingToken, body.Data.FencingToken)
		writes[body.Data.Write] = true
	}
	require.Equal(t, map[string]bool{"checkpoint": true, "complete": true, "release": true}, writes)
}

// claimOne claims due deliveries and returns the one with id.
func (b *bundle) claimOne(t *testing.T, id int64) idem.WebhookDelivery {
	t.Helper()
	for _, d := range b.claimAll(t) {
		if d.ID == id {
			return d
		}
	}
	// Claimed earlier in this loop: give it back by running past the lease.
	b.advance(2 * time.Minute)
	for _, d := range b.claimAll(t) {
		if d.ID == id {
			return d
		}
	}
	t.Fatalf("delivery %d not claimable", id)
	return idem.WebhookDelivery{}
}

func testWebhookReapedInFlight(t *testing.T, s *suite) {
	b, e := s.setupEndpoint(t)
	p := ClaimParams("acme", "orphan")
	p.ReaperThreshold = time.Minute
	b.claim(t, p)
	d := ClaimParams("acme", "done")
	d.ReaperThreshold = time.Minute
	done := b.claim(t, d).Record
	b.complete(t, "acme", "done", done.FencingToken, response(1))

	b.advance(2 * time.Minute)
	recs, err := b.store.Reap(b.ctx, idem.ReapParams{Limit: 10})
	require.NoError(t, err)
	require.Len(t, recs, 2)
	ds := b.deliveries(t, e)
	require.Equal(t, []idem.EventType{idem.EventKeyReapedInFlight}, eventTypes(ds), "only the in-flight record is reported")
	full := b.claimAll(t)
	require.Len(t, full, 1)
	require.Contains(t, string(full[0].Payload), `"key":"orphan"`)
}

func testWebhookOrphanedOnce(t *testing.T, s *suite) {
	b, e := s.setupEndpoint(t, idem.EventKeyOrphaned)
	ws := b.webhooks(t)
	b.create(t, "acme", "k")
	b.create(t, "acme", "running")

	n, err := ws.EmitOrphanEvents(b.ctx, idem.EmitOrphanEventsParams{Limit: 10})
	require.NoError(t, err)
	require.Zero(t, n, "no lease ran out yet")

	b.advance(defaultLease)
	b.checkpoint(t, idem.CheckpointParams{TenantID: "acme", Key: "running", FencingToken: b.get(t, "acme", "running").FencingToken, RecoveryPoint: "p", Lease: time.Hour})
	n, err = ws.EmitOrphanEvents(b.ctx, idem.EmitOrphanEventsParams{Limit: 10})
	require.NoError(t, err)
	require.Equal(t, 1, n)
	n, err = ws.EmitOrphanEvents(b.ctx, idem.EmitOrphanEventsParams{Limit: 10})
	require.NoError(t, err)
	require.Zero(t, n, "an orphan is reported once")
	require.Len(t, b.deliveries(t, e), 1)

	// A takeover gets a new token; orphaned again, it is reported again.
	b.claim(t, ClaimParams("acme", "k"))
	b.advance(defaultLease)
	n, err = ws.EmitOrphanEvents(b.ctx, idem.EmitOrphanEventsParams{Limit: 10})
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Len(t, b.deliveries(t, e), 2)
}

func testWebhookFilter(t *testing.T, s *suite) {
	b := s.setup(t)
	b.tenant(t, "acme")
	b.tenant(t, "other")
	all := b.endpoint(t, "acme")
	orphanedOnly := b.endpoint(t, "acme", idem.EventKeyOrphaned)
	lostOnly := b.endpoint(t, "acme", idem.EventKeyLeaseLost)
	off := b.endpoint(t, "acme")
	off.Enabled = false
	_, err := b.webhooks(t).UpdateWebhookEndpoint(b.ctx, off)
	require.NoError(t, err)
	otherTenant := b.endpoint(t, "other")

	rec := b.create(t, "acme", "k")
	requireCode(t, b.store.Release(b.ctx, idem.ReleaseParams{TenantID: "acme", Key: "k", FencingToken: rec.FencingToken + 1000}), idem.ErrLeaseLost)

	require.Len(t, b.deliveries(t, all), 1)
	require.Len(t, b.deliveries(t, lostOnly), 1)
	require.Empty(t, b.deliveries(t, orphanedOnly))
	require.Empty(t, b.deliveries(t, off))
	require.Empty(t, b.deliveries(t, otherTenant))
	require.Equal(t, b.deliveries(t, all)[0].EventID, b.deliveries(t, lostOnly)[0].EventID, "one event, one webhook-id for every endpoint")
}

func testWebhookClaimLease(t *testing.T, s *suite) {
	b, e := s.setupEndpoint(t)
	ws := b.webhooks(t)
	ev, err := eventpayload.NewEvent("acme", idem.EventWebhookTest, b.now(), map[string]string{"hello": "world"})
	require.NoError(t, err)
	queued, err := ws.SendTestEvent(b.ctx, idem.SendTestEventParams{EndpointID: e.ID, Event: ev})
	require.NoError(t, err)

	got := b.claimAll(t)
	require.Len(t, got, 1)
	d := got[0]
	require.Equal(t, queued.ID, d.ID)
	require.Equal(t, ev.ID, d.EventID)
	require.Equal(t, ev.Payload, d.Payload)
	require.Equal(t, e.URL, d.URL)
	require.Equal(t, e.Secret, d.Secret)
	require.Equal(t, 1, d.Attempts)
	require.Empty(t, b.claimAll(t), "a claimed delivery is not taken again while its lease runs")

	// The claimer died: after the lease the delivery is taken again, same id.
	b.advance(time.Minute)
	again := b.claimAll(t)
	require.Len(t, again, 1)
	require.Equal(t, ev.ID, again[0].EventID)
	require.Equal(t, 2, again[0].Attempts)

	// The first attempt's late outcome does not count.
	require.NoError(t, ws.FinishWebhookDelivery(b.ctx, idem.FinishWebhookDeliveryParams{ID: d.ID, Attempts: 1, OK: true, Status: 200}))
	require.Equal(t, idem.DeliveryPending, b.deliveries(t, e)[0].State)

	require.NoError(t, ws.FinishWebhookDelivery(b.ctx, idem.FinishWebhookDeliveryParams{ID: d.ID, Attempts: 2, OK: true, Status: 204}))
	log := b.deliveries(t, e)[0]
	require.Equal(t, idem.DeliveryDelivered, log.State)
	require.Equal(t, 204, log.LastStatus)
	require.Equal(t, b.now(), log.DeliveredAt)
	require.Nil(t, log.Payload, "the log omits payloads")
	b.advance(time.Hour)
	require.Empty(t, b.claimAll(t), "a delivered event is not sent again")

	// Purge keeps it until it is old enough.
	n, err := ws.PurgeWebhookDeliveries(b.ctx, idem.PurgeWebhookDeliveriesParams{OlderThan: 2 * time.Hour, Limit: 10})
	require.NoError(t, err)
	require.Zero(t, n)
	b.advance(2 * time.Hour)
	n, err = ws.PurgeWebhookDeliveries(b.ctx, idem.PurgeWebhookDeliveriesParams{OlderThan: 2 * time.Hour, Limit: 10})
	require.NoError(t, err)
	require.Equal(t, 1, n)
}

func testWebhookDisable(t *testing.T, s *suite) {
	b, e := s.setupEndpoint(t)
	ws := b.webhooks(t)
	b.sendTest(t, e)

	fail := func(retry time.Duration) {
		t.Helper()
		got := b.claimAll(t)
		require.Len(t, got, 1)
		require.NoError(t, ws.FinishWebhookDelivery(b.ctx, idem.FinishWebhookDeliveryParams{
			ID: got[0].ID, Attempts: got[0].Attempts, Status: 500, Error: "status 500", RetryIn: retry,
			DisableAfter: time.Hour, DisableMinFailures: 3,
		}))
	}
	fail(10 * time.Minute)
	log := b.deliveries(t, e)[0]
	require.Equal(t, idem.DeliveryPending, log.State)
	require.Equal(t, b.now().Add(10*time.Minute), log.NextAttemptAt)
	require.Equal(t, "status 500", log.LastError)
	require.Empty(t, b.claimAll(t), "not due before its retry")

	b.advance(10 * time.Minute)
	fail(time.Hour)
	b.advance(time.Hour)
	got, err := ws.GetWebhookEndpoint(b.ctx, idem.GetWebhookEndpointParams{TenantID: "acme", ID: e.ID})
	require.NoError(t, err)
	require.True(t, got.Enabled, "two failures are not yet sustained")
	require.Equal(t, 2, got.ConsecutiveFailures)
	fail(time.Hour) // third failure, 70 minutes into the streak
	got, err = ws.GetWebhookEndpoint(b.ctx, idem.GetWebhookEndpointParams{TenantID: "acme", ID: e.ID})
	require.NoError(t, err)
	require.False(t, got.Enabled, "three failures over an hour disable it")
	require.Equal(t, "sustained_failure", got.DisabledReason)

	b.advance(2 * time.Hour)
	require.Empty(t, b.claimAll(t), "a disabled endpoint gets nothing")

	got.Enabled = true
	got, err = ws.UpdateWebhookEndpoint(b.ctx, got)
	require.NoError(t, err)
	require.Zero(t, got.ConsecutiveFailures)
	require.Empty(t, got.DisabledReason)
	require.Len(t, b.claimAll(t), 1, "re-enabled, the pending delivery goes out again")

	// Giving up makes it failed for good.
	b.advance(2 * time.Minute)
	fail(0)
	require.Equal(t, idem.DeliveryFailed, b.deliveries(t, e)[0].State)
	b.advance(24 * time.Hour)
	require.Empty(t, b.claimAll(t))
}

// Concurrent claimers take every due delivery exactly once.
func testWebhookClaimRace(t *testing.T, s *suite) {
	b, e := s.setupEndpoint(t)
	ws := b.webhooks(t)
	const events = 40
	for range events {
		b.sendTest(t, e)
	}
	var mu sync.Mutex
	seen := map[int64]int{}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for {
				got, err := ws.ClaimWebhookDeliveries(b.ctx, idem.ClaimWebhookDeliveriesParams{Limit: 3, PerTenant: 2, Served: nil, Lease: time.Minute})
				if err != nil {
					t.Error(err)
					return
				}
				if len(got) == 0 {
					return
				}
				mu.Lock()
				for _, d := range got {
					seen[d.ID]++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	require.Len(t, seen, events)
	for id, n := range seen {
		require.Equal(t, 1, n, "delivery %d claimed %d times", id, n)
	}
}

// A claim takes at most perTenant deliveries of one tenant, spread over
// its endpoints in turns, and the tenants in turns (each tenant's first,
// then each one's second, each turn oldest first), and returns them in
// that order: one tenant's older backlog, on one endpoint or several, does
// not fill the claim ahead of another tenant's delivery, nor one endpoint's
// ahead of its tenant's other endpoint. Within an endpoint the order stays
// oldest first, and nothing is skipped.
func testWebhookClaimTurns(t *testing.T, s *suite) {
	b := s.setup(t)
	b.tenant(t, "acme")
	b.tenant(t, "beta")
	a, z := b.endpoint(t, "acme"), b.endpoint(t, "beta")
	a2 := b.endpoint(t, "acme")
	ws := b.webhooks(t)
	as, zs := b.sendSpaced(t, a, 5), b.sendSpaced(t, z, 2)
	claim := func(limit, perTenant int) []string {
		t.Helper()
		got, err := ws.ClaimWebhookDeliveries(b.ctx, idem.ClaimWebhookDeliveriesParams{Limit: limit, PerTenant: perTenant, Served: nil, Lease: time.Minute})
		require.NoError(t, err)
		ids := []string{}
		for _, d := range got {
			require.Equal(t, 1, d.Attempts)
			ids = append(ids, d.EventID)
		}
		return ids
	}
	require.Equal(t, []string{as[0], zs[0], as[1]}, claim(3, 2))
	require.Equal(t, []string{as[2], zs[1], as[3]}, claim(10, 2))
	require.Equal(t, []string{as[4]}, claim(10, 2))
	require.Empty(t, claim(10, 2))

	// Two endpoints of acme: each one's oldest before either one's second.
	as = b.sendSpaced(t, a, 3)
	a2s := b.sendSpaced(t, a2, 2)
	zs = b.sendSpaced(t, z, 1)
	require.Equal(t, []string{as[0], zs[0], a2s[0]}, claim(10, 2))
	require.Equal(t, []string{as[1], a2s[1]}, claim(10, 2))
	require.Equal(t, []string{as[2]}, claim(10, 2))
	require.Empty(t, claim(10, 2))
}

// Within a turn the claim takes the tenants least recently served first
// (per the caller's served map; a tenant missing from it first), then
// oldest first: a caller that claims one free slot at a time reaches a
// tenant with one new delivery before going back to another tenant's
// older backlog. Tenant ids that need quoting in a JSON path still match.
func testWebhookClaimServed(t *testing.T, s *suite) {
	b := s.setup(t)
	const odd = `a.b"c[0]$ é`
	b.tenant(t, "acme")
	b.tenant(t, "beta")
	b.tenant(t, odd)
	a, z, o := b.endpoint(t, "acme"), b.endpoint(t, "beta"), b.endpoint(t, odd)
	ws := b.webhooks(t)
	as, ods := b.sendSpaced(t, a, 3), b.sendSpaced(t, o, 2)
	z0 := b.sendSpaced(t, z, 1)[0]
	claim := func(limit int, served map[string]int64) []string {
		t.Helper()
		got, err := ws.ClaimWebhookDeliveries(b.ctx, idem.ClaimWebhookDeliveriesParams{Limit: limit, PerTenant: 8, Served: served, Lease: time.Minute})
		require.NoError(t, err)
		ids := []string{}
		for _, d := range got {
			ids = append(ids, d.EventID)
		}
		return ids
	}
	// Nothing served yet: oldest first.
	require.Equal(t, []string{as[0]}, claim(1, nil))
	// acme served: the odd tenant's (older than beta's), then beta's.
	require.Equal(t, []string{ods[0]}, claim(1, map[string]int64{"acme": 1}))
	require.Equal(t, []string{z0}, claim(1, map[string]int64{"acme": 1, odd: 2}))
	// Everyone served: least recently first, each tenant's first turn
	// before anyone's second.
	require.Equal(t, []string{ods[1], as[1], as[2]}, claim(10, map[string]int64{"acme": 4, "beta": 3, odd: 2}))
	require.Empty(t, claim(10, nil))
}

func testWebhookTestSend(t *testing.T, s *suite) {
	b, e := s.setupEndpoint(t, idem.EventKeyOrphaned)
	ws := b.webhooks(t)
	ev, err := eventpayload.NewEvent("acme", idem.EventWebhookTest, b.now(), nil)
	require.NoError(t, err)
	d, err := ws.SendTestEvent(b.ctx, idem.SendTestEventParams{EndpointID: e.ID, Event: ev})
	require.NoError(t, err, "a test event ignores the filter")
	require.Equal(t, idem.EventWebhookTest, d.EventType)
	require.Equal(t, idem.DeliveryPending, d.State)

	_, err = ws.SendTestEvent(b.ctx, idem.SendTestEventParams{EndpointID: "ep_missing", Event: ev})
	requireCode(t, err, idem.ErrWebhookNotFound)
	other, err := eventpayload.NewEvent("other", idem.EventWebhookTest, b.now(), nil)
	require.NoError(t, err)
	_, err = ws.SendTestEvent(b.ctx, idem.SendTestEventParams{EndpointID: e.ID, Event: other})
	requireCode(t, err, idem.ErrWebhookNotFound, "another tenant's endpoint")

	// A disabled endpoint is delivered nothing, so a test send to it would
	// wait forever: it is refused as disabled, not as missing.
	off := e
	off.Enabled = false
	_, err = ws.UpdateWebhookEndpoint(b.ctx, off)
	require.NoError(t, err)
	_, err = ws.SendTestEvent(b.ctx, idem.SendTestEventParams{EndpointID: e.ID, Event: ev})
	requireCode(t, err, idem.ErrWebhookDisabled, "a disabled endpoint")
}

// Every resolution queues key.resolved in its own transaction; a refused
// one queues nothing.
func testWebhookResolved(t *testing.T, s *suite) {
	b, e := s.setupEndpoint(t, idem.EventKeyResolved)
	for i, a := range []idem.ResolveAction{idem.ResolveReview, idem.ResolveComplete} {
		key := fmt.Sprintf("k%d", i)
		rec := b.orphan(t, "acme", key)
		b.resolve(t, resolution("acme", key, a, rec.FencingToken))
	}
	rel := b.orphan(t, "acme", "rel")
	b.resolve(t, resolution("acme", "rel", idem.ResolveRelease, rel.FencingToken))
	_, err := b.store.Resolve(b.ctx, resolution("acme", "absent", idem.ResolveRelease, 1))
	requireCode(t, err, idem.ErrKeyNotFound)

	ds := b.deliveries(t, e)
	require.Equal(t, []idem.EventType{idem.EventKeyResolved, idem.EventKeyResolved, idem.EventKeyResolved}, eventTypes(ds))
	var actions []string
	for _, d := range b.claimAll(t) {
		var body struct {
			Data eventpayload.KeyEventData `json:"data"`
		}
		require.NoError(t, json.Unmarshal(d.Payload, &body))
		require.Equal(t, operator.Subject, body.Data.Actor)
		require.NotContains(t, string(d.Payload), "note on", "the audit note is not sent")
		actions = append(actions, body.Data.Action)
	}
	require.ElementsMatch(t, []string{"review", "complete", "release"}, actions)
}

// Concurrent orphan watches (replicas) report every orphan exactly once.
func testWebhookOrphanRace(t *testing.T, s *suite) {
	b, e := s.setupEndpoint(t, idem.EventKeyOrphaned)
	ws := b.webhooks(t)
	const orphans = 30
	for i := range orphans {
		b.create(t, "acme", fmt.Sprintf("k%d", i))
	}
	b.advance(defaultLease)
	var mu sync.Mutex
	total := 0
	var wg sync.WaitGroup
	for range 6 {
		wg.Go(func() {
			for {
				n, err := ws.EmitOrphanEvents(b.ctx, idem.EmitOrphanEventsParams{Limit: 4})
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				total += n
				mu.Unlock()
				if n == 0 {
					return
				}
			}
		})
	}
	wg.Wait()
	require.Equal(t, orphans, total, "orphans marked")
	keys := map[string]int{}
	for _, d := range b.claimAll(t) {
		var body struct {
			Data eventpayload.KeyEventData `json:"data"`
		}
		require.NoError(t, json.Unmarshal(d.Payload, &body))
		keys[body.Data.Key]++
	}
	require.Len(t, keys, orphans)
	for k, n := range keys {
		require.Equal(t, 1, n, "orphan %s reported %d times", k, n)
	}
	require.Len(t, b.deliveries(t, e), orphans)
}
