package storetest

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem"
)

// The Quota group: a store counts each tenant's stored bytes
// (idem.Record.StoredBytes summed, Tenant.StoredBytes) exactly, in the
// transaction of every write that changes them, and refuses a claim that
// would create a record while the tenant is at or over storage_quota_bytes.

// RequireMigratedUsage checks a store just migrated to storage quotas from
// a ledger holding tenant "acme" with records "flight-é" (in flight) and
// "done" (completed) and tenant "empty" with none: the migration counted
// acme's records as Record.StoredBytes does, gave every tenant the default
// quota, and the next write is counted on top. Both stores' migration
// tests seed those records in their own SQL and call it.
func RequireMigratedUsage(t *testing.T, s idem.Store) {
	t.Helper()
	ctx := t.Context()
	var want int64
	for _, k := range []string{"flight-é", "done"} {
		rec, err := s.GetRecord(ctx, idem.GetRecordParams{TenantID: "acme", Key: k})
		require.NoError(t, err)
		want += rec.StoredBytes()
	}
	acme, err := s.GetTenant(ctx, idem.GetTenantParams{ID: "acme"})
	require.NoError(t, err)
	require.Equal(t, want, acme.StoredBytes, "the migration counted the records as Record.StoredBytes does")
	require.Equal(t, int64(idem.DefaultStorageQuotaBytes), acme.Settings.StorageQuotaBytes)
	empty, err := s.GetTenant(ctx, idem.GetTenantParams{ID: "empty"})
	require.NoError(t, err)
	require.Zero(t, empty.StoredBytes)

	flight, err := s.GetRecord(ctx, idem.GetRecordParams{TenantID: "acme", Key: "flight-é"})
	require.NoError(t, err)
	resp := idem.Response{Status: 200, Headers: map[string]string{"A": "b"}, Body: []byte("ok"), BodyEncoding: idem.BodyEncodingUTF8}
	_, err = s.Complete(ctx, idem.CompleteParams{TenantID: "acme", Key: "flight-é", FencingToken: flight.FencingToken, Response: resp})
	require.NoError(t, err)
	acme, err = s.GetTenant(ctx, idem.GetTenantParams{ID: "acme"})
	require.NoError(t, err)
	require.Equal(t, want+int64(resp.Size()), acme.StoredBytes)
}

// usage reads tenant's usage from the store.
func (b *bundle) usage(t *testing.T, tenant string) int64 {
	t.Helper()
	ten, err := b.store.GetTenant(b.ctx, idem.GetTenantParams{ID: tenant})
	require.NoError(t, err, "get tenant %s", tenant)
	return ten.StoredBytes
}

// requireUsage requires tenant's usage to be the sum of StoredBytes of keys
// as GetRecord reads them, and want.
func (b *bundle) requireUsage(t *testing.T, tenant string, want int64, keys ...string) {
	t.Helper()
	var sum int64
	for _, k := range keys {
		sum += b.get(t, tenant, k).StoredBytes()
	}
	require.Equal(t, want, sum, "the records of %s store %d bytes by Record.StoredBytes, the test expected %d", tenant, sum, want)
	require.Equal(t, want, b.usage(t, tenant), "usage of tenant %s", tenant)
	list, err := b.store.ListTenants(b.ctx)
	require.NoError(t, err)
	for _, ten := range list {
		if ten.ID == tenant {
			require.Equal(t, want, ten.StoredBytes, "usage of tenant %s in ListTenants", tenant)
		}
	}
}

// recovery returns recovery data of n bytes (a JSON string).
func recovery(n int) json.RawMessage {
	return json.RawMessage(`"` + strings.Repeat("r", n-2) + `"`)
}

// claimBytes is what a record created by ClaimParams(_, key) counts.
func claimBytes(key string) int64 {
	return int64(len(key) + len(defaultOperation) + len(defaultFingerprint))
}

// testQuotaCountsEveryWrite: each write's bytes, one at a time, on exact
// expected numbers: a claim counts key, operation and fingerprint, a
// checkpoint replaces the recovery point and data, a complete adds the
// response, a takeover and a replay change nothing, and a claim of an
// expired key replaces its record.
func testQuotaCountsEveryWrite(t *testing.T, s *suite) {
	b := s.setup(t, "acme")
	require.Zero(t, b.usage(t, "acme"), "a new tenant stores nothing")

	k := b.create(t, "acme", "k1")
	base := claimBytes("k1")
	b.requireUsage(t, "acme", base, "k1")

	cp := idem.CheckpointParams{TenantID: "acme", Key: "k1", FencingToken: k.FencingToken, RecoveryPoint: "charged", Data: recovery(100), Lease: defaultLease}
	b.checkpoint(t, cp)
	b.requireUsage(t, "acme", base+7+100, "k1")
	cp.RecoveryPoint, cp.Data = "shipped", recovery(10)
	b.checkpoint(t, cp)
	b.requireUsage(t, "acme", base+7+10, "k1")
	cp.Data = nil
	b.checkpoint(t, cp)
	b.requireUsage(t, "acme", base+7, "k1")

	// a takeover keeps the record and its bytes
	b.advance(defaultLease)
	took := b.claim(t, ClaimParams("acme", "k1"))
	require.Equal(t, idem.ActionTakeover, took.Action)
	b.requireUsage(t, "acme", base+7, "k1")

	resp := response(1)
	b.complete(t, "acme", "k1", took.Record.FencingToken, resp)
	done := base + 7 + int64(resp.Size())
	b.requireUsage(t, "acme", done, "k1")
	// completing again with the same response is a no-op
	b.complete(t, "acme", "k1", took.Record.FencingToken, resp)
	b.requireUsage(t, "acme", done, "k1")
	require.Equal(t, idem.ActionReplay, b.claim(t, ClaimParams("acme", "k1")).Action)
	b.requireUsage(t, "acme", done, "k1")

	// an expired record counts until a claim replaces it with a fresh one
	b.advance(defaultReplayWindow)
	require.Equal(t, idem.ActionCreate, b.claim(t, ClaimParams("acme", "k1")).Action)
	b.requireUsage(t, "acme", base, "k1")

	// an empty response counts nothing more; other tenants are apart
	b.tenant(t, "other")
	o := b.create(t, "other", "k1")
	b.complete(t, "other", "k1", o.FencingToken, idem.Response{Status: 204, Headers: map[string]string{}, BodyEncoding: idem.BodyEncodingUTF8})
	b.requireUsage(t, "other", base, "k1")
	b.requireUsage(t, "acme", base, "k1")
}

// testQuotaConcurrentWrites: racers of one tenant create, checkpoint (twice,
// several times at once on the same key, replacing the data) and complete
// their keys at the same time; the usage is then exactly what the records
// hold. A drift of one write shows.
func testQuotaConcurrentWrites(t *testing.T, s *suite) {
	b := s.setup(t, "acme")
	const n = 32
	keys := make([]string, n)
	errs := make([]error, n)
	race(n, func(i int) {
		keys[i] = fmt.Sprintf("key-%d", i)
		errs[i] = func() error {
			res, err := b.store.Claim(b.ctx, ClaimParams("acme", keys[i]))
			if err != nil {
				return err
			}
			token := res.Record.FencingToken
			// the same attempt checkpoints three times at once (a retried
			// checkpoint): whichever lands last is the stored one
			cps := make([]error, 3)
			race(3, func(j int) {
				_, cps[j] = b.store.Checkpoint(b.ctx, idem.CheckpointParams{TenantID: "acme", Key: keys[i], FencingToken: token,
					RecoveryPoint: "p", Data: recovery(10 + 50*j + i), Lease: defaultLease})
			})
			for _, err := range cps {
				if err != nil {
					return err
				}
			}
			if i%4 == 0 {
				return nil // stays in flight with its recovery data
			}
			_, err = b.store.Complete(b.ctx, idem.CompleteParams{TenantID: "acme", Key: keys[i], FencingToken: token, Response: response(i)})
			return err
		}()
	})
	for i, err := range errs {
		require.NoError(t, err, "racer %d", i)
	}
	var want int64
	for _, k := range keys {
		want += b.get(t, "acme", k).StoredBytes()
	}
	require.Greater(t, want, int64(n)*claimBytes("key-0"))
	b.requireUsage(t, "acme", want, keys...)
}

// testQuotaBackToZero: every way a record goes takes its bytes off its
// tenant: a release, an operator's release, the reaper's purge (completed
// and orphaned records), and deleting the tenant, whose usage does not
// outlive it (the id created again starts at zero).
func testQuotaBackToZero(t *testing.T, s *suite) {
	b := s.setup(t, "acme", "other")
	o := b.create(t, "other", "kept")
	b.complete(t, "other", "kept", o.FencingToken, response(7))
	otherBytes := b.usage(t, "other")
	require.Positive(t, otherBytes)

	// release
	r := b.create(t, "acme", "released")
	b.checkpoint(t, idem.CheckpointParams{TenantID: "acme", Key: "released", FencingToken: r.FencingToken, RecoveryPoint: "p", Data: recovery(40), Lease: defaultLease})
	require.NoError(t, b.store.Release(b.ctx, idem.ReleaseParams{TenantID: "acme", Key: "released", FencingToken: r.FencingToken}))
	b.requireUsage(t, "acme", 0)

	// an operator's release and completion of orphans
	or := b.orphan(t, "acme", "resolved-release")
	b.resolve(t, resolution("acme", "resolved-release", idem.ResolveRelease, or.FencingToken))
	b.requireUsage(t, "acme", 0)
	oc := b.orphan(t, "acme", "resolved-complete")
	b.resolve(t, resolution("acme", "resolved-complete", idem.ResolveComplete, oc.FencingToken))
	r99 := response(99)
	b.requireUsage(t, "acme", claimBytes("resolved-complete")+int64(r99.Size()), "resolved-complete")

	// the reaper's purge of completed and orphaned records
	c := b.create(t, "acme", "completed")
	b.complete(t, "acme", "completed", c.FencingToken, binaryResponse())
	orph := b.create(t, "acme", "orphaned")
	b.checkpoint(t, idem.CheckpointParams{TenantID: "acme", Key: "orphaned", FencingToken: orph.FencingToken, RecoveryPoint: "p", Data: recovery(30), Lease: defaultLease})
	require.Positive(t, b.usage(t, "acme"))
	b.advance(defaultReaperThreshold + time.Second)
	gone, err := b.store.Reap(b.ctx, idem.ReapParams{Limit: 100})
	require.NoError(t, err)
	require.Len(t, gone, 4, "the reaper purges every record of both tenants")
	b.requireUsage(t, "acme", 0)
	b.requireUsage(t, "other", 0)

	// deleting a tenant with records
	b.create(t, "acme", "a")
	d := b.create(t, "acme", "b")
	b.complete(t, "acme", "b", d.FencingToken, response(2))
	o2 := b.create(t, "other", "kept")
	b.complete(t, "other", "kept", o2.FencingToken, response(7))
	require.NoError(t, b.store.DeleteTenant(b.ctx, idem.DeleteTenantParams{ID: "acme"}))
	b.requireUsage(t, "other", otherBytes, "kept")
	b.tenant(t, "acme")
	b.requireUsage(t, "acme", 0)
}

// testQuotaRefusesNewRecords: at or over storage_quota_bytes, a claim that
// would create a record (an absent key, an expired one) is refused with
// storage_quota_exceeded before anything is stored, while every write that
// finishes work already claimed, takeovers and replays go on; the quota
// frees up as records go. Other tenants are not affected.
func testQuotaRefusesNewRecords(t *testing.T, s *suite) {
	b := s.setup(t, "acme", "other")
	per := claimBytes("k0")
	limited := func(key string) idem.ClaimParams {
		p := ClaimParams("acme", key)
		p.StorageQuotaBytes = 3 * per
		return p
	}

	// three claims fill the quota exactly; two more were in flight
	var recs []idem.Record
	for i := range 3 {
		res := b.claim(t, limited(fmt.Sprintf("k%d", i)))
		require.Equal(t, idem.ActionCreate, res.Action)
		recs = append(recs, res.Record)
	}
	require.Equal(t, 3*per, b.usage(t, "acme"))
	_, err := b.store.Claim(b.ctx, limited("k3"))
	requireCode(t, err, idem.ErrStorageQuotaExceeded)
	b.requireAbsent(t, "acme", "k3")
	require.Equal(t, 3*per, b.usage(t, "acme"), "a refused claim stores nothing")

	// work already claimed finishes over the quota
	b.checkpoint(t, idem.CheckpointParams{TenantID: "acme", Key: "k0", FencingToken: recs[0].FencingToken, RecoveryPoint: "p", Data: recovery(50), Lease: defaultLease})
	b.complete(t, "acme", "k1", recs[1].FencingToken, response(1))
	over := b.usage(t, "acme")
	require.Greater(t, over, 3*per)
	// replays and takeovers go on
	require.Equal(t, idem.ActionReplay, b.claim(t, limited("k1")).Action)
	b.advance(defaultLease)
	took := b.claim(t, limited("k0"))
	require.Equal(t, idem.ActionTakeover, took.Action, "a takeover continues work already claimed")
	require.Equal(t, "p", took.Record.RecoveryPoint)
	b.complete(t, "acme", "k0", took.Record.FencingToken, response(0))
	// another tenant is not affected
	op := ClaimParams("other", "k3")
	op.StorageQuotaBytes = 3 * per
	require.Equal(t, idem.ActionCreate, b.claim(t, op).Action)

	// a key whose window ran out would be a new record: refused too
	b.advance(defaultReplayWindow)
	_, err = b.store.Claim(b.ctx, limited("k1"))
	requireCode(t, err, idem.ErrStorageQuotaExceeded)
	_, err = b.store.Claim(b.ctx, limited("k9"))
	requireCode(t, err, idem.ErrStorageQuotaExceeded)
	var e *idem.Error
	require.ErrorAs(t, err, &e)
	require.Contains(t, e.Detail, fmt.Sprint(b.usage(t, "acme")), "the refusal says the usage")

	// the purge frees the quota
	b.advance(defaultReaperThreshold)
	_, err = b.store.Reap(b.ctx, idem.ReapParams{Limit: 100})
	require.NoError(t, err)
	require.Zero(t, b.usage(t, "acme"))
	require.Equal(t, idem.ActionCreate, b.claim(t, limited("k9")).Action)
}

// testQuotaRace: racers of one tenant claim new keys at once against a
// quota that fits 8 of them: nobody is refused below the quota, claims past
// it are refused (a store may let the claims that read the usage at once
// through, not all 32), every created record is counted and every refused
// one absent.
func testQuotaRace(t *testing.T, s *suite) {
	b := s.setup(t, "acme")
	per := claimBytes("key-00")
	const n, fit = 32, 8
	errs := make([]error, n)
	race(n, func(i int) {
		p := ClaimParams("acme", fmt.Sprintf("key-%02d", i))
		p.StorageQuotaBytes = fit * per
		_, errs[i] = b.store.Claim(b.ctx, p)
	})
	var created []string
	for i, err := range errs {
		if err == nil {
			created = append(created, fmt.Sprintf("key-%02d", i))
			continue
		}
		requireCode(t, err, idem.ErrStorageQuotaExceeded, "racer %d", i)
	}
	require.GreaterOrEqual(t, len(created), fit, "claims below the quota were refused")
	require.Less(t, len(created), n, "no claim was refused past the quota")
	b.requireUsage(t, "acme", int64(len(created))*per, created...)
	for i := range n {
		if k := fmt.Sprintf("key-%02d", i); errs[i] != nil {
			b.requireAbsent(t, "acme", k)
		}
	}
}

// bigResponse returns a response of size bytes (idem.Response.Size) whose
// body tells n apart.
func bigResponse(n, size int) idem.Response {
	r := idem.Response{Status: 201, Headers: map[string]string{"X-Order": fmt.Sprintf("ord_%03d", n)}, BodyEncoding: idem.BodyEncodingUTF8}
	r.Body = []byte(strings.Repeat("b", size-r.Size()))
	return r
}

// completeBounded completes key with resp against quota and returns what
// the store answered.
func (b *bundle) completeBounded(tenant, key string, token int64, resp idem.Response, quota int64) (idem.Record, error) {
	return b.store.Complete(b.ctx, idem.CompleteParams{TenantID: tenant, Key: key, FencingToken: token, Response: resp, StorageQuotaBytes: quota})
}

// requireUnstored requires that the complete of resp on key was answered
// storage_quota_exceeded with the key completed without it: the record
// answered and the one stored hold idem.UnstoredResponse(resp), a claim of
// the key replays that (never runs the key again, even past the lease it
// was claimed with), and a repeat of the complete answers the same.
func (b *bundle) requireUnstored(t *testing.T, tenant, key string, token int64, resp idem.Response, quota int64, rec idem.Record, err error) {
	t.Helper()
	requireCode(t, err, idem.ErrStorageQuotaExceeded, "the complete of %s", key)
	unstored := idem.UnstoredResponse(resp)
	require.Contains(t, unstored.Headers[idem.HeaderNotReplayable], "not stored")
	require.Equal(t, idem.StateCompleted, rec.State, "the key is completed all the same")
	requireResponse(t, unstored, rec.Response)
	stored := b.get(t, tenant, key)
	requireSameRecord(t, rec, stored)
	again, err := b.completeBounded(tenant, key, token, resp, quota)
	requireCode(t, err, idem.ErrStorageQuotaExceeded, "a repeat of the complete of %s", key)
	requireSameRecord(t, stored, again)
	replay := b.claim(t, ClaimParams(tenant, key))
	require.Equal(t, idem.ActionReplay, replay.Action, "a retry of %s ran it again", key)
	requireResponse(t, unstored, replay.Record.Response)
}

// testQuotaCompleteBounded: a complete whose response would take the
// tenant past storage_quota_bytes completes the key without it
// (idem.UnstoredResponse) and answers storage_quota_exceeded; the usage
// stays within the quota but for the unstored records' few bytes; a
// response no bigger than the unstored one is stored whatever the usage;
// a different response on the key is already_completed; the quota frees
// up as records go.
func testQuotaCompleteBounded(t *testing.T, s *suite) {
	b := s.setup(t, "acme")
	const size = 1000
	keys := []string{"k0", "k1", "k2", "k3", "k4"}
	toks := map[string]int64{}
	for _, k := range keys {
		toks[k] = b.create(t, "acme", k).FencingToken
	}
	claims := int64(len(keys)) * claimBytes("k0")
	quota := claims + 2*size + 10 // two responses fit, with ten bytes to spare

	for _, k := range keys[:2] {
		rec, err := b.completeBounded("acme", k, toks[k], bigResponse(0, size), quota)
		require.NoError(t, err, "a response within the quota")
		requireResponse(t, bigResponse(0, size), rec.Response)
	}
	require.Equal(t, quota-10, b.usage(t, "acme"))

	resp := bigResponse(2, size)
	rec, err := b.completeBounded("acme", "k2", toks["k2"], resp, quota)
	b.requireUnstored(t, "acme", "k2", toks["k2"], resp, quota, rec, err)
	unstored := int64(idem.UnstoredResponse(resp).Size())
	require.Less(t, unstored, int64(80))
	b.requireUsage(t, "acme", quota-10+unstored, keys...)
	// the answer of the run is not changed after the fact
	_, err = b.completeBounded("acme", "k2", toks["k2"], response(2), quota)
	requireCode(t, err, idem.ErrAlreadyCompleted)

	// a response no bigger than the unstored one costs no more than it:
	// stored over the quota too
	small := idem.Response{Status: 204, Headers: map[string]string{}, BodyEncoding: idem.BodyEncodingUTF8}
	rec, err = b.completeBounded("acme", "k3", toks["k3"], small, quota)
	require.NoError(t, err)
	requireResponse(t, small, rec.Response)

	// after a lease's time the unstored key still replays, never runs again
	b.advance(defaultLease)
	replay := b.claim(t, ClaimParams("acme", "k2"))
	require.Equal(t, idem.ActionReplay, replay.Action)

	// records going free the quota: k4's response fits again
	b.advance(defaultReplayWindow)
	b.advance(defaultReaperThreshold)
	_, err = b.store.Reap(b.ctx, idem.ReapParams{Limit: 100})
	require.NoError(t, err)
	k := b.create(t, "acme", "k4")
	rec, err = b.completeBounded("acme", "k4", k.FencingToken, bigResponse(4, size), quota)
	require.NoError(t, err)
	requireResponse(t, bigResponse(4, size), rec.Response)
}

// testQuotaCheckpointBounded: a checkpoint whose recovery data grows and
// would take the record past the quota renews the lease only, keeps the
// earlier point and data, and answers storage_quota_exceeded; one that
// shrinks the record, keeps its size, or saves a new point without more
// data (a lease keeper's renewal) is saved whatever the usage; a takeover
// resumes from what was kept.
func testQuotaCheckpointBounded(t *testing.T, s *suite) {
	b := s.setup(t, "acme")
	k0 := b.create(t, "acme", "k0")
	k1 := b.create(t, "acme", "k1")
	quota := 2*claimBytes("k0") + 7 + 100 + 5
	cp := func(key string, token int64, point string, data int) (idem.Record, error) {
		p := idem.CheckpointParams{TenantID: "acme", Key: key, FencingToken: token, RecoveryPoint: point, Lease: defaultLease, StorageQuotaBytes: quota}
		if data > 0 {
			p.Data = recovery(data)
		}
		return b.store.Checkpoint(b.ctx, p)
	}
	_, err := cp("k0", k0.FencingToken, "charged", 100)
	require.NoError(t, err, "a checkpoint within the quota")

	b.advance(defaultLease / 2)
	rec, err := cp("k1", k1.FencingToken, "charged", 500)
	requireCode(t, err, idem.ErrStorageQuotaExceeded)
	requireTime(t, b.now().Add(defaultLease), rec.LeaseExpiresAt, "the lease was renewed all the same")
	stored := b.get(t, "acme", "k1")
	requireSameRecord(t, rec, stored)
	require.Empty(t, stored.RecoveryPoint, "nothing saved")
	require.Nil(t, stored.RecoveryData)
	b.requireUsage(t, "acme", quota-5, "k0", "k1")

	// a smaller checkpoint is saved; a bigger one over the quota keeps it
	_, err = cp("k0", k0.FencingToken, "shipped", 10)
	require.NoError(t, err)
	_, err = cp("k1", k1.FencingToken, "p", 0)
	require.NoError(t, err, "room for one byte")
	rec, err = cp("k0", k0.FencingToken, "delivered", 200)
	requireCode(t, err, idem.ErrStorageQuotaExceeded)
	require.Equal(t, "shipped", rec.RecoveryPoint)
	requireBytes(t, recovery(10), rec.RecoveryData, "RecoveryData")
	// the same checkpoint again does not grow the record: saved
	_, err = cp("k0", k0.FencingToken, "shipped", 10)
	require.NoError(t, err)
	b.requireUsage(t, "acme", 2*claimBytes("k0")+7+10+1, "k0", "k1")
	// a new point whose data does not grow (a lease keeper's renewal) is
	// saved past the quota: its lease must not be lost to the quota
	_, err = cp("k1", k1.FencingToken, strings.Repeat("p", idem.MaxRecoveryPointBytes), 0)
	require.NoError(t, err, "a renewal without data")
	over := 2*claimBytes("k0") + 7 + 10 + idem.MaxRecoveryPointBytes
	require.Greater(t, over, quota)
	b.requireUsage(t, "acme", over, "k0", "k1")
	_, err = cp("k1", k1.FencingToken, "p", 200)
	requireCode(t, err, idem.ErrStorageQuotaExceeded, "data that grows, over the quota")

	// a takeover resumes from what was kept
	b.advance(defaultLease)
	took := b.claim(t, ClaimParams("acme", "k0"))
	require.Equal(t, idem.ActionTakeover, took.Action)
	require.Equal(t, "shipped", took.Record.RecoveryPoint)
	requireBytes(t, recovery(10), took.Record.RecoveryData, "RecoveryData")
}

// testQuotaConcurrentCompletesBounded: racers of one tenant complete 32
// keys at once with responses of which 4 fit the quota: at least those 4
// are stored (nobody is refused below the quota), at most one more per
// connection of the store's pool (a complete reads the usage committed
// when its statement starts, so completes on other connections at the same
// instant are not seen), every other key is completed without its
// response, none is left in flight, and the usage is exactly the records'.
func testQuotaConcurrentCompletesBounded(t *testing.T, s *suite) {
	b := s.setup(t, "acme")
	const n, fit, size = 32, 4, 2000
	keys := make([]string, n)
	toks := make([]int64, n)
	var claims int64
	for i := range n {
		keys[i] = fmt.Sprintf("key-%02d", i)
		toks[i] = b.create(t, "acme", keys[i]).FencingToken
		claims += claimBytes(keys[i])
	}
	unstored := int64(idem.UnstoredResponse(bigResponse(0, size)).Size())
	// room for fit responses and every unstored record: a refusal below
	// the quota would show
	quota := claims + fit*size + n*unstored
	conns := int64(n)
	if max := b.store.PoolStats().MaxConns; max > 0 {
		conns = max
	}
	recs := make([]idem.Record, n)
	errs := make([]error, n)
	race(n, func(i int) {
		recs[i], errs[i] = b.completeBounded("acme", keys[i], toks[i], bigResponse(i, size), quota)
	})
	stored := 0
	for i := range n {
		if errs[i] == nil {
			stored++
			requireResponse(t, bigResponse(i, size), b.get(t, "acme", keys[i]).Response)
			continue
		}
		b.requireUnstored(t, "acme", keys[i], toks[i], bigResponse(i, size), quota, recs[i], errs[i])
	}
	t.Logf("%d of %d responses stored, %d connections", stored, n, conns)
	require.GreaterOrEqual(t, stored, fit, "responses within the quota were not stored")
	require.LessOrEqual(t, int64(stored), fit+conns-1,
		"%d of %d responses stored on a quota for %d (pool of %d connections): the quota does not bound completes", stored, n, fit, conns)
	var want int64
	for _, k := range keys {
		want += b.get(t, "acme", k).StoredBytes()
	}
	b.requireUsage(t, "acme", want, keys...)
	require.LessOrEqual(t, want, quota+(conns-1)*size, "the usage passed the documented bound")
}
