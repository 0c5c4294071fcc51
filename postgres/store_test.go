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
	"github.com/idem-dev/idem/storetest"
	"github.com/idem-dev/idem/testkit/pgtest"
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
	storetest.CreateTenant(t, store, "acme")
	return &testBundle{url: dsn, store: store, clock: clock}
}

func openStore(t *testing.T, dsn string, opts Options) *Store {
	t.Helper()
	store, err := Open(context.Background(), dsn, opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = store.Close() })
	return store
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

// TestConcurrentClaimsTwoReplicas races 64 goroutines on each of two pools
// (two service replicas) for the same keys: exactly one claim creates each
// record and every other one is told the request is in flight.
func TestConcurrentClaimsTwoReplicas(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := pgtest.URL(t)
	replicas := []*Store{openStore(t, dsn, Options{MaxConns: 8}), openStore(t, dsn, Options{MaxConns: 8})}
	storetest.CreateTenant(t, replicas[0], "acme")

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
					res, err := s.Claim(ctx, storetest.ClaimParams("acme", key))
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
		_, err := b.store.Claim(ctx, storetest.ClaimParams("acme", fmt.Sprintf("old-%d", i)))
		require.NoError(t, err)
	}
	b.clock.Advance(storetest.ClaimParams("acme", "").ReaperThreshold + time.Hour) // past purge_after

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
			if _, err := other.Claim(ctx, storetest.ClaimParams("acme", fmt.Sprintf("live-%d", i))); err != nil {
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
	_, err = store.Claim(ctx, storetest.ClaimParams("acme", "k"))
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

// TestKeptClaimsTakeNoRowLock holds the row locks of a completed record
// and of a record in flight in another transaction (a write of each in
// progress) and checks that the claims that leave them as they are (a
// replay, a fingerprint mismatch, request_in_flight) are answered from the
// statement's snapshot without waiting for those locks: the claim statement
// writes nothing then. (The deadline only bounds the test when a claim
// waits on a lock: none of these should.)
func TestKeptClaimsTakeNoRowLock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	rec, err := b.store.Claim(ctx, storetest.ClaimParams("acme", "done"))
	require.NoError(t, err)
	done, err := b.store.Complete(ctx, idem.CompleteParams{TenantID: "acme", Key: "done", FencingToken: rec.Record.FencingToken,
		Response: idem.Response{Status: 201, Body: []byte(`{"id":1}`), BodyEncoding: idem.BodyEncodingUTF8}})
	require.NoError(t, err)
	_, err = b.store.Claim(ctx, storetest.ClaimParams("acme", "busy"))
	require.NoError(t, err)

	locker := openStore(t, b.url, Options{MaxConns: 1})
	tx, err := locker.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	var n int
	require.NoError(t, tx.QueryRow(ctx, "SELECT count(*) FROM (SELECT 1 FROM idempotency_keys WHERE tenant_id = 'acme' FOR UPDATE) l").Scan(&n))
	require.Equal(t, 2, n)

	bounded, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	res, err := b.store.Claim(bounded, storetest.ClaimParams("acme", "done"))
	require.NoError(t, err)
	require.Equal(t, idem.ActionReplay, res.Action)
	require.Equal(t, done.FencingToken, res.Record.FencingToken)
	require.Equal(t, done.Response.Body, res.Record.Response.Body)
	p := storetest.ClaimParams("acme", "done")
	p.Fingerprint = "sha256:other"
	_, err = b.store.Claim(bounded, p)
	require.Equal(t, idem.CodeFingerprintMismatch, idem.ErrorCode(err), "got %v", err)
	_, err = b.store.Claim(bounded, storetest.ClaimParams("acme", "busy"))
	require.Equal(t, idem.CodeRequestInFlight, idem.ErrorCode(err), "got %v", err)
}

// TestReplayOfACompletedKeyIsAPlainRead: a key this Store completed (or
// replayed) is claimed with a plain read first, so its replay and its
// fingerprint mismatch are answered while another transaction holds SHARE
// on idempotency_keys, which holds back every statement with an INSERT in
// its plan (ClaimKey's ROW EXCLUSIVE) and no read. A key the Store has not
// seen completed still goes through ClaimKey (not sent here: it would
// wait). (The deadline only bounds the test if a claim waited.)
func TestReplayOfACompletedKeyIsAPlainRead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	rec, err := b.store.Claim(ctx, storetest.ClaimParams("acme", "done"))
	require.NoError(t, err)
	done, err := b.store.Complete(ctx, idem.CompleteParams{TenantID: "acme", Key: "done", FencingToken: rec.Record.FencingToken,
		Response: idem.Response{Status: 201, Body: []byte(`{"id":1}`), BodyEncoding: idem.BodyEncodingUTF8}})
	require.NoError(t, err)

	locker := openStore(t, b.url, Options{MaxConns: 1})
	tx, err := locker.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, "LOCK TABLE idempotency_keys IN SHARE MODE")
	require.NoError(t, err)

	bounded, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	res, err := b.store.Claim(bounded, storetest.ClaimParams("acme", "done"))
	require.NoError(t, err)
	require.Equal(t, idem.ActionReplay, res.Action)
	require.Equal(t, done.FencingToken, res.Record.FencingToken)
	require.Equal(t, done.Response.Body, res.Record.Response.Body)
	p := storetest.ClaimParams("acme", "done")
	p.Fingerprint = "sha256:other"
	_, err = b.store.Claim(bounded, p)
	require.Equal(t, idem.CodeFingerprintMismatch, idem.ErrorCode(err), "got %v", err)
	require.NoError(t, tx.Rollback(ctx))

	// Past its window the hint is not trusted: the key is created afresh.
	b.clock.Set(done.ReplayUntil)
	res, err = b.store.Claim(ctx, storetest.ClaimParams("acme", "done"))
	require.NoError(t, err)
	require.Equal(t, idem.ActionCreate, res.Action)
	require.Greater(t, res.Record.FencingToken, done.FencingToken)
}
