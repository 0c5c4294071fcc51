package sqlite

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/storetest"
)

// testBundle is what each test starts from: a store on a fresh file, its
// path, and the fake clock it runs on.
type testBundle struct {
	store *Store
	path  string
	clock *storetest.Clock
}

func setup(t *testing.T) testBundle {
	t.Helper()
	clock := storetest.NewClock()
	path := filepath.Join(t.TempDir(), "idem.db")
	return testBundle{store: openStore(t, path, clock.Now), path: path, clock: clock}
}

func openStore(t *testing.T, path string, now func() time.Time) *Store {
	t.Helper()
	s, err := Open(context.Background(), path, Options{Now: now})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func TestPragmasOnEveryPooledConnection(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()

	// Hold several connections at once so the pool has to open new ones.
	for range maxOpenConns {
		conn, err := b.store.DB().Conn(ctx)
		require.NoError(t, err)
		defer conn.Close()

		var journal string
		var synchronous, foreignKeys, busy int
		require.NoError(t, conn.QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&journal))
		require.NoError(t, conn.QueryRowContext(ctx, "PRAGMA synchronous").Scan(&synchronous))
		require.NoError(t, conn.QueryRowContext(ctx, "PRAGMA foreign_keys").Scan(&foreignKeys))
		require.NoError(t, conn.QueryRowContext(ctx, "PRAGMA busy_timeout").Scan(&busy))
		require.Equal(t, "wal", journal)
		require.Equal(t, 2, synchronous, "synchronous must be FULL")
		require.Equal(t, 1, foreignKeys)
		require.Equal(t, int(busyTimeout.Milliseconds()), busy)
	}
}

func TestOpenCreatesFolderAndRefusesMemory(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "a", "b", "idem.db")
	s, err := Open(ctx, path, Options{})
	require.NoError(t, err)
	require.NoError(t, s.Ping(ctx))
	require.NoError(t, s.Close())
	require.NoError(t, Migrate(ctx, path), "migrating an up-to-date file is a no-op")

	_, err = Open(ctx, ":memory:", Options{})
	require.Error(t, err)
}

// TestConcurrentOpenOfNewFile: processes starting together on a new file
// all get a migrated store.
func TestConcurrentOpenOfNewFile(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "idem.db")
	const openers = 4
	stores := make([]*Store, openers)
	errs := make([]error, openers)
	var wg sync.WaitGroup
	for i := range openers {
		wg.Go(func() { stores[i], errs[i] = Open(context.Background(), path, Options{}) })
	}
	wg.Wait()
	for i := range openers {
		require.NoError(t, errs[i])
		t.Cleanup(func() { _ = stores[i].Close() })
	}
	storetest.CreateTenant(t, stores[0], "acme")
	got, err := stores[openers-1].GetTenant(context.Background(), idem.GetTenantParams{ID: "acme"})
	require.NoError(t, err)
	require.Equal(t, "acme", got.ID)
}

// TestTwoStoresOneFileOneWinner is two processes sharing a file: 64
// concurrent claims of one key through two Store instances leave exactly one
// creator, every other claim is request_in_flight, and the stored token is
// the winner's.
func TestTwoStoresOneFileOneWinner(t *testing.T) {
	t.Parallel()
	b := setup(t)
	other := openStore(t, b.path, b.clock.Now)
	storetest.CreateTenant(t, b.store, "acme")
	stores := []*Store{b.store, other}

	const claimers = 64
	results := make([]idem.ClaimResult, claimers)
	errs := make([]error, claimers)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range claimers {
		wg.Go(func() {
			<-start
			results[i], errs[i] = stores[i%2].Claim(context.Background(), storetest.ClaimParams("acme", "order-42"))
		})
	}
	close(start)
	wg.Wait()

	var winners []idem.ClaimResult
	for i, err := range errs {
		if err == nil {
			winners = append(winners, results[i])
			continue
		}
		require.Equal(t, idem.CodeRequestInFlight, idem.ErrorCode(err), "claim %d: %v", i, err)
		var ie *idem.Error
		require.ErrorAs(t, err, &ie)
		require.Equal(t, 30*time.Second, ie.RetryAfter)
	}
	require.Len(t, winners, 1)
	require.Equal(t, idem.ActionCreate, winners[0].Action)

	stored, err := other.GetRecord(context.Background(), idem.GetRecordParams{TenantID: "acme", Key: "order-42"})
	require.NoError(t, err)
	require.Equal(t, winners[0].Record.FencingToken, stored.FencingToken)
	require.Equal(t, 1, stored.Attempt)
}

// TestConcurrentCompletesOneResponse: many writers race to complete one key
// with different responses; exactly one response is stored and the others
// get already_completed.
func TestConcurrentCompletesOneResponse(t *testing.T) {
	t.Parallel()
	b := setup(t)
	other := openStore(t, b.path, b.clock.Now)
	storetest.CreateTenant(t, b.store, "acme")
	ctx := context.Background()
	res, err := b.store.Claim(ctx, storetest.ClaimParams("acme", "k"))
	require.NoError(t, err)

	const writers = 16
	errs := make([]error, writers)
	var wg sync.WaitGroup
	for i := range writers {
		wg.Go(func() {
			_, errs[i] = []*Store{b.store, other}[i%2].Complete(ctx, idem.CompleteParams{
				TenantID: "acme", Key: "k", FencingToken: res.Record.FencingToken,
				Response: idem.Response{Status: 201, Body: fmt.Appendf(nil, "writer %d", i), BodyEncoding: idem.BodyEncodingUTF8},
			})
		})
	}
	wg.Wait()
	winner := -1
	for i, err := range errs {
		if err == nil {
			require.Equal(t, -1, winner, "two completions succeeded")
			winner = i
			continue
		}
		require.ErrorIs(t, err, idem.ErrAlreadyCompleted)
	}
	require.NotEqual(t, -1, winner)
	stored, err := b.store.GetRecord(ctx, idem.GetRecordParams{TenantID: "acme", Key: "k"})
	require.NoError(t, err)
	require.Equal(t, fmt.Sprintf("writer %d", winner), string(stored.Response.Body))
}

func TestDataSurvivesReopen(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	storetest.CreateTenant(t, b.store, "acme")
	res, err := b.store.Claim(ctx, storetest.ClaimParams("acme", "k"))
	require.NoError(t, err)
	_, err = b.store.Checkpoint(ctx, idem.CheckpointParams{
		TenantID: "acme", Key: "k", FencingToken: res.Record.FencingToken,
		RecoveryPoint: "charged", Data: json.RawMessage(`{"b": 1,  "a":[2]}`), Lease: time.Minute,
	})
	require.NoError(t, err)
	want, err := b.store.Complete(ctx, idem.CompleteParams{
		TenantID: "acme", Key: "k", FencingToken: res.Record.FencingToken,
		Response: idem.Response{Status: 201, Headers: map[string]string{"Content-Type": "application/octet-stream"}, Body: []byte{0, 1, 2, 0xff}, BodyEncoding: idem.BodyEncodingBase64},
	})
	require.NoError(t, err)
	require.NoError(t, b.store.Close())
	require.ErrorIs(t, b.store.Ping(ctx), idem.ErrStoreUnavailable, "a closed store is unavailable")
	_, err = b.store.GetRecord(ctx, idem.GetRecordParams{TenantID: "acme", Key: "k"})
	require.ErrorIs(t, err, idem.ErrStoreUnavailable)

	reopened := openStore(t, b.path, b.clock.Now)
	got, err := reopened.GetRecord(ctx, idem.GetRecordParams{TenantID: "acme", Key: "k"})
	require.NoError(t, err)
	require.Equal(t, want, got)
	require.Equal(t, `{"b": 1,  "a":[2]}`, string(got.RecoveryData), "recovery data is kept verbatim")

	// The fencing counter survives too: a new claim gets a larger token.
	next, err := reopened.Claim(ctx, storetest.ClaimParams("acme", "k2"))
	require.NoError(t, err)
	require.Greater(t, next.Record.FencingToken, res.Record.FencingToken)
}

func TestResponseBodyRoundTrip(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	storetest.CreateTenant(t, b.store, "acme")
	for i, resp := range []idem.Response{
		{Status: 204},
		{Status: 200, Headers: map[string]string{}, Body: []byte{}, BodyEncoding: idem.BodyEncodingUTF8},
		{Status: 500, Headers: map[string]string{"X-A": "1", "X-B": ""}, Body: []byte("oops"), BodyEncoding: idem.BodyEncodingUTF8},
	} {
		key := fmt.Sprintf("k%d", i)
		res, err := b.store.Claim(ctx, storetest.ClaimParams("acme", key))
		require.NoError(t, err)
		done, err := b.store.Complete(ctx, idem.CompleteParams{TenantID: "acme", Key: key, FencingToken: res.Record.FencingToken, Response: resp})
		require.NoError(t, err)
		require.Equal(t, resp, *done.Response)
		got, err := b.store.GetRecord(ctx, idem.GetRecordParams{TenantID: "acme", Key: key})
		require.NoError(t, err)
		require.Equal(t, resp, *got.Response)
	}
}

// TestConcurrentReapDeletesEachRecordOnce: reapers on two Store instances of
// one file, racing in small batches, delete every purgeable record exactly
// once and leave the live ones.
func TestConcurrentReapDeletesEachRecordOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	other := openStore(t, b.path, b.clock.Now)
	ctx := context.Background()
	storetest.CreateTenant(t, b.store, "acme")
	gone := storetest.CreateTenant(t, b.store, "gone")

	const old = 40
	for i := range old {
		_, err := b.store.Claim(ctx, storetest.ClaimParams("acme", fmt.Sprintf("old-%d", i)))
		require.NoError(t, err)
	}
	for i := range 5 {
		_, err := b.store.Claim(ctx, storetest.ClaimParams("gone", fmt.Sprintf("k-%d", i)))
		require.NoError(t, err)
	}
	b.clock.Advance(storetest.ClaimParams("acme", "").ReaperThreshold) // past purge_after
	live, err := b.store.Claim(ctx, storetest.ClaimParams("acme", "live"))
	require.NoError(t, err)
	_, err = b.store.UpdateTenant(ctx, idem.UpdateTenantParams{ID: gone.ID, Name: gone.Name, Settings: gone.Settings, Disabled: true})
	require.NoError(t, err)
	// The gone tenant's records are not past purge_after yet: reset their clock.
	b.clock.Advance(-time.Hour)
	b.clock.Advance(time.Hour)

	var mu sync.Mutex
	deleted := map[string]int{}
	var wg sync.WaitGroup
	for i := range 6 {
		wg.Go(func() {
			s := []*Store{b.store, other}[i%2]
			for {
				recs, err := s.Reap(ctx, idem.ReapParams{Limit: 4})
				if !assert.NoError(t, err) || len(recs) == 0 {
					return
				}
				mu.Lock()
				for _, r := range recs {
					require.Nil(t, r.Response)
					deleted[r.TenantID+"/"+r.Key]++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	require.Len(t, deleted, old+5)
	for k, n := range deleted {
		require.Equal(t, 1, n, "record %s deleted %d times", k, n)
	}
	got, err := b.store.GetRecord(ctx, idem.GetRecordParams{TenantID: "acme", Key: "live"})
	require.NoError(t, err)
	require.Equal(t, live.Record.FencingToken, got.FencingToken)
}

func TestClosedStoreIsUnavailable(t *testing.T) {
	t.Parallel()
	b := setup(t)
	require.NoError(t, b.store.Close())
	_, err := b.store.Claim(context.Background(), storetest.ClaimParams("acme", "k"))
	var ie *idem.Error
	require.True(t, errors.As(err, &ie), "got %v", err)
	require.Equal(t, idem.CodeStoreUnavailable, ie.Code)
	require.Equal(t, time.Second, ie.RetryAfter)
}

// BenchmarkClaimParallel measures claims of distinct keys from many
// goroutines, two Store instances sharing the file, for several pool sizes
// (the reason for maxOpenConns).
func BenchmarkClaimParallel(b *testing.B) {
	for _, conns := range []int{1, maxOpenConns, 16} {
		b.Run(fmt.Sprintf("conns=%d", conns), func(b *testing.B) {
			path := filepath.Join(b.TempDir(), "idem.db")
			ctx := context.Background()
			var stores []*Store
			for range 2 {
				s, err := Open(ctx, path, Options{})
				require.NoError(b, err)
				defer s.Close()
				s.DB().SetMaxOpenConns(conns)
				stores = append(stores, s)
			}
			_, err := stores[0].CreateTenant(ctx, idem.CreateTenantParams{ID: "acme", Name: "acme", Settings: idem.DefaultSettings()})
			require.NoError(b, err)
			var mu sync.Mutex
			next := 0
			b.SetParallelism(8)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				mu.Lock()
				g := next
				next++
				mu.Unlock()
				s := stores[g%2]
				for i := 0; pb.Next(); i++ {
					if _, err := s.Claim(ctx, storetest.ClaimParams("acme", fmt.Sprintf("g%d-%d", g, i))); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}
