package webhooks_test

import (
	"context"
	"errors"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/eventpayload"
	"github.com/idem-dev/idem/postgres"
	"github.com/idem-dev/idem/sqlite"
	"github.com/idem-dev/idem/testkit/pgtest"
	"github.com/idem-dev/idem/testkit/webhookreceiver"
	"github.com/idem-dev/idem/webhooks"
)

// store is a store under test and a way to open another handle (replica)
// on the same database. Both run on the database clock: the deliverer's
// retries wait in real (short) time.
type store interface {
	idem.Store
	idem.WebhookStore
}

func forEachBackend(t *testing.T, fn func(t *testing.T, open func(t *testing.T) store)) {
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		path := filepath.Join(t.TempDir(), "idem.db")
		fn(t, func(t *testing.T) store {
			s, err := sqlite.Open(context.Background(), path, sqlite.Options{})
			require.NoError(t, err)
			t.Cleanup(func() { _ = s.Close() })
			return s
		})
	})
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		url := pgtest.URL(t)
		fn(t, func(t *testing.T) store {
			s, err := postgres.Open(context.Background(), url, postgres.Options{})
			require.NoError(t, err)
			t.Cleanup(func() { _ = s.Close() })
			return s
		})
	})
}

// register creates tenant "acme" (if needed) and an endpoint at r.
func register(t *testing.T, s store, r *webhookreceiver.Receiver) idem.WebhookEndpoint {
	t.Helper()
	return registerIn(t, s, "acme", r)
}

// registerIn creates tenant (if needed) and an endpoint of it at r.
func registerIn(t *testing.T, s store, tenant string, r *webhookreceiver.Receiver) idem.WebhookEndpoint {
	t.Helper()
	ctx := context.Background()
	if _, err := s.GetTenant(ctx, idem.GetTenantParams{ID: tenant}); err != nil {
		_, err := s.CreateTenant(ctx, idem.CreateTenantParams{ID: tenant, Name: tenant, Settings: idem.DefaultSettings()})
		require.NoError(t, err)
	}
	e, err := s.CreateWebhookEndpoint(ctx, idem.WebhookEndpoint{
		TenantID: tenant, ID: idem.NewWebhookEndpointID(), URL: r.URL + "/hook", Secret: idem.NewWebhookSecret(), Enabled: true,
	})
	require.NoError(t, err)
	r.SetSecret(e.Secret)
	return e
}

// testEvent queues one test event for e and returns its webhook-id.
func testEvent(t *testing.T, s store, e idem.WebhookEndpoint) string {
	t.Helper()
	ev, err := eventpayload.NewEvent(e.TenantID, idem.EventWebhookTest, time.Now(), map[string]int{"n": 1})
	require.NoError(t, err)
	_, err = s.SendTestEvent(context.Background(), idem.SendTestEventParams{EndpointID: e.ID, Event: ev})
	require.NoError(t, err)
	return ev.ID
}

// fastConfig retries within milliseconds and allows loopback.
func fastConfig() webhooks.Config {
	return webhooks.Config{
		Interval: 20 * time.Millisecond, Timeout: 300 * time.Millisecond, Lease: 2 * time.Second,
		RetryBase: 20 * time.Millisecond, RetryCap: 100 * time.Millisecond, MaxAge: time.Hour,
		AllowPrivate: true,
	}
}

// run runs a deliverer until the test ends.
func run(t *testing.T, d *webhooks.Deliverer) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = d.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

// logOf returns the endpoint's delivery log.
func logOf(t *testing.T, s store, e idem.WebhookEndpoint) []idem.WebhookDelivery {
	t.Helper()
	ds, err := s.ListWebhookDeliveries(context.Background(), idem.ListWebhookDeliveriesParams{TenantID: e.TenantID, EndpointID: e.ID, Limit: 1000})
	require.NoError(t, err)
	return ds
}

// A receiver that fails twice, times out once and then recovers gets the
// event four times, every time with the same webhook-id and a valid
// signature, and the log says delivered after four attempts.
func TestDeliveryRetriesUntilReceiverRecovers(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) store) {
		s := open(t)
		r := webhookreceiver.New(t, func(n int) webhookreceiver.Answer {
			switch n {
			case 0:
				return webhookreceiver.Answer{Status: 500}
			case 1:
				return webhookreceiver.Answer{Status: 503}
			case 2:
				return webhookreceiver.Answer{Status: 200, Hang: 6 * time.Second} // past the 2 s timeout
			}
			return webhookreceiver.Answer{Status: 204}
		})
		e := register(t, s, r)
		id := testEvent(t, s, e)
		// Exactly four attempts: the timeout is far above a loopback answer
		// even on a loaded machine (with 300 ms, a loaded run saw the 204
		// itself time out and a fifth attempt, rightly), and far below the
		// third answer's hang.
		cfg := fastConfig()
		cfg.Timeout, cfg.Lease = 2*time.Second, 10*time.Second
		run(t, webhooks.New(s, cfg, nil, nil))

		require.Eventually(t, func() bool { return logOf(t, s, e)[0].State == idem.DeliveryDelivered }, 20*time.Second, 20*time.Millisecond)
		require.Empty(t, r.Bad(), "every request carries a valid signature")
		require.Equal(t, map[string]int{id: 4}, r.ByID(), "same webhook-id on every attempt")
		require.Equal(t, 1, r.Acked()[id])
		log := logOf(t, s, e)[0]
		require.Equal(t, 4, log.Attempts)
		require.Equal(t, 204, log.LastStatus)
	})
}

// Events the store queued with state changes (a refused stale write) go
// out signed, with the Standard Webhooks payload.
func TestDeliveryOfLeaseLost(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) store) {
		s := open(t)
		r := webhookreceiver.New(t, webhookreceiver.Always(200))
		e := register(t, s, r)
		ctx := context.Background()
		rec, err := s.Claim(ctx, idem.ClaimParams{TenantID: "acme", Key: "k", Operation: "op", Fingerprint: "fp", Lease: time.Minute, ReplayWindow: time.Hour, ReaperThreshold: time.Hour})
		require.NoError(t, err)
		err = s.Release(ctx, idem.ReleaseParams{TenantID: "acme", Key: "k", FencingToken: rec.Record.FencingToken - 1})
		require.ErrorIs(t, err, idem.ErrLeaseLost)
		run(t, webhooks.New(s, fastConfig(), nil, nil))
		require.Eventually(t, func() bool { return logOf(t, s, e)[0].State == idem.DeliveryDelivered }, 10*time.Second, 20*time.Millisecond)
		require.Empty(t, r.Bad())
		reqs := r.Requests()
		require.Len(t, reqs, 1)
		require.Equal(t, "key.lease_lost", reqs[0].Type)
		require.Contains(t, reqs[0].Body, `"write":"release"`)
	})
}

// Without AllowPrivate nothing is sent to a loopback receiver, even though
// the URL got into the store: the address is checked at connect time.
func TestDeliveryRefusesPrivateTarget(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) store) {
		s := open(t)
		r := webhookreceiver.New(t, webhookreceiver.Always(200))
		e := register(t, s, r)
		testEvent(t, s, e)
		cfg := fastConfig()
		cfg.AllowPrivate = false
		d := webhooks.New(s, cfg, nil, nil)
		n, err := d.DeliverOnce(context.Background())
		require.NoError(t, err)
		require.Equal(t, 1, n)
		require.Empty(t, r.Requests(), "the loopback receiver was reached")
		log := logOf(t, s, e)[0]
		require.Equal(t, idem.DeliveryPending, log.State)
		require.Equal(t, "refused: the target resolves to a private or reserved address", log.LastError)
		require.NotContains(t, log.LastError, r.URL, "the log holds no URL")
	})
}

// An endpoint whose attempts keep failing is disabled once the streak is
// long and old enough, and gets nothing more.
func TestDeliveryDisablesFailingEndpoint(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) store) {
		s := open(t)
		r := webhookreceiver.New(t, webhookreceiver.Always(500))
		e := register(t, s, r)
		testEvent(t, s, e)
		cfg := fastConfig()
		cfg.DisableAfter, cfg.DisableMinFailures = time.Millisecond, 3
		run(t, webhooks.New(s, cfg, nil, nil))
		require.Eventually(t, func() bool {
			got, err := s.GetWebhookEndpoint(context.Background(), idem.GetWebhookEndpointParams{TenantID: "acme", ID: e.ID})
			require.NoError(t, err)
			return !got.Enabled
		}, 10*time.Second, 20*time.Millisecond)
		got, err := s.GetWebhookEndpoint(context.Background(), idem.GetWebhookEndpointParams{TenantID: "acme", ID: e.ID})
		require.NoError(t, err)
		require.Equal(t, "sustained_failure", got.DisabledReason)
		require.GreaterOrEqual(t, got.ConsecutiveFailures, 3)
		before := len(r.Requests())
		time.Sleep(300 * time.Millisecond) // several poll intervals
		require.Len(t, r.Requests(), before, "a disabled endpoint got more attempts")
	})
}

// Two replicas' deliverers on one PostgreSQL database deliver each of many
// events exactly once when nothing fails (SKIP LOCKED claims).
func TestTwoReplicasDeliverEachEventOnce(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	open := func() store {
		s, err := postgres.Open(context.Background(), url, postgres.Options{})
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Close() })
		return s
	}
	a, b := open(), open()
	r := webhookreceiver.New(t, webhookreceiver.Always(200))
	e := register(t, a, r)
	const events = 200
	ids := map[string]bool{}
	for range events {
		ids[testEvent(t, a, e)] = true
	}
	cfg := fastConfig()
	cfg.BatchSize = 5
	// An attempt that outlives its timeout or lease is rightly sent again;
	// what this test holds the claims to is that no delivery is taken by
	// both replicas, so a loaded machine must not make attempts time out
	// (CI saw 3 of 200 sent twice with the 300 ms timeout).
	cfg.Timeout, cfg.Lease = 10*time.Second, time.Minute
	run(t, webhooks.New(a, cfg, nil, nil))
	run(t, webhooks.New(b, cfg, nil, nil))
	require.Eventually(t, func() bool { return len(r.Acked()) == events }, 30*time.Second, 20*time.Millisecond)
	require.Empty(t, r.Bad())
	require.Len(t, r.Requests(), events, "some event was delivered twice")
	for id, n := range r.ByID() {
		require.True(t, ids[id])
		require.Equal(t, 1, n)
	}
}

// An attempt cut short by shutting down is not the endpoint's failure:
// nothing is recorded, and the delivery goes out again after its lease.
func TestShutdownMidAttemptRecordsNoFailure(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) store) {
		s := open(t)
		r := webhookreceiver.New(t, func(n int) webhookreceiver.Answer {
			if n == 0 {
				return webhookreceiver.Answer{Status: 200, Hang: time.Minute}
			}
			return webhookreceiver.Answer{Status: 200}
		})
		e := register(t, s, r)
		id := testEvent(t, s, e)
		cfg := fastConfig()
		cfg.Timeout, cfg.Lease = 10*time.Second, 500*time.Millisecond
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { _ = webhooks.New(s, cfg, nil, nil).Run(ctx); close(done) }()
		require.Eventually(t, func() bool { return len(r.Requests()) == 1 }, 10*time.Second, 10*time.Millisecond)
		cancel()
		<-done
		got, err := s.GetWebhookEndpoint(context.Background(), idem.GetWebhookEndpointParams{TenantID: "acme", ID: e.ID})
		require.NoError(t, err)
		require.Zero(t, got.ConsecutiveFailures, "shutting down counted as the endpoint's failure")
		log := logOf(t, s, e)[0]
		require.Equal(t, idem.DeliveryPending, log.State)
		require.Empty(t, log.LastError)

		run(t, webhooks.New(s, cfg, nil, nil))
		require.Eventually(t, func() bool { return r.Acked()[id] == 1 }, 10*time.Second, 20*time.Millisecond)
		require.Equal(t, 2, r.ByID()[id], "sent again, same webhook-id")
	})
}

// One tenant's slow, busy endpoint does not hold back another tenant's
// delivery: tenant A queues many events to an endpoint that takes a while
// to answer, then tenant B queues one to an endpoint that answers at once.
// B's event goes out in the first pass, while A's queue is still pending
// (at most one pass's share, Concurrency, of A's went before it), and every
// one of A's events is still delivered, once, with its webhook-id. Before
// the claim capped one endpoint's share, the claim took the oldest due
// deliveries whoever they were for and the dispatcher waited for the whole
// batch: B's event went out only after A's whole queue had.
func TestSlowEndpointDoesNotHoldBackOtherTenants(t *testing.T) {
	t.Parallel()
	testSlowTenant(t, 1, 12)
}

// The same with tenant A's backlog spread over several slow endpoints:
// the claim caps one tenant's share, not only one endpoint's. Before, each
// of A's endpoints gave its own share and A's oldest deliveries filled the
// batch ahead of B's.
func TestSlowEndpointsOfOneTenantDoNotHoldBackOtherTenants(t *testing.T) {
	t.Parallel()
	testSlowTenant(t, 4, 3)
}

// testSlowTenant queues perEndpoint events to each of endpoints slow
// endpoints of tenant A, then one to tenant B's fast endpoint, runs the
// delivery job (2 attempts at once, batches of 4) and requires B's event to
// arrive while at most one pass's share of A's had been answered, and every
// one of A's to be delivered once.
func testSlowTenant(t *testing.T, endpoints, perEndpoint int) {
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) store) {
		s := open(t)
		// One receiver per endpoint of A: each checks its own secret.
		var rAs []*webhookreceiver.Receiver
		var eAs []idem.WebhookEndpoint
		for range endpoints {
			r := webhookreceiver.New(t, func(int) webhookreceiver.Answer {
				return webhookreceiver.Answer{Status: 200, Hang: 150 * time.Millisecond}
			})
			rAs = append(rAs, r)
			eAs = append(eAs, registerIn(t, s, "slow-a", r))
		}
		ackedA := func() int {
			n := 0
			for _, r := range rAs {
				n += len(r.Acked())
			}
			return n
		}
		aAckedAtB := atomic.Int64{}
		aAckedAtB.Store(-1)
		rB := webhookreceiver.New(t, func(n int) webhookreceiver.Answer {
			if n == 0 {
				aAckedAtB.Store(int64(ackedA()))
			}
			return webhookreceiver.Answer{Status: 204}
		})
		eB := registerIn(t, s, "fast-b", rB)
		queued := endpoints * perEndpoint
		idsA := map[string]bool{}
		for _, eA := range eAs {
			for range perEndpoint {
				idsA[testEvent(t, s, eA)] = true
			}
		}
		idB := testEvent(t, s, eB)

		cfg := fastConfig()
		cfg.Timeout, cfg.Concurrency, cfg.BatchSize = time.Second, 2, 4
		run(t, webhooks.New(s, cfg, nil, nil))

		require.Eventually(t, func() bool { return rB.Acked()[idB] == 1 }, 10*time.Second, 10*time.Millisecond)
		ahead := aAckedAtB.Load()
		require.GreaterOrEqual(t, ahead, int64(0))
		require.LessOrEqual(t, ahead, int64(cfg.Concurrency),
			"tenant B's delivery waited for %d of tenant A's %d queued deliveries", ahead, queued)

		require.Eventually(t, func() bool { return ackedA() == queued }, 20*time.Second, 20*time.Millisecond)
		require.Empty(t, rB.Bad())
		sent := 0
		for _, r := range rAs {
			require.Empty(t, r.Bad())
			sent += len(r.Requests())
			for id, n := range r.ByID() {
				require.True(t, idsA[id])
				require.Equal(t, 1, n, "an event of A was sent twice")
			}
		}
		require.Equal(t, queued, sent, "an event of A was sent twice")
		for _, eA := range eAs {
			require.Eventually(t, func() bool {
				for _, d := range logOf(t, s, eA) {
					if d.State != idem.DeliveryDelivered {
						return false
					}
				}
				return true
			}, 10*time.Second, 20*time.Millisecond, "the log records every delivery of A")
			for _, d := range logOf(t, s, eA) {
				require.Equal(t, 1, d.Attempts)
			}
		}
	})
}

// Several slow tenants do not hold back a fast one for a whole pass: three
// tenants queue a backlog each to endpoints that answer after a while; once
// their first attempts are under way tenant B queues one event to an
// endpoint that answers at once. B's event must go out in one of the first
// two slots that free up after it was queued (the job runs two attempts at
// a time: one may go to the slow tenant not yet served), so at most two of
// the slow tenants' deliveries are answered between B's event being queued
// and reaching B; every delivery of every tenant is still delivered once,
// and logged so. Before the job became a pool that claims for each freed
// slot, least recently served tenant first, it waited for a whole claimed
// batch (all three backlogs' share) before claiming B's; a pool claiming
// oldest first would have sent every older slow delivery first.
func TestSlowTenantsDoNotHoldBackAFastOneForAPass(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) store) {
		s := open(t)
		const slowTenants, backlog = 3, 3
		var rs []*webhookreceiver.Receiver
		var es []idem.WebhookEndpoint
		ids := map[string]bool{}
		for i := range slowTenants {
			r := webhookreceiver.New(t, func(int) webhookreceiver.Answer {
				return webhookreceiver.Answer{Status: 200, Hang: 100 * time.Millisecond}
			})
			rs = append(rs, r)
			e := registerIn(t, s, "slow-"+string(rune('a'+i)), r)
			es = append(es, e)
		}
		for range backlog {
			for _, e := range es {
				ids[testEvent(t, s, e)] = true
			}
		}
		slowAcked := func() int {
			n := 0
			for _, r := range rs {
				n += len(r.Acked())
			}
			return n
		}
		slowSent := func() int {
			n := 0
			for _, r := range rs {
				n += len(r.Requests())
			}
			return n
		}
		atB := atomic.Int64{}
		atB.Store(-1)
		rB := webhookreceiver.New(t, func(n int) webhookreceiver.Answer {
			if n == 0 {
				atB.Store(int64(slowAcked()))
			}
			return webhookreceiver.Answer{Status: 204}
		})
		eB := registerIn(t, s, "fast-b", rB)

		cfg := fastConfig()
		cfg.Timeout, cfg.Concurrency = time.Second, 2
		run(t, webhooks.New(s, cfg, nil, nil))

		require.Eventually(t, func() bool { return slowSent() > 0 }, 10*time.Second, time.Millisecond)
		atQueue := slowAcked()
		idB := testEvent(t, s, eB)
		require.Eventually(t, func() bool { return rB.Acked()[idB] == 1 }, 10*time.Second, 5*time.Millisecond)
		ahead := atB.Load() - int64(atQueue)
		require.GreaterOrEqual(t, atB.Load(), int64(0))
		// The Concurrency attempts in flight when B's event is queued may
		// end before B's request arrives, and so may one more: a claim that
		// read the outbox before B's event was committed (a loaded machine
		// widens that window; CI saw 3). A whole pass of the slow tenants
		// would be 9 (8 before the fix).
		require.LessOrEqual(t, ahead, int64(cfg.Concurrency+1),
			"tenant B's delivery waited for %d of the slow tenants' deliveries queued before it", ahead)

		require.Eventually(t, func() bool { return slowAcked() == slowTenants*backlog }, 20*time.Second, 10*time.Millisecond)
		require.Empty(t, rB.Bad())
		require.Len(t, rB.Requests(), 1, "B's event was sent twice")
		for i, r := range rs {
			require.Empty(t, r.Bad())
			require.Len(t, r.Requests(), backlog, "an event of a slow tenant was sent twice")
			for id, n := range r.ByID() {
				require.True(t, ids[id])
				require.Equal(t, 1, n)
			}
			require.Eventually(t, func() bool {
				for _, d := range logOf(t, s, es[i]) {
					if d.State != idem.DeliveryDelivered || d.Attempts != 1 {
						return false
					}
				}
				return true
			}, 10*time.Second, 10*time.Millisecond, "the log records every delivery once")
		}
		require.Eventually(t, func() bool {
			log := logOf(t, s, eB)
			return len(log) == 1 && log[0].State == idem.DeliveryDelivered && log[0].Attempts == 1
		}, 10*time.Second, 10*time.Millisecond)
	})
}

// A lone tenant with a backlog gets every slot of the pool, and never more:
// at most Concurrency of its requests are unanswered at any time, and at
// some point all Concurrency are (no slot is held back for tenants that
// have nothing due). Each delivery still goes out once.
func TestLoneTenantGetsEverySlotAndNoMore(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) store) {
		s := open(t)
		var r *webhookreceiver.Receiver
		var most atomic.Int64
		r = webhookreceiver.New(t, func(n int) webhookreceiver.Answer {
			// Requests that arrived (this one too) less those answered:
			// the deliverer frees a slot only after the answer, so its
			// attempts in flight are at least this many.
			open := int64(n + 1 - len(r.Acked()))
			for m := most.Load(); open > m && !most.CompareAndSwap(m, open); m = most.Load() {
			}
			return webhookreceiver.Answer{Status: 200, Hang: 100 * time.Millisecond}
		})
		e := register(t, s, r)
		const events = 12
		for range events {
			testEvent(t, s, e)
		}
		cfg := fastConfig()
		// A long Interval: the slots must be filled by the claims made
		// for free slots, not by a later poll.
		cfg.Timeout, cfg.Concurrency, cfg.Interval = time.Second, 4, 5*time.Second
		run(t, webhooks.New(s, cfg, nil, nil))
		require.Eventually(t, func() bool { return len(r.Acked()) == events }, 20*time.Second, 10*time.Millisecond)
		require.Equal(t, int64(cfg.Concurrency), most.Load(), "attempts in flight at most")
		require.Empty(t, r.Bad())
		require.Len(t, r.Requests(), events, "an event was sent twice")
	})
}

// failingClaims fails the first fail claims and records when each claim
// came and what it returned.
type failingClaims struct {
	idem.WebhookStore
	mu    sync.Mutex
	fail  int
	calls []claimCall
}

type claimCall struct {
	at  time.Time
	n   int
	err error
}

func (f *failingClaims) ClaimWebhookDeliveries(ctx context.Context, p idem.ClaimWebhookDeliveriesParams) ([]idem.WebhookDelivery, error) {
	f.mu.Lock()
	failing := len(f.calls) < f.fail
	f.mu.Unlock()
	var got []idem.WebhookDelivery
	err := errors.New("store down")
	if !failing {
		got, err = f.WebhookStore.ClaimWebhookDeliveries(ctx, p)
	}
	f.mu.Lock()
	f.calls = append(f.calls, claimCall{time.Now(), len(got), err})
	f.mu.Unlock()
	return got, err
}

func (f *failingClaims) log() []claimCall {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]claimCall(nil), f.calls...)
}

// A failing claim is retried after Interval, not at once (no tight loop on
// a store that fails), and the delivery goes out once the store answers;
// with nothing due and nothing in flight the job polls every Interval, not
// faster.
func TestClaimBacksOffOnStoreErrorsAndPollsWhenIdle(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) store) {
		s := open(t)
		r := webhookreceiver.New(t, webhookreceiver.Always(200))
		e := register(t, s, r)
		id := testEvent(t, s, e)
		cfg := fastConfig()
		cfg.Interval = 50 * time.Millisecond
		fs := &failingClaims{WebhookStore: s, fail: 3}
		run(t, webhooks.New(fs, cfg, nil, nil))
		require.Eventually(t, func() bool { return r.Acked()[id] == 1 }, 10*time.Second, 5*time.Millisecond)
		require.Eventually(t, func() bool { return logOf(t, s, e)[0].State == idem.DeliveryDelivered }, 10*time.Second, 5*time.Millisecond)
		recorded := len(fs.log())
		// The claim right after the attempt ended may come at once, and
		// so may a poll whose Interval ran out between the delivery's
		// state being stored (which the test saw) and the job learning
		// that the attempt ended: two claims close together, neither of
		// them idle. The polls after those each wait Interval.
		require.Eventually(t, func() bool { return len(fs.log()) >= recorded+5 }, 10*time.Second, 5*time.Millisecond)
		calls := fs.log()
		for i := 1; i < len(calls); i++ {
			prev := calls[i-1]
			idle := i > recorded+1 && prev.n == 0
			if prev.err != nil || idle {
				require.GreaterOrEqual(t, calls[i].at.Sub(prev.at), cfg.Interval-time.Millisecond,
					"claim %d came %s after claim %d (err %v, took %d)", i, calls[i].at.Sub(prev.at), i-1, prev.err, prev.n)
			}
		}
		for i := range 3 {
			require.Error(t, calls[i].err)
		}
		require.Equal(t, 1, calls[3].n)
		require.Len(t, r.Requests(), 1)
	})
}
