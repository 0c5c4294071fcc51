package storetest

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem"
)

func testTenantCreateGet(t *testing.T, s *suite) {
	b := s.setup(t)
	st := withTimes(idem.DefaultSettings(), 3600, 7200, 15, 600)
	st.MaxResponseBytes = 4096
	st.RateLimitPerSecond = 50
	st.MaxWaitSeconds = 7
	st.RetryBudgetPercent = 35

	created, err := b.store.CreateTenant(b.ctx, idem.CreateTenantParams{ID: "acme", Name: "Acme Corp", Settings: st})
	require.NoError(t, err)
	require.Equal(t, "acme", created.ID)
	require.Equal(t, "Acme Corp", created.Name)
	require.Equal(t, st, created.Settings)
	require.False(t, created.Disabled)
	requireTime(t, b.now(), created.CreatedAt, "CreatedAt")
	requireTime(t, b.now(), created.UpdatedAt, "UpdatedAt")

	b.advance(time.Minute)
	got, err := b.store.GetTenant(b.ctx, idem.GetTenantParams{ID: "acme"})
	require.NoError(t, err)
	requireSameTenant(t, created, got)
}

func testTenantDuplicate(t *testing.T, s *suite) {
	b := s.setup(t)
	first := b.tenant(t, "acme")
	other := idem.DefaultSettings()
	other.LeaseSecondsDefault = 1
	_, err := b.store.CreateTenant(b.ctx, idem.CreateTenantParams{ID: "acme", Name: "Impostor", Settings: other})
	requireCode(t, err, idem.ErrTenantExists)

	got, err := b.store.GetTenant(b.ctx, idem.GetTenantParams{ID: "acme"})
	require.NoError(t, err)
	requireSameTenant(t, first, got)
}

func testTenantNotFound(t *testing.T, s *suite) {
	b := s.setup(t)
	b.tenant(t, "acme")
	_, err := b.store.GetTenant(b.ctx, idem.GetTenantParams{ID: "nobody"})
	requireCode(t, err, idem.ErrTenantNotFound)
	_, err = b.store.UpdateTenant(b.ctx, idem.UpdateTenantParams{ID: "nobody", Name: "x", Settings: idem.DefaultSettings()})
	requireCode(t, err, idem.ErrTenantNotFound)
	list, err := b.store.ListTenants(b.ctx)
	require.NoError(t, err)
	require.Len(t, list, 1, "a failed update must not create a tenant")
}

func testTenantList(t *testing.T, s *suite) {
	b := s.setup(t)
	list, err := b.store.ListTenants(b.ctx)
	require.NoError(t, err)
	require.Empty(t, list, "a fresh store has no tenants")

	for _, id := range []string{"charlie", "alpha", "bravo-2", "bravo_1"} {
		b.tenant(t, id)
	}
	list, err = b.store.ListTenants(b.ctx)
	require.NoError(t, err)
	ids := make([]string, len(list))
	for i, ten := range list {
		ids[i] = ten.ID
		require.Equal(t, idem.DefaultSettings(), ten.Settings)
	}
	require.Equal(t, []string{"alpha", "bravo-2", "bravo_1", "charlie"}, ids)
}

func testTenantUpdate(t *testing.T, s *suite) {
	b := s.setup(t)
	created := b.tenant(t, "acme")
	b.advance(time.Hour)

	st := withTimes(created.Settings, 60, 60, 10, 60)
	st.RateLimitPerSecond = 7
	st.MaxWaitSeconds = 0
	st.RetryBudgetPercent = 100
	upd, err := b.store.UpdateTenant(b.ctx, idem.UpdateTenantParams{ID: "acme", Name: "Renamed", Settings: st, Disabled: true})
	require.NoError(t, err)
	require.Equal(t, "acme", upd.ID)
	require.Equal(t, "Renamed", upd.Name)
	require.Equal(t, st, upd.Settings)
	require.True(t, upd.Disabled)
	requireTime(t, created.CreatedAt, upd.CreatedAt, "CreatedAt")
	requireTime(t, b.now(), upd.UpdatedAt, "UpdatedAt")

	got, err := b.store.GetTenant(b.ctx, idem.GetTenantParams{ID: "acme"})
	require.NoError(t, err, "GetTenant returns disabled tenants too")
	requireSameTenant(t, upd, got)

	// Re-enabling.
	b.advance(time.Minute)
	upd2, err := b.store.UpdateTenant(b.ctx, idem.UpdateTenantParams{ID: "acme", Name: "Renamed", Settings: st, Disabled: false})
	require.NoError(t, err)
	require.False(t, upd2.Disabled)
	requireTime(t, b.now(), upd2.UpdatedAt, "UpdatedAt")
	got, err = b.store.GetTenant(b.ctx, idem.GetTenantParams{ID: "acme"})
	require.NoError(t, err)
	requireSameTenant(t, upd2, got)
}

// testTenantDelete: deleting a tenant deletes it and every record of it,
// and nothing of another tenant; the id may then be created afresh, and its
// keys start anew with fencing tokens above every earlier one.
func testTenantDelete(t *testing.T, s *suite) {
	b := s.setup(t)
	b.tenant(t, "gone")
	b.tenant(t, "kept")
	b.create(t, "gone", "inflight")
	done := b.create(t, "gone", "done")
	done = b.complete(t, "gone", "done", done.FencingToken, response(1))
	kept := b.create(t, "kept", "done")
	kept = b.complete(t, "kept", "done", kept.FencingToken, response(2))

	require.NoError(t, b.store.DeleteTenant(b.ctx, idem.DeleteTenantParams{ID: "gone"}))
	_, err := b.store.GetTenant(b.ctx, idem.GetTenantParams{ID: "gone"})
	requireCode(t, err, idem.ErrTenantNotFound)
	b.requireAbsent(t, "gone", "inflight")
	b.requireAbsent(t, "gone", "done")
	requireSameRecord(t, kept, b.get(t, "kept", "done"))
	tenants, err := b.store.ListTenants(b.ctx)
	require.NoError(t, err)
	require.Len(t, tenants, 1)
	require.Equal(t, "kept", tenants[0].ID)

	requireCode(t, b.store.DeleteTenant(b.ctx, idem.DeleteTenantParams{ID: "gone"}), idem.ErrTenantNotFound)
	requireCode(t, b.store.DeleteTenant(b.ctx, idem.DeleteTenantParams{ID: "never"}), idem.ErrTenantNotFound)

	b.tenant(t, "gone")
	again := b.create(t, "gone", "done")
	require.Equal(t, 1, again.Attempt)
	require.Greater(t, again.FencingToken, kept.FencingToken)
}

func testPing(t *testing.T, s *suite) {
	b := s.setup(t)
	require.NoError(t, b.store.Ping(b.ctx))
}

// withTimes returns st with the times its records live by set: the replay
// window, the reaper threshold, the default and the longest lease, in
// seconds.
func withTimes(st idem.Settings, replay, reaper, leaseDefault, leaseMax int) idem.Settings {
	st.ReplayWindowSeconds = replay
	st.ReaperThresholdSeconds = reaper
	st.LeaseSecondsDefault = leaseDefault
	st.LeaseSecondsMax = leaseMax
	return st
}

func requireSameTenant(t *testing.T, want, got idem.Tenant) {
	t.Helper()
	require.Equal(t, want.ID, got.ID)
	require.Equal(t, want.Name, got.Name)
	require.Equal(t, want.Settings, got.Settings)
	require.Equal(t, want.Disabled, got.Disabled)
	requireTime(t, want.CreatedAt, got.CreatedAt, "tenant CreatedAt")
	requireTime(t, want.UpdatedAt, got.UpdatedAt, "tenant UpdatedAt")
}

func testIsolationSameKey(t *testing.T, s *suite) {
	b := s.setup(t)
	b.tenant(t, "alpha")
	b.tenant(t, "beta")

	pa := ClaimParams("alpha", "order-42")
	pb := ClaimParams("beta", "order-42")
	pb.Fingerprint = "sha256:beta"
	pb.Operation = "POST /v1/other"
	ra := b.claim(t, pa)
	rb := b.claim(t, pb)
	require.Equal(t, idem.ActionCreate, ra.Action)
	require.Equal(t, idem.ActionCreate, rb.Action, "a key in another tenant must not mismatch")
	require.NotEqual(t, ra.Record.FencingToken, rb.Record.FencingToken)

	// Each tenant's token is stale in the other.
	_, err := b.store.Complete(b.ctx, idem.CompleteParams{TenantID: "beta", Key: "order-42", FencingToken: ra.Record.FencingToken, Response: response(1)})
	requireCode(t, err, idem.ErrLeaseLost)
	err = b.store.Release(b.ctx, idem.ReleaseParams{TenantID: "alpha", Key: "order-42", FencingToken: rb.Record.FencingToken})
	requireCode(t, err, idem.ErrLeaseLost)

	b.complete(t, "alpha", "order-42", ra.Record.FencingToken, response(1))
	gb := b.get(t, "beta", "order-42")
	require.Equal(t, idem.StateInFlight, gb.State, "completing in alpha touched beta")
	require.Equal(t, "sha256:beta", gb.Fingerprint)
	require.Nil(t, gb.Response)

	// Releasing in beta leaves alpha's record alone.
	require.NoError(t, b.store.Release(b.ctx, idem.ReleaseParams{TenantID: "beta", Key: "order-42", FencingToken: rb.Record.FencingToken}))
	b.requireAbsent(t, "beta", "order-42")
	ga := b.get(t, "alpha", "order-42")
	requireResponse(t, response(1), ga.Response)
	res := b.claim(t, pa)
	require.Equal(t, idem.ActionReplay, res.Action)
}

func testIsolationInvisible(t *testing.T, s *suite) {
	b := s.setup(t)
	b.tenant(t, "alpha")
	b.tenant(t, "beta")
	rec := b.create(t, "alpha", "secret")
	b.create(t, "beta", "own")

	b.requireAbsent(t, "beta", "secret")
	_, err := b.store.Checkpoint(b.ctx, idem.CheckpointParams{TenantID: "beta", Key: "secret", FencingToken: rec.FencingToken, RecoveryPoint: "p", Lease: defaultLease})
	requireCode(t, err, idem.ErrKeyNotFound, "checkpoint")
	_, err = b.store.Complete(b.ctx, idem.CompleteParams{TenantID: "beta", Key: "secret", FencingToken: rec.FencingToken, Response: response(1)})
	requireCode(t, err, idem.ErrKeyNotFound, "complete")
	err = b.store.Release(b.ctx, idem.ReleaseParams{TenantID: "beta", Key: "secret", FencingToken: rec.FencingToken})
	requireCode(t, err, idem.ErrKeyNotFound, "release")
	requireSameRecord(t, rec, b.get(t, "alpha", "secret"))

	recs, err := b.store.ListRecords(b.ctx, idem.ListRecordsParams{TenantID: "beta", Limit: 100})
	require.NoError(t, err)
	require.Equal(t, []string{"beta/own"}, tenantKeys(recs))
	recs, err = b.store.ListRecords(b.ctx, idem.ListRecordsParams{TenantID: "alpha", Limit: 100})
	require.NoError(t, err)
	require.Equal(t, []string{"alpha/secret"}, tenantKeys(recs))

	b.advance(time.Hour)
	recs, err = b.store.ListOrphans(b.ctx, idem.ListOrphansParams{TenantID: "beta", Limit: 100})
	require.NoError(t, err)
	require.Equal(t, []string{"beta/own"}, tenantKeys(recs))
}

// testTenantDeleteRacesClaims races claims of fresh keys with the deletion
// of their tenant: each claim creates its record (before the deletion) or
// is tenant_unknown, and once DeleteTenant has returned no record of the
// tenant is left — not one a claim in progress created after the deletion
// began — so the tenant's id, created again, starts empty with no usage.
// A record never outlives its tenant (the guarantee the PostgreSQL foreign
// key gave before migration 00016).
func testTenantDeleteRacesClaims(t *testing.T, s *suite) {
	b := s.setup(t)
	for round := range 4 {
		b.tenant(t, "gone")
		for i := range 8 {
			b.create(t, "gone", fmt.Sprintf("before-%d-%d", round, i))
		}
		errs := make([]error, racers)
		var delErr error
		race(racers+1, func(i int) {
			if i == racers {
				delErr = b.store.DeleteTenant(b.ctx, idem.DeleteTenantParams{ID: "gone"})
				return
			}
			_, errs[i] = b.store.Claim(b.ctx, ClaimParams("gone", fmt.Sprintf("race-%d-%d", round, i)))
		})
		require.NoError(t, delErr)
		for i, err := range errs {
			if err != nil {
				requireCode(t, err, idem.ErrTenantUnknown, "racer %d", i)
			}
		}
		_, err := b.store.Claim(b.ctx, ClaimParams("gone", "after"))
		requireCode(t, err, idem.ErrTenantUnknown, "a claim after the deletion")

		again := b.tenant(t, "gone")
		require.Zero(t, again.StoredBytes, "round %d: the new tenant counts the old one's records", round)
		recs, err := b.store.ListRecords(b.ctx, idem.ListRecordsParams{TenantID: "gone", Limit: 1000})
		require.NoError(t, err)
		require.Empty(t, recs, "round %d: records outlived their tenant", round)
		require.NoError(t, b.store.DeleteTenant(b.ctx, idem.DeleteTenantParams{ID: "gone"}))
	}
}
