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

func createTenant(t *testing.T, s *Store, id string) idem.Tenant {
	t.Helper()
	tn, err := s.CreateTenant(context.Background(), idem.CreateTenantParams{ID: id, Name: id, Settings: idem.DefaultSettings()})
	require.NoError(t, err)
	return tn
}

func claimParams(tenant, key string) idem.ClaimParams {
	return idem.ClaimParams{
		TenantID:        tenant,
		Key:             key,
		Operation:       "POST /v1/payments",
		Fingerprint:     "sha256:abc",
		Lease:           30 * time.Second,
		ReplayWindow:    time.Hour,
		ReaperThreshold: 2 * time.Hour,
	}
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
	createTenant(t, stores[0], "acme")
	got, err := stores[openers-1].GetTenant(context.Background(), "acme")
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
	createTenant(t, b.store, "acme")
	stores := []*Store{b.store, other}

	const claimers = 64
	results := make([]idem.ClaimResult, claimers)
	errs := make([]error, claimers)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range claimers {
		wg.Go(func() {
			<-start
			results[i], errs[i] = stores[i%2].Claim(context.Background(), claimParams("acme", "order-42"))
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
	createTenant(t, b.store, "acme")
	ctx := context.Background()
	res, err := b.store.Claim(ctx, claimParams("acme", "k"))
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
	createTenant(t, b.store, "acme")
	res, err := b.store.Claim(ctx, claimParams("acme", "k"))
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
	next, err := reopened.Claim(ctx, claimParams("acme", "k2"))
	require.NoError(t, err)
	require.Greater(t, next.Record.FencingToken, res.Record.FencingToken)
}

func TestResponseBodyRoundTrip(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	createTenant(t, b.store, "acme")
	for i, resp := range []idem.Response{
		{Status: 204},
		{Status: 200, Headers: map[string]string{}, Body: []byte{}, BodyEncoding: idem.BodyEncodingUTF8},
		{Status: 500, Headers: map[string]string{"X-A": "1", "X-B": ""}, Body: []byte("oops"), BodyEncoding: idem.BodyEncodingUTF8},
	} {
		key := fmt.Sprintf("k%d", i)
		res, err := b.store.Claim(ctx, claimParams("acme", key))
		require.NoError(t, err)
		done, err := b.store.Complete(ctx, idem.CompleteParams{TenantID: "acme", Key: key, FencingToken: res.Record.FencingToken, Response: resp})
		require.NoError(t, err)
		require.Equal(t, resp, *done.Response)
		got, err := b.store.GetRecord(ctx, idem.GetRecordParams{TenantID: "acme", Key: key})
		require.NoError(t, err)
		require.Equal(t, resp, *got.Response)
	}
}

// TestClaimLifecycle walks one key through the claim table with the fake
// clock: create, in flight, mismatch, takeover with the recovery point kept,
// stale token, complete, replay, expiry and a fresh record.
func TestClaimLifecycle(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	s := b.store
	createTenant(t, s, "acme")
	p := claimParams("acme", "k")

	first, err := s.Claim(ctx, p)
	require.NoError(t, err)
	require.Equal(t, idem.ActionCreate, first.Action)
	require.Equal(t, b.clock.Now(), first.Record.ObservedAt)
	require.Equal(t, b.clock.Now().Add(p.ReaperThreshold), first.Record.PurgeAfter)
	require.Equal(t, idem.StateInFlight, first.Record.APIState())

	b.clock.Advance(10 * time.Second)
	_, err = s.Claim(ctx, p)
	var ie *idem.Error
	require.ErrorAs(t, err, &ie)
	require.Equal(t, idem.CodeRequestInFlight, ie.Code)
	require.Equal(t, 20*time.Second, ie.RetryAfter)

	other := p
	other.Fingerprint = "sha256:other"
	_, err = s.Claim(ctx, other)
	require.ErrorIs(t, err, idem.ErrFingerprintMismatch)

	_, err = s.Checkpoint(ctx, idem.CheckpointParams{TenantID: "acme", Key: "k", FencingToken: first.Record.FencingToken, RecoveryPoint: "charged", Data: json.RawMessage(`{"id":1}`), Lease: 5 * time.Second})
	require.NoError(t, err)

	b.clock.Advance(5 * time.Second) // lease ran out exactly now: orphaned
	orphans, err := s.ListOrphans(ctx, idem.ListOrphansParams{Limit: 10})
	require.NoError(t, err)
	require.Len(t, orphans, 1)
	stats, err := s.OrphanStats(ctx)
	require.NoError(t, err)
	require.Equal(t, []idem.OrphanStat{{TenantID: "acme", Count: 1, OldestLeaseExpiry: b.clock.Now(), ObservedAt: b.clock.Now()}}, stats)

	second, err := s.Claim(ctx, p)
	require.NoError(t, err)
	require.Equal(t, idem.ActionTakeover, second.Action)
	require.Equal(t, 2, second.Record.Attempt)
	require.Greater(t, second.Record.FencingToken, first.Record.FencingToken)
	require.Equal(t, "charged", second.Record.RecoveryPoint)
	require.JSONEq(t, `{"id":1}`, string(second.Record.RecoveryData))
	require.Equal(t, first.Record.CreatedAt, second.Record.CreatedAt)

	resp := idem.Response{Status: 201, Body: []byte("ok"), BodyEncoding: idem.BodyEncodingUTF8}
	_, err = s.Complete(ctx, idem.CompleteParams{TenantID: "acme", Key: "k", FencingToken: first.Record.FencingToken, Response: resp})
	require.ErrorIs(t, err, idem.ErrLeaseLost)

	b.clock.Advance(time.Minute) // past the lease: complete is still accepted
	done, err := s.Complete(ctx, idem.CompleteParams{TenantID: "acme", Key: "k", FencingToken: second.Record.FencingToken, Response: resp})
	require.NoError(t, err)
	require.Equal(t, idem.StateCompleted, done.State)
	require.Equal(t, b.clock.Now().Add(p.ReplayWindow), done.ReplayUntil)
	require.True(t, done.LeaseExpiresAt.IsZero())

	again, err := s.Complete(ctx, idem.CompleteParams{TenantID: "acme", Key: "k", FencingToken: second.Record.FencingToken, Response: resp})
	require.NoError(t, err)
	require.Equal(t, done.CompletedAt, again.CompletedAt)
	_, err = s.Complete(ctx, idem.CompleteParams{TenantID: "acme", Key: "k", FencingToken: second.Record.FencingToken, Response: idem.Response{Status: 500}})
	require.ErrorIs(t, err, idem.ErrAlreadyCompleted)
	require.ErrorIs(t, s.Release(ctx, idem.ReleaseParams{TenantID: "acme", Key: "k", FencingToken: second.Record.FencingToken}), idem.ErrAlreadyCompleted)

	replay, err := s.Claim(ctx, p)
	require.NoError(t, err)
	require.Equal(t, idem.ActionReplay, replay.Action)
	require.Equal(t, resp, *replay.Record.Response)

	b.clock.Advance(p.ReplayWindow)
	expired, err := s.ListRecords(ctx, idem.ListRecordsParams{TenantID: "acme", State: idem.StateExpired, Limit: 10})
	require.NoError(t, err)
	require.Len(t, expired, 1)
	fresh, err := s.Claim(ctx, other)
	require.NoError(t, err)
	require.Equal(t, idem.ActionCreate, fresh.Action)
	require.Equal(t, 1, fresh.Record.Attempt)
	require.Nil(t, fresh.Record.Response)
	require.Empty(t, fresh.Record.RecoveryPoint)
	require.Nil(t, fresh.Record.RecoveryData)

	require.NoError(t, s.Release(ctx, idem.ReleaseParams{TenantID: "acme", Key: "k", FencingToken: fresh.Record.FencingToken}))
	require.ErrorIs(t, s.Release(ctx, idem.ReleaseParams{TenantID: "acme", Key: "k", FencingToken: fresh.Record.FencingToken}), idem.ErrKeyNotFound)
	afterRelease, err := s.Claim(ctx, p)
	require.NoError(t, err)
	require.Greater(t, afterRelease.Record.FencingToken, fresh.Record.FencingToken, "tokens keep increasing after a release")

	_, err = s.Claim(ctx, claimParams("nobody", "k"))
	require.ErrorIs(t, err, idem.ErrTenantUnknown)
}

func TestListRecordsKeyset(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	createTenant(t, b.store, "acme")
	createTenant(t, b.store, "other")
	var want []string
	for i := range 7 {
		key := fmt.Sprintf("k%d", i%3) + fmt.Sprint(i)
		_, err := b.store.Claim(ctx, claimParams("acme", key))
		require.NoError(t, err)
		_, err = b.store.Claim(ctx, claimParams("other", key))
		require.NoError(t, err)
		want = append([]string{key}, want...)
		if i%2 == 0 {
			b.clock.Advance(time.Millisecond) // some records share created_at
		}
	}
	var got []string
	var after *idem.Cursor
	for {
		page, err := b.store.ListRecords(ctx, idem.ListRecordsParams{TenantID: "acme", Limit: 3, After: after})
		require.NoError(t, err)
		for _, r := range page {
			require.Equal(t, "acme", r.TenantID)
			require.Nil(t, r.Response)
			got = append(got, r.Key)
		}
		if len(page) < 3 {
			break
		}
		last := page[len(page)-1]
		after = &idem.Cursor{Time: last.CreatedAt, Key: last.Key}
	}
	// Newest first by (created_at, key): within one instant, key descending.
	require.Len(t, got, len(want))
	require.ElementsMatch(t, want, got)
	for i := 1; i < len(got); i++ {
		require.NotEqual(t, got[i-1], got[i])
	}
	inFlight, err := b.store.ListRecords(ctx, idem.ListRecordsParams{TenantID: "acme", State: idem.StateInFlight, Limit: 100})
	require.NoError(t, err)
	require.Len(t, inFlight, 7)
	completed, err := b.store.ListRecords(ctx, idem.ListRecordsParams{TenantID: "acme", State: idem.StateCompleted, Limit: 100})
	require.NoError(t, err)
	require.Empty(t, completed)
}

// TestConcurrentReapDeletesEachRecordOnce: reapers on two Store instances of
// one file, racing in small batches, delete every purgeable record exactly
// once and leave the live ones.
func TestConcurrentReapDeletesEachRecordOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	other := openStore(t, b.path, b.clock.Now)
	ctx := context.Background()
	createTenant(t, b.store, "acme")
	gone := createTenant(t, b.store, "gone")

	const old = 40
	for i := range old {
		_, err := b.store.Claim(ctx, claimParams("acme", fmt.Sprintf("old-%d", i)))
		require.NoError(t, err)
	}
	for i := range 5 {
		_, err := b.store.Claim(ctx, claimParams("gone", fmt.Sprintf("k-%d", i)))
		require.NoError(t, err)
	}
	b.clock.Advance(2 * time.Hour) // the reaper threshold of claimParams
	live, err := b.store.Claim(ctx, claimParams("acme", "live"))
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

func TestTenants(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	created := createTenant(t, b.store, "acme")
	require.Equal(t, idem.DefaultSettings(), created.Settings)
	_, err := b.store.CreateTenant(ctx, idem.CreateTenantParams{ID: "acme", Name: "again", Settings: idem.DefaultSettings()})
	require.ErrorIs(t, err, idem.ErrTenantExists)

	_, err = b.store.GetTenant(ctx, "nobody")
	require.ErrorIs(t, err, idem.ErrTenantNotFound)
	_, err = b.store.UpdateTenant(ctx, idem.UpdateTenantParams{ID: "nobody", Name: "x", Settings: idem.DefaultSettings()})
	require.ErrorIs(t, err, idem.ErrTenantNotFound)

	settings := idem.DefaultSettings()
	settings.RateLimitPerSecond = 7
	b.clock.Advance(time.Second)
	updated, err := b.store.UpdateTenant(ctx, idem.UpdateTenantParams{ID: "acme", Name: "Acme Inc", Settings: settings, Disabled: true})
	require.NoError(t, err)
	require.True(t, updated.Disabled)
	require.Equal(t, settings, updated.Settings)
	require.Equal(t, created.CreatedAt, updated.CreatedAt)
	require.Equal(t, b.clock.Now(), updated.UpdatedAt)

	createTenant(t, b.store, "beta")
	list, err := b.store.ListTenants(ctx)
	require.NoError(t, err)
	require.Len(t, list, 2)
	require.Equal(t, updated, list[0])
	require.Equal(t, "beta", list[1].ID)
}

func TestClosedStoreIsUnavailable(t *testing.T) {
	t.Parallel()
	b := setup(t)
	require.NoError(t, b.store.Close())
	_, err := b.store.Claim(context.Background(), claimParams("acme", "k"))
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
					if _, err := s.Claim(ctx, claimParams("acme", fmt.Sprintf("g%d-%d", g, i))); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}
