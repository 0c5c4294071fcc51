package postgres

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/postgres/pgtest"
	"github.com/idem-dev/idem/storetest"
)

// testBundle is what setup returns.
type testBundle struct {
	url   string
	store *Store
	clock *storetest.Clock
}

// setup opens a store on a fresh schema with a fake clock and one tenant
// "acme".
func setup(t *testing.T) *testBundle {
	t.Helper()
	dsn := pgtest.URL(t)
	clock := storetest.NewClock()
	store := openStore(t, dsn, Options{Now: clock.Now})
	_, err := store.CreateTenant(context.Background(), idem.CreateTenantParams{ID: "acme", Name: "Acme", Settings: idem.DefaultSettings()})
	require.NoError(t, err)
	return &testBundle{url: dsn, store: store, clock: clock}
}

func openStore(t *testing.T, dsn string, opts Options) *Store {
	t.Helper()
	store, err := Open(context.Background(), dsn, opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = store.Close() })
	return store
}

func claimParams(key string) idem.ClaimParams {
	return idem.ClaimParams{
		TenantID: "acme", Key: key, Operation: "POST /v1/payments", Fingerprint: "fp-1",
		Lease: 30 * time.Second, ReplayWindow: time.Hour, ReaperThreshold: 2 * time.Hour,
	}
}

func TestMigrateTwice(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := pgtest.URL(t)
	require.NoError(t, Migrate(ctx, dsn))
	require.NoError(t, Migrate(ctx, dsn))
	store := openStore(t, dsn, Options{MaxConns: 1})
	require.NoError(t, store.Ping(ctx))
	_, err := store.ListTenants(ctx)
	require.NoError(t, err)
}

func TestClaimLifecycle(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	s := b.store

	created, err := s.Claim(ctx, claimParams("k1"))
	require.NoError(t, err)
	require.Equal(t, idem.ActionCreate, created.Action)
	require.Equal(t, 1, created.Record.Attempt)
	require.Equal(t, b.clock.Now(), created.Record.ObservedAt)
	require.Equal(t, b.clock.Now().Add(30*time.Second), created.Record.LeaseExpiresAt)
	require.Equal(t, b.clock.Now().Add(2*time.Hour), created.Record.PurgeAfter)
	require.Equal(t, idem.StateInFlight, created.Record.APIState())

	_, err = s.Claim(ctx, claimParams("k1"))
	require.ErrorIs(t, err, idem.ErrRequestInFlight)
	require.Equal(t, 30*time.Second, err.(*idem.Error).RetryAfter)

	other := claimParams("k1")
	other.Fingerprint = "fp-2"
	_, err = s.Claim(ctx, other)
	require.ErrorIs(t, err, idem.ErrFingerprintMismatch)

	data := []byte(`{ "charge": "ch_1" }`)
	cp, err := s.Checkpoint(ctx, idem.CheckpointParams{TenantID: "acme", Key: "k1", FencingToken: created.Record.FencingToken,
		RecoveryPoint: "charge_created", Data: data, Lease: 10 * time.Second})
	require.NoError(t, err)
	require.Equal(t, "charge_created", cp.RecoveryPoint)
	require.Equal(t, string(data), string(cp.RecoveryData), "recovery data is kept verbatim")

	// The lease runs out: a takeover keeps the recovery point.
	b.clock.Advance(11 * time.Second)
	taken, err := s.Claim(ctx, claimParams("k1"))
	require.NoError(t, err)
	require.Equal(t, idem.ActionTakeover, taken.Action)
	require.Equal(t, 2, taken.Record.Attempt)
	require.Greater(t, taken.Record.FencingToken, created.Record.FencingToken)
	require.Equal(t, "charge_created", taken.Record.RecoveryPoint)
	require.Equal(t, string(data), string(taken.Record.RecoveryData))

	// The old token is fenced off.
	resp := idem.Response{Status: 201, Headers: map[string]string{"Content-Type": "application/json"}, Body: []byte(`{"id":1}`), BodyEncoding: idem.BodyEncodingUTF8}
	_, err = s.Complete(ctx, idem.CompleteParams{TenantID: "acme", Key: "k1", FencingToken: created.Record.FencingToken, Response: resp})
	require.ErrorIs(t, err, idem.ErrLeaseLost)

	done, err := s.Complete(ctx, idem.CompleteParams{TenantID: "acme", Key: "k1", FencingToken: taken.Record.FencingToken, Response: resp})
	require.NoError(t, err)
	require.Equal(t, idem.StateCompleted, done.State)
	require.True(t, done.LeaseExpiresAt.IsZero())
	require.Equal(t, b.clock.Now().Add(time.Hour), done.ReplayUntil)
	require.Equal(t, &resp, done.Response)

	again, err := s.Complete(ctx, idem.CompleteParams{TenantID: "acme", Key: "k1", FencingToken: taken.Record.FencingToken, Response: resp})
	require.NoError(t, err, "completing again with the same response is a no-op")
	require.Equal(t, done.CompletedAt, again.CompletedAt)
	different := resp
	different.Status = 500
	_, err = s.Complete(ctx, idem.CompleteParams{TenantID: "acme", Key: "k1", FencingToken: taken.Record.FencingToken, Response: different})
	require.ErrorIs(t, err, idem.ErrAlreadyCompleted)
	require.ErrorIs(t, s.Release(ctx, idem.ReleaseParams{TenantID: "acme", Key: "k1", FencingToken: taken.Record.FencingToken}), idem.ErrAlreadyCompleted)

	replay, err := s.Claim(ctx, claimParams("k1"))
	require.NoError(t, err)
	require.Equal(t, idem.ActionReplay, replay.Action)
	require.Equal(t, &resp, replay.Record.Response)

	// Past the replay window the key is new again.
	b.clock.Advance(time.Hour)
	fresh, err := s.Claim(ctx, other)
	require.NoError(t, err)
	require.Equal(t, idem.ActionCreate, fresh.Action)
	require.Equal(t, 1, fresh.Record.Attempt)
	require.Empty(t, fresh.Record.RecoveryPoint)
	require.Nil(t, fresh.Record.RecoveryData)
	require.Nil(t, fresh.Record.Response)
	require.Equal(t, b.clock.Now(), fresh.Record.CreatedAt)
}

func TestClaimUnknownTenant(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := claimParams("k")
	p.TenantID = "nobody"
	_, err := b.store.Claim(context.Background(), p)
	require.ErrorIs(t, err, idem.ErrTenantUnknown)
}

func TestFencingTokenGrowsAfterRelease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)

	first, err := b.store.Claim(ctx, claimParams("k"))
	require.NoError(t, err)
	require.NoError(t, b.store.Release(ctx, idem.ReleaseParams{TenantID: "acme", Key: "k", FencingToken: first.Record.FencingToken}))
	require.ErrorIs(t, b.store.Release(ctx, idem.ReleaseParams{TenantID: "acme", Key: "k", FencingToken: first.Record.FencingToken}), idem.ErrKeyNotFound)
	_, err = b.store.GetRecord(ctx, idem.GetRecordParams{TenantID: "acme", Key: "k"})
	require.ErrorIs(t, err, idem.ErrKeyNotFound)

	second, err := b.store.Claim(ctx, claimParams("k"))
	require.NoError(t, err)
	require.Equal(t, idem.ActionCreate, second.Action)
	require.Greater(t, second.Record.FencingToken, first.Record.FencingToken)
	require.ErrorIs(t, b.store.Release(ctx, idem.ReleaseParams{TenantID: "acme", Key: "k", FencingToken: first.Record.FencingToken}), idem.ErrLeaseLost)
}

// TestConcurrentClaimsTwoReplicas races 64 goroutines on each of two pools
// (two service replicas) for the same keys: exactly one claim creates each
// record and every other one is told the request is in flight.
func TestConcurrentClaimsTwoReplicas(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := pgtest.URL(t)
	replicas := []*Store{openStore(t, dsn, Options{MaxConns: 8}), openStore(t, dsn, Options{MaxConns: 8})}
	_, err := replicas[0].CreateTenant(ctx, idem.CreateTenantParams{ID: "acme", Name: "Acme", Settings: idem.DefaultSettings()})
	require.NoError(t, err)

	const perReplica = 64
	for k := range 4 {
		key := fmt.Sprintf("race-%d", k)
		var wg sync.WaitGroup
		var created, inFlight atomic.Int64
		tokens := make(chan int64, 2*perReplica)
		errs := make(chan error, 2*perReplica)
		start := make(chan struct{})
		for _, s := range replicas {
			for range perReplica {
				wg.Go(func() {
					<-start
					res, err := s.Claim(ctx, claimParams(key))
					switch {
					case err == nil && res.Action == idem.ActionCreate:
						created.Add(1)
						tokens <- res.Record.FencingToken
					case idem.ErrorCode(err) == idem.CodeRequestInFlight:
						inFlight.Add(1)
					default:
						errs <- fmt.Errorf("unexpected claim outcome %v: %w", res.Action, err)
					}
				})
			}
		}
		close(start)
		wg.Wait()
		close(errs)
		close(tokens)
		for err := range errs {
			require.NoError(t, err)
		}
		require.Equal(t, int64(1), created.Load(), "key %s", key)
		require.Equal(t, int64(2*perReplica-1), inFlight.Load(), "key %s", key)
		stored, err := replicas[1].GetRecord(ctx, idem.GetRecordParams{TenantID: "acme", Key: key})
		require.NoError(t, err)
		require.Equal(t, <-tokens, stored.FencingToken, "the stored record is the winner's")
		require.Equal(t, 1, stored.Attempt)
	}
}

// TestConcurrentReap seeds expired records and reaps them from three
// goroutines on two pools while claims of other keys keep succeeding: every
// seeded record is deleted once and only once, and live records survive.
func TestConcurrentReap(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	other := openStore(t, b.url, Options{Now: b.clock.Now})

	const seeded = 300
	for i := range seeded {
		_, err := b.store.Claim(ctx, claimParams(fmt.Sprintf("old-%d", i)))
		require.NoError(t, err)
	}
	b.clock.Advance(3 * time.Hour) // past purge_after (2 h)

	var wg sync.WaitGroup
	var mu sync.Mutex
	seen := map[string]int{}
	stop := make(chan struct{})
	claimErrs := make(chan error, 1)
	go func() {
		defer close(claimErrs)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := other.Claim(ctx, claimParams(fmt.Sprintf("live-%d", i))); err != nil {
				claimErrs <- err
				return
			}
		}
	}()
	for g := range 3 {
		s := []*Store{b.store, other, b.store}[g]
		wg.Go(func() {
			for {
				recs, err := s.Reap(ctx, idem.ReapParams{Limit: 17})
				if !assert.NoError(t, err) || len(recs) == 0 {
					return
				}
				mu.Lock()
				for _, r := range recs {
					seen[r.Key]++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	close(stop)
	require.NoError(t, <-claimErrs)

	total := 0
	for key, n := range seen {
		require.Equal(t, 1, n, "key %s deleted %d times", key, n)
		require.Regexp(t, `^old-`, key, "a live record was reaped")
		total += n
	}
	require.Equal(t, seeded, total)
	left, err := b.store.ListRecords(ctx, idem.ListRecordsParams{TenantID: "acme", Limit: 1000})
	require.NoError(t, err)
	for _, r := range left {
		require.Regexp(t, `^live-`, r.Key)
	}
}

func TestListingsAndOrphans(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	s := b.store
	for i := range 5 {
		_, err := s.Claim(ctx, claimParams(fmt.Sprintf("k%d", i)))
		require.NoError(t, err)
		b.clock.Advance(time.Second)
	}
	// k0..k4 have leases expiring 30 s after their creation, one second apart.
	b.clock.Advance(26 * time.Second) // k0, k1 orphaned
	orphans, err := s.ListOrphans(ctx, idem.ListOrphansParams{Limit: 10})
	require.NoError(t, err)
	require.Equal(t, []string{"k0", "k1"}, keys(orphans))
	stats, err := s.OrphanStats(ctx)
	require.NoError(t, err)
	require.Len(t, stats, 1)
	require.Equal(t, int64(2), stats[0].Count)
	require.Equal(t, orphans[0].LeaseExpiresAt, stats[0].OldestLeaseExpiry)
	require.Equal(t, b.clock.Now(), stats[0].ObservedAt)

	page, err := s.ListOrphans(ctx, idem.ListOrphansParams{TenantID: "acme", Limit: 1,
		After: &idem.Cursor{Time: orphans[0].LeaseExpiresAt, TenantID: "acme", Key: "k0"}})
	require.NoError(t, err)
	require.Equal(t, []string{"k1"}, keys(page))

	inFlight, err := s.ListRecords(ctx, idem.ListRecordsParams{TenantID: "acme", State: idem.StateInFlight, Limit: 10})
	require.NoError(t, err)
	require.Equal(t, []string{"k4", "k3", "k2"}, keys(inFlight))
	all, err := s.ListRecords(ctx, idem.ListRecordsParams{TenantID: "acme", Limit: 2})
	require.NoError(t, err)
	require.Equal(t, []string{"k4", "k3"}, keys(all))
	next, err := s.ListRecords(ctx, idem.ListRecordsParams{TenantID: "acme", Limit: 10,
		After: &idem.Cursor{Time: all[1].CreatedAt, Key: all[1].Key}})
	require.NoError(t, err)
	require.Equal(t, []string{"k2", "k1", "k0"}, keys(next))
}

func keys(recs []idem.Record) []string {
	out := make([]string, 0, len(recs))
	for _, r := range recs {
		out = append(out, r.Key)
	}
	return out
}

func TestTenants(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	_, err := b.store.CreateTenant(ctx, idem.CreateTenantParams{ID: "acme", Name: "again", Settings: idem.DefaultSettings()})
	require.ErrorIs(t, err, idem.ErrTenantExists)
	_, err = b.store.GetTenant(ctx, "nope")
	require.ErrorIs(t, err, idem.ErrTenantNotFound)
	_, err = b.store.UpdateTenant(ctx, idem.UpdateTenantParams{ID: "nope", Settings: idem.DefaultSettings()})
	require.ErrorIs(t, err, idem.ErrTenantNotFound)

	settings := idem.DefaultSettings()
	settings.RateLimitPerSecond = 7
	up, err := b.store.UpdateTenant(ctx, idem.UpdateTenantParams{ID: "acme", Name: "Acme Inc", Settings: settings, Disabled: true})
	require.NoError(t, err)
	require.True(t, up.Disabled)
	require.Equal(t, settings, up.Settings)
	got, err := b.store.GetTenant(ctx, "acme")
	require.NoError(t, err)
	require.Equal(t, up, got)
	list, err := b.store.ListTenants(ctx)
	require.NoError(t, err)
	require.Equal(t, []idem.Tenant{up}, list)
}

// TestUnavailable checks that an unreachable database is store_unavailable,
// both at Open and for a store whose server goes away.
func TestUnavailable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	// A loopback port nobody listens on.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closedAddr := l.Addr().String()
	require.NoError(t, l.Close())
	_, err = Open(ctx, "postgres://idem:idem@"+closedAddr+"/idem?sslmode=disable", Options{ConnectTimeout: time.Second})
	require.ErrorIs(t, err, idem.ErrStoreUnavailable)
	require.Equal(t, time.Second, err.(*idem.Error).RetryAfter)

	// A store reached through a proxy that then goes away.
	dsn := pgtest.URL(t)
	proxy := startProxy(t, dsn)
	store := openStore(t, proxy.url, Options{ConnectTimeout: time.Second})
	_, err = store.CreateTenant(ctx, idem.CreateTenantParams{ID: "acme", Name: "Acme", Settings: idem.DefaultSettings()})
	require.NoError(t, err)
	proxy.stop()
	_, err = store.Claim(ctx, claimParams("k"))
	require.ErrorIs(t, err, idem.ErrStoreUnavailable)
	require.ErrorIs(t, store.Ping(ctx), idem.ErrStoreUnavailable)

	require.NoError(t, store.Close())
	_, err = store.GetRecord(ctx, idem.GetRecordParams{TenantID: "acme", Key: "k"})
	require.ErrorIs(t, err, idem.ErrStoreUnavailable)
}

// proxy is a loopback TCP proxy to the test server that can be cut.
type proxy struct {
	url  string
	stop func()
}

func startProxy(t *testing.T, target string) *proxy {
	t.Helper()
	u, err := url.Parse(target)
	require.NoError(t, err)
	upstream := u.Host
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", upstream)
			if err != nil {
				_ = c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, c, up)
			mu.Unlock()
			go func() { _, _ = io.Copy(up, c); _ = up.Close() }()
			go func() { _, _ = io.Copy(c, up); _ = c.Close() }()
		}
	}()
	stop := sync.OnceFunc(func() {
		_ = l.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	t.Cleanup(stop)
	u.Host = l.Addr().String()
	return &proxy{url: u.String(), stop: stop}
}
