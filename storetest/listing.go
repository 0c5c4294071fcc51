package storetest

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem"
)

func testGetRecordAllFields(t *testing.T, s *suite) {
	b := s.setup(t, "acme")
	p := claimTimed("acme", "order-42", 10*time.Second, 30*time.Minute, 90*time.Minute)
	created := b.now()
	rec := b.claim(t, p).Record
	b.advance(30 * time.Second)
	taken := b.claim(t, p).Record
	b.advance(time.Second)
	b.checkpoint(t, idem.CheckpointParams{
		TenantID: "acme", Key: "order-42", FencingToken: taken.FencingToken,
		RecoveryPoint: "charge_created", Data: []byte(`{"charge":"ch_1"}`), Lease: p.Lease,
	})
	b.advance(2 * time.Second)
	completed := b.now()
	b.complete(t, "acme", "order-42", taken.FencingToken, response(7))
	b.advance(time.Minute)

	r := b.get(t, "acme", "order-42")
	require.Equal(t, "acme", r.TenantID)
	require.Equal(t, "order-42", r.Key)
	require.Equal(t, idem.StateCompleted, r.State)
	require.Equal(t, defaultOperation, r.Operation)
	require.Equal(t, defaultFingerprint, r.Fingerprint)
	require.Equal(t, taken.FencingToken, r.FencingToken)
	require.Greater(t, r.FencingToken, rec.FencingToken)
	require.Equal(t, 2, r.Attempt)
	require.True(t, r.LeaseExpiresAt.IsZero())
	require.Equal(t, "charge_created", r.RecoveryPoint)
	requireBytes(t, []byte(`{"charge":"ch_1"}`), r.RecoveryData, "RecoveryData")
	requireResponse(t, response(7), r.Response)
	require.Equal(t, 30*time.Minute, r.ReplayWindow)
	require.Equal(t, 90*time.Minute, r.ReaperThreshold)
	requireTime(t, created, r.CreatedAt, "CreatedAt")
	requireTime(t, completed, r.UpdatedAt, "UpdatedAt")
	requireTime(t, completed, r.CompletedAt, "CompletedAt")
	requireTime(t, completed.Add(30*time.Minute), r.ReplayUntil, "ReplayUntil")
	require.False(t, r.PurgeAfter.Before(r.ReplayUntil))
	require.False(t, r.PurgeAfter.Before(created.Add(90*time.Minute)))
	requireTime(t, b.now(), r.ObservedAt, "ObservedAt")
	require.Equal(t, idem.StateCompleted, r.APIState())
}

func testGetRecordAPIStates(t *testing.T, s *suite) {
	b := s.setup(t, "acme")
	p := ClaimParams("acme", "k")
	p.ReplayWindow = time.Hour
	rec := b.claim(t, p).Record
	require.Equal(t, idem.StateInFlight, b.get(t, "acme", "k").APIState())

	b.advance(defaultLease + time.Second)
	got := b.get(t, "acme", "k")
	require.Equal(t, idem.StateInFlight, got.State, "stored state of an orphan")
	require.Equal(t, idem.StateOrphaned, got.APIState())
	require.Zero(t, got.LeaseLeft())

	b.complete(t, "acme", "k", rec.FencingToken, response(1))
	require.Equal(t, idem.StateCompleted, b.get(t, "acme", "k").APIState())

	b.advance(time.Hour)
	got = b.get(t, "acme", "k")
	require.Equal(t, idem.StateCompleted, got.State, "stored state of an expired record")
	require.Equal(t, idem.StateExpired, got.APIState())
	requireResponse(t, response(1), got.Response)
	requireTime(t, b.now(), got.ObservedAt, "ObservedAt")
}

// fourStates creates, in tenant, one record in each API state and returns
// their keys by state, created in the order expired, orphaned, completed,
// in_flight, one second apart or more.
func fourStates(t *testing.T, b *bundle, tenant string) map[idem.State]string {
	t.Helper()
	keys := map[idem.State]string{
		idem.StateExpired:   "k-expired",
		idem.StateOrphaned:  "k-orphaned",
		idem.StateCompleted: "k-completed",
		idem.StateInFlight:  "k-inflight",
	}
	p := ClaimParams(tenant, keys[idem.StateExpired])
	p.ReplayWindow = 100 * time.Second
	rec := b.claim(t, p).Record
	b.complete(t, tenant, rec.Key, rec.FencingToken, response(1))

	b.advance(50 * time.Second)
	p = ClaimParams(tenant, keys[idem.StateOrphaned])
	p.Lease = 10 * time.Second
	b.claim(t, p)

	b.advance(60 * time.Second)
	rec = b.claim(t, ClaimParams(tenant, keys[idem.StateCompleted])).Record
	b.complete(t, tenant, rec.Key, rec.FencingToken, response(2))

	b.advance(time.Second)
	b.claim(t, ClaimParams(tenant, keys[idem.StateInFlight]))
	return keys
}

func testListRecordsNewestFirst(t *testing.T, s *suite) {
	b := s.setup(t, "acme")
	var want []string
	for i := range 6 {
		key := fmt.Sprintf("k-%d", i)
		rec := b.create(t, "acme", key)
		if i%2 == 0 {
			b.complete(t, "acme", key, rec.FencingToken, response(i))
		}
		want = append([]string{key}, want...)
		b.advance(time.Second)
	}
	recs, err := b.store.ListRecords(b.ctx, idem.ListRecordsParams{TenantID: "acme", Limit: 100})
	require.NoError(t, err)
	require.Equal(t, want, keysOf(recs))
	for _, r := range recs {
		requireNoBody(t, r)
		require.Equal(t, "acme", r.TenantID)
		requireTime(t, b.now(), r.ObservedAt, "ObservedAt")
	}

	recs, err = b.store.ListRecords(b.ctx, idem.ListRecordsParams{TenantID: "acme", Limit: 2})
	require.NoError(t, err)
	require.Equal(t, want[:2], keysOf(recs), "limit")
}

func testListRecordsStateFilter(t *testing.T, s *suite) {
	b := s.setup(t, "acme")
	keys := fourStates(t, b, "acme")

	for state, key := range keys {
		recs, err := b.store.ListRecords(b.ctx, idem.ListRecordsParams{TenantID: "acme", State: state, Limit: 100})
		require.NoError(t, err, state)
		require.Equal(t, []string{key}, keysOf(recs), "state %s", state)
		require.Equal(t, state, recs[0].APIState(), "state %s", state)
		requireNoBody(t, recs[0])
	}
	recs, err := b.store.ListRecords(b.ctx, idem.ListRecordsParams{TenantID: "acme", Limit: 100})
	require.NoError(t, err)
	require.Equal(t, []string{"k-inflight", "k-completed", "k-orphaned", "k-expired"}, keysOf(recs))
	for _, r := range recs {
		requireNoBody(t, r)
	}
}

func testListRecordsPagination(t *testing.T, s *suite) {
	b := s.setup(t, "acme")
	type row struct {
		created time.Time
		key     string
	}
	var rows []row
	completed := map[string]bool{}
	// Groups of three share a creation instant, so the cursor must break
	// ties by key.
	for i := range 23 {
		if i%3 == 0 {
			b.advance(time.Second)
		}
		key := fmt.Sprintf("key-%02d", (i*7)%23)
		rec := b.create(t, "acme", key)
		rows = append(rows, row{rec.CreatedAt, key})
		if i%2 == 1 {
			b.complete(t, "acme", key, rec.FencingToken, response(i))
			completed[key] = true
		}
	}
	slices.SortFunc(rows, func(x, y row) int {
		if c := y.created.Compare(x.created); c != 0 {
			return c
		}
		return strings.Compare(y.key, x.key)
	})
	var want, wantCompleted []string
	for _, r := range rows {
		want = append(want, r.key)
		if completed[r.key] {
			wantCompleted = append(wantCompleted, r.key)
		}
	}

	page := func(state idem.State, limit int) []string {
		t.Helper()
		var got []string
		var after *idem.Cursor
		for range 100 {
			recs, err := b.store.ListRecords(b.ctx, idem.ListRecordsParams{TenantID: "acme", State: state, Limit: limit, After: after})
			require.NoError(t, err)
			require.LessOrEqual(t, len(recs), limit)
			if len(recs) == 0 {
				return got
			}
			for _, r := range recs {
				requireNoBody(t, r)
			}
			got = append(got, keysOf(recs)...)
			last := recs[len(recs)-1]
			after = &idem.Cursor{Time: last.CreatedAt, TenantID: last.TenantID, Key: last.Key}
		}
		t.Fatal("pagination does not end")
		return nil
	}
	require.Equal(t, want, page("", 5), "every record exactly once, newest first")
	require.Equal(t, want, page("", 1), "page size 1")
	require.Equal(t, want, page("", 3), "page size 3 (ties span pages)")
	require.Equal(t, wantCompleted, page(idem.StateCompleted, 4), "filtered pages")
}

func testListOrphans(t *testing.T, s *suite) {
	b := s.setup(t)
	t0 := b.now()
	orphansFixture(t, b)

	recs, err := b.store.ListOrphans(b.ctx, idem.ListOrphansParams{Limit: 100})
	require.NoError(t, err)
	require.Equal(t, []string{"beta/b1", "alpha/a1", "gamma/g1", "gamma/g2", "alpha/a2"}, tenantKeys(recs))
	wantExpiry := []time.Duration{5 * time.Second, 10 * time.Second, 10 * time.Second, 10 * time.Second, 20 * time.Second}
	for i, r := range recs {
		require.Equal(t, idem.StateOrphaned, r.APIState(), r.Key)
		requireTime(t, t0.Add(wantExpiry[i]), r.LeaseExpiresAt, r.Key+" LeaseExpiresAt")
		requireNoBody(t, r)
		requireTime(t, b.now(), r.ObservedAt, "ObservedAt")
	}

	recs, err = b.store.ListOrphans(b.ctx, idem.ListOrphansParams{TenantID: "alpha", Limit: 100})
	require.NoError(t, err)
	require.Equal(t, []string{"alpha/a1", "alpha/a2"}, tenantKeys(recs))

	recs, err = b.store.ListOrphans(b.ctx, idem.ListOrphansParams{TenantID: "nobody", Limit: 100})
	require.NoError(t, err)
	require.Empty(t, recs)

	recs, err = b.store.ListOrphans(b.ctx, idem.ListOrphansParams{Limit: 2})
	require.NoError(t, err)
	require.Equal(t, []string{"beta/b1", "alpha/a1"}, tenantKeys(recs), "limit")
}

func testListOrphansPagination(t *testing.T, s *suite) {
	b := s.setup(t)
	orphansFixture(t, b)
	for _, tc := range []struct {
		tenant string
		limit  int
		want   []string
	}{
		{"", 2, []string{"beta/b1", "alpha/a1", "gamma/g1", "gamma/g2", "alpha/a2"}},
		{"", 1, []string{"beta/b1", "alpha/a1", "gamma/g1", "gamma/g2", "alpha/a2"}},
		{"gamma", 1, []string{"gamma/g1", "gamma/g2"}},
	} {
		var got []string
		var after *idem.Cursor
		for range 100 {
			recs, err := b.store.ListOrphans(b.ctx, idem.ListOrphansParams{TenantID: tc.tenant, Limit: tc.limit, After: after})
			require.NoError(t, err)
			require.LessOrEqual(t, len(recs), tc.limit)
			if len(recs) == 0 {
				break
			}
			got = append(got, tenantKeys(recs)...)
			last := recs[len(recs)-1]
			after = &idem.Cursor{Time: last.LeaseExpiresAt, TenantID: last.TenantID, Key: last.Key}
		}
		require.Equal(t, tc.want, got, "tenant %q limit %d", tc.tenant, tc.limit)
	}
}

func testOrphanStats(t *testing.T, s *suite) {
	b := s.setup(t)
	t0 := b.now()
	orphansFixture(t, b)

	stats, err := b.store.OrphanStats(b.ctx)
	require.NoError(t, err)
	slices.SortFunc(stats, func(x, y idem.OrphanStat) int { return strings.Compare(x.TenantID, y.TenantID) })
	require.Len(t, stats, 3, "only tenants with orphans: %+v", stats)
	want := []struct {
		tenant string
		count  int64
		oldest time.Duration
	}{
		{"alpha", 2, 10 * time.Second},
		{"beta", 1, 5 * time.Second},
		{"gamma", 2, 10 * time.Second},
	}
	for i, w := range want {
		require.Equal(t, w.tenant, stats[i].TenantID)
		require.Equal(t, w.count, stats[i].Count, w.tenant)
		requireTime(t, t0.Add(w.oldest), stats[i].OldestLeaseExpiry, w.tenant+" OldestLeaseExpiry")
		requireTime(t, b.now(), stats[i].ObservedAt, w.tenant+" ObservedAt")
	}

	// Orphans taken over leave the stats.
	b.claim(t, ClaimParams("beta", "b1"))
	for _, key := range []string{"g1", "g2"} {
		b.claim(t, ClaimParams("gamma", key))
	}
	stats, err = b.store.OrphanStats(b.ctx)
	require.NoError(t, err)
	require.Len(t, stats, 1)
	require.Equal(t, "alpha", stats[0].TenantID)
	require.EqualValues(t, 2, stats[0].Count)
}

// orphansFixture creates three tenants with orphans whose leases ran out at
// t0+5s (beta/b1), t0+10s (alpha/a1, gamma/g1, gamma/g2) and t0+20s
// (alpha/a2), plus records that are not orphans: one in flight with a
// running lease, one whose lease a checkpoint renewed, one completed, one
// completed after its lease ran out, and one released. The clock ends at
// t0+30s.
func orphansFixture(t *testing.T, b *bundle) {
	t.Helper()
	for _, id := range []string{"gamma", "alpha", "beta"} {
		b.tenant(t, id)
	}
	leased := func(tenant, key string, lease time.Duration) idem.Record {
		p := ClaimParams(tenant, key)
		p.Lease = lease
		return b.claim(t, p).Record
	}
	leased("gamma", "g2", 10*time.Second)
	leased("alpha", "a1", 10*time.Second)
	leased("beta", "b1", 5*time.Second)
	leased("gamma", "g1", 10*time.Second)
	leased("alpha", "a2", 20*time.Second)
	leased("beta", "running", 1000*time.Second)
	renewed := leased("beta", "renewed", 5*time.Second)
	done := leased("alpha", "done", 5*time.Second)
	b.complete(t, "alpha", "done", done.FencingToken, response(1))
	late := leased("gamma", "late", 5*time.Second)
	released := leased("alpha", "released", 5*time.Second)
	require.NoError(t, b.store.Release(b.ctx, idem.ReleaseParams{TenantID: "alpha", Key: "released", FencingToken: released.FencingToken}))

	b.advance(6 * time.Second)
	b.checkpoint(t, idem.CheckpointParams{TenantID: "beta", Key: "renewed", FencingToken: renewed.FencingToken, RecoveryPoint: "p", Lease: 1000 * time.Second})
	b.complete(t, "gamma", "late", late.FencingToken, response(2))
	b.advance(24 * time.Second)
}

// tenantKeys returns "tenant/key" of records, in order.
func tenantKeys(recs []idem.Record) []string {
	out := make([]string, len(recs))
	for i, r := range recs {
		out[i] = r.TenantID + "/" + r.Key
	}
	return out
}

// reapAll reaps with limit until nothing is left, requiring every batch to
// respect the limit, and returns the deleted "tenant/key" sorted.
func reapAll(t *testing.T, b *bundle, limit int) []string {
	t.Helper()
	var got []string
	for range 1000 {
		recs, err := b.store.Reap(b.ctx, idem.ReapParams{Limit: limit})
		require.NoError(t, err)
		require.LessOrEqual(t, len(recs), limit, "reap batch over the limit")
		if len(recs) == 0 {
			slices.Sort(got)
			return got
		}
		for _, r := range recs {
			requireNoBody(t, r)
		}
		got = append(got, tenantKeys(recs)...)
	}
	t.Fatal("reap does not end")
	return nil
}

func testReapPastPurgeAfter(t *testing.T, s *suite) {
	b := s.setup(t)
	b.tenantWith(t, "acme", withTimes(idem.DefaultSettings(), 60, 120, 10, 60))
	short := func(key string) idem.ClaimParams {
		p := claimTimed("acme", key, 10*time.Second, 60*time.Second, 120*time.Second)
		return p
	}

	// Old records: an orphan and a completed one.
	oldOrphan := b.claim(t, short("old-orphan")).Record
	oldDone := b.claim(t, short("old-done")).Record
	oldDone = b.complete(t, "acme", "old-done", oldDone.FencingToken, response(1))
	// Young records, 100 s later.
	b.advance(100 * time.Second)
	young := b.claim(t, short("young-done")).Record
	young = b.complete(t, "acme", "young-done", young.FencingToken, response(2))
	youngFlight := b.claim(t, short("young-inflight")).Record

	horizon := oldOrphan.PurgeAfter
	if oldDone.PurgeAfter.After(horizon) {
		horizon = oldDone.PurgeAfter
	}
	require.True(t, horizon.Before(young.PurgeAfter) && horizon.Before(youngFlight.PurgeAfter),
		"the young records should outlive the old ones")

	// Nothing is due yet.
	b.clock.Set(oldOrphan.CreatedAt.Add(119 * time.Second))
	recs, err := b.store.Reap(b.ctx, idem.ReapParams{Limit: 100})
	require.NoError(t, err)
	require.Empty(t, recs, "reaped before PurgeAfter")

	b.clock.Set(horizon.Add(time.Second))
	require.Equal(t, []string{"acme/old-done", "acme/old-orphan"}, reapAll(t, b, 100))
	b.requireAbsent(t, "acme", "old-done")
	b.requireAbsent(t, "acme", "old-orphan")
	b.get(t, "acme", "young-done")
	b.get(t, "acme", "young-inflight")

	// The reaped key starts afresh with a higher token.
	res := b.claim(t, short("old-orphan"))
	require.Equal(t, idem.ActionCreate, res.Action)
	require.Equal(t, 1, res.Record.Attempt)
	require.Greater(t, res.Record.FencingToken, youngFlight.FencingToken)
}

func testReapBatches(t *testing.T, s *suite) {
	b := s.setup(t, "acme", "beta")
	var want []string
	for i := range 10 {
		tenant := []string{"acme", "beta"}[i%2]
		key := fmt.Sprintf("k-%d", i)
		rec := b.create(t, tenant, key)
		if i%3 == 0 {
			b.complete(t, tenant, key, rec.FencingToken, response(i))
		}
		want = append(want, tenant+"/"+key)
	}
	slices.Sort(want)
	b.advance(defaultReaperThreshold + defaultReplayWindow + time.Hour)

	var sizes []int
	var got []string
	for range 10 {
		recs, err := b.store.Reap(b.ctx, idem.ReapParams{Limit: 3})
		require.NoError(t, err)
		sizes = append(sizes, len(recs))
		if len(recs) == 0 {
			break
		}
		got = append(got, tenantKeys(recs)...)
	}
	require.Equal(t, []int{3, 3, 3, 1, 0}, sizes, "batch sizes with limit 3")
	slices.Sort(got)
	require.Equal(t, want, got, "each record deleted once")
}

// testReapNeverDeletesRunningLease: whatever the reaper threshold says, an
// in-flight record is not reaped while its lease runs, including a lease a
// checkpoint renewed or a takeover granted; once the lease has run out it is
// reaped as an orphan.
func testReapNeverDeletesRunningLease(t *testing.T, s *suite) {
	b := s.setup(t, "acme")
	p := claimTimed("acme", "long", 60*time.Second, 2*time.Second, 3*time.Second)
	rec := b.claim(t, p).Record
	require.False(t, rec.PurgeAfter.Before(rec.LeaseExpiresAt), "purge_after %s is before the lease ends %s", rec.PurgeAfter, rec.LeaseExpiresAt)
	reapNone := func(when string) {
		t.Helper()
		recs, err := b.store.Reap(b.ctx, idem.ReapParams{Limit: 100})
		require.NoError(t, err)
		require.Empty(t, keysOf(recs), "reaped a running lease %s", when)
	}

	b.advance(10 * time.Second) // past the threshold, inside the lease
	reapNone("10 s into a 60 s lease")

	// A checkpoint at 50 s renews the lease to 110 s.
	b.advance(40 * time.Second)
	rec = b.checkpoint(t, idem.CheckpointParams{TenantID: "acme", Key: "long", FencingToken: rec.FencingToken, RecoveryPoint: "charged", Lease: 60 * time.Second})
	require.False(t, rec.PurgeAfter.Before(rec.LeaseExpiresAt), "checkpoint: purge_after %s is before the lease ends %s", rec.PurgeAfter, rec.LeaseExpiresAt)
	b.advance(59 * time.Second)
	reapNone("inside a lease renewed by a checkpoint")
	got := b.get(t, "acme", "long")
	require.Equal(t, rec.FencingToken, got.FencingToken)
	require.Equal(t, "charged", got.RecoveryPoint)

	// The lease runs out; a takeover grants a new 60 s lease.
	b.advance(2 * time.Second)
	res := b.claim(t, p)
	require.Equal(t, idem.ActionTakeover, res.Action)
	require.False(t, res.Record.PurgeAfter.Before(res.Record.LeaseExpiresAt), "takeover: purge_after %s is before the lease ends %s", res.Record.PurgeAfter, res.Record.LeaseExpiresAt)
	b.advance(59 * time.Second)
	reapNone("inside a lease granted by a takeover")

	// Past the lease, the record is an orphan and may go.
	b.clock.Set(res.Record.LeaseExpiresAt)
	recs, err := b.store.Reap(b.ctx, idem.ReapParams{Limit: 100})
	require.NoError(t, err)
	require.Equal(t, []string{"long"}, keysOf(recs))
	require.Equal(t, idem.StateOrphaned, recs[0].APIState(), "an in-flight record the reaper deletes is an orphan")
	require.Equal(t, "charged", recs[0].RecoveryPoint)
}

// testReapDisabledTenantKeepsRecords: disabling a tenant is reversible; the
// reaper treats its records like any others (deleted only past their purge
// time), so re-enabling finds every record as it was.
func testReapDisabledTenantKeepsRecords(t *testing.T, s *suite) {
	b := s.setup(t)
	off := b.tenant(t, "off")
	b.tenant(t, "on")
	inflight := b.create(t, "off", "inflight")
	done := b.create(t, "off", "done")
	done = b.complete(t, "off", "done", done.FencingToken, response(1))
	b.create(t, "on", "inflight")

	_, err := b.store.UpdateTenant(b.ctx, idem.UpdateTenantParams{ID: "off", Name: off.Name, Settings: off.Settings, Disabled: true})
	require.NoError(t, err)
	b.advance(time.Hour)
	require.Empty(t, reapAll(t, b, 1), "the reaper deleted records of a disabled tenant before their purge time")

	_, err = b.store.UpdateTenant(b.ctx, idem.UpdateTenantParams{ID: "off", Name: off.Name, Settings: off.Settings, Disabled: false})
	require.NoError(t, err)
	requireSameRecord(t, done, b.get(t, "off", "done"))
	got := b.get(t, "off", "inflight")
	require.Equal(t, inflight.FencingToken, got.FencingToken)
	res := b.claim(t, ClaimParams("off", "done"))
	require.Equal(t, idem.ActionReplay, res.Action, "a completed key of a re-enabled tenant is replayed")
	requireResponse(t, response(1), res.Record.Response)

	// Past their purge time, a disabled tenant's records go like any others.
	_, err = b.store.UpdateTenant(b.ctx, idem.UpdateTenantParams{ID: "off", Name: off.Name, Settings: off.Settings, Disabled: true})
	require.NoError(t, err)
	b.advance(defaultReaperThreshold)
	require.Equal(t, []string{"off/done", "off/inflight", "on/inflight"}, reapAll(t, b, 10))
}

// testListsOmitRecoveryData: listings, orphan lists and reaped records carry
// neither responses nor recovery data, so a page stays small whatever the
// records hold; GetRecord still returns the recovery data whole.
func testListsOmitRecoveryData(t *testing.T, s *suite) {
	b := s.setup(t, "acme")
	data := []byte(`{"charge":"` + strings.Repeat("x", 4096) + `"}`)
	p := ClaimParams("acme", "big")
	p.Lease = 10 * time.Second
	p.ReaperThreshold = time.Hour
	rec := b.claim(t, p).Record
	b.checkpoint(t, idem.CheckpointParams{
		TenantID: "acme", Key: "big", FencingToken: rec.FencingToken,
		RecoveryPoint: "charged", Data: data, Lease: p.Lease,
	})
	requireBytes(t, data, b.get(t, "acme", "big").RecoveryData, "GetRecord RecoveryData")

	listed, err := b.store.ListRecords(b.ctx, idem.ListRecordsParams{TenantID: "acme", Limit: 10})
	require.NoError(t, err)
	require.Equal(t, []string{"big"}, keysOf(listed))
	require.Equal(t, "charged", listed[0].RecoveryPoint)
	require.Zero(t, len(listed[0].RecoveryData), "ListRecords must not return recovery data")

	b.advance(time.Minute) // the lease runs out: the record is an orphan
	orphans, err := b.store.ListOrphans(b.ctx, idem.ListOrphansParams{TenantID: "acme", Limit: 10})
	require.NoError(t, err)
	require.Equal(t, []string{"acme/big"}, tenantKeys(orphans))
	require.Equal(t, "charged", orphans[0].RecoveryPoint)
	require.Zero(t, len(orphans[0].RecoveryData), "ListOrphans must not return recovery data")

	b.advance(2 * time.Hour) // past purge_after
	reaped, err := b.store.Reap(b.ctx, idem.ReapParams{Limit: 10})
	require.NoError(t, err)
	require.Equal(t, []string{"acme/big"}, tenantKeys(reaped))
	require.Zero(t, len(reaped[0].RecoveryData), "Reap must not return recovery data")
}
