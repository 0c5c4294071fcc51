package storetest

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem"
)

// operator is the actor of the suite's resolutions.
var operator = idem.Actor{Subject: "ops@example.com", Scope: "admin"}

// orphan creates key in tenant and lets its lease run out.
func (b *bundle) orphan(t *testing.T, tenant, key string) idem.Record {
	t.Helper()
	rec := b.create(t, tenant, key)
	b.advance(defaultLease)
	return rec
}

// resolve resolves and requires success.
func (b *bundle) resolve(t *testing.T, p idem.ResolveParams) idem.Resolution {
	t.Helper()
	require.NoError(t, p.Validate())
	res, err := b.store.Resolve(b.ctx, p)
	require.NoError(t, err, "resolve %s %s/%s", p.Action, p.TenantID, p.Key)
	return res
}

// resolution returns the suite's resolution of key with token.
func resolution(tenant, key string, action idem.ResolveAction, token int64) idem.ResolveParams {
	p := idem.ResolveParams{TenantID: tenant, Key: key, Action: action, FencingToken: token, Actor: operator, Note: "note on " + string(action)}
	if action == idem.ResolveComplete {
		r := response(99)
		p.Response = &r
	}
	return p
}

// audit lists every audit entry of key in tenant ("" for all).
func (b *bundle) audit(t *testing.T, tenant, key string) []idem.AuditEntry {
	t.Helper()
	entries, err := b.store.ListAudit(b.ctx, idem.ListAuditParams{TenantID: tenant, Key: key, Limit: 1000})
	require.NoError(t, err)
	return entries
}

// requireAudit requires entry to record p at instant at.
func requireAudit(t *testing.T, p idem.ResolveParams, at time.Time, entry idem.AuditEntry) {
	t.Helper()
	require.Positive(t, entry.ID)
	require.Equal(t, p.TenantID, entry.TenantID)
	require.Equal(t, p.Key, entry.Key)
	require.Equal(t, p.Action, entry.Action)
	require.Equal(t, p.FencingToken, entry.FencingToken)
	require.Equal(t, p.Note, entry.Note)
	require.Equal(t, p.Actor, entry.Actor)
	requireTime(t, at, entry.CreatedAt, "audit CreatedAt")
}

func testResolveRelease(t *testing.T, s *suite) {
	b := s.setup(t, "acme")
	rec := b.orphan(t, "acme", "k")
	at := b.now()

	p := resolution("acme", "k", idem.ResolveRelease, rec.FencingToken)
	res := b.resolve(t, p)
	require.Equal(t, rec.FencingToken, res.Record.FencingToken)
	requireAudit(t, p, at, res.Audit)
	require.Zero(t, res.Audit.NewFencingToken)

	b.requireAbsent(t, "acme", "k")
	entries := b.audit(t, "acme", "k")
	require.Len(t, entries, 1, "the audit entry outlives the released record")
	require.Equal(t, res.Audit, entries[0])

	// The next retry runs the work again: a fresh record, attempt 1.
	again := b.claim(t, ClaimParams("acme", "k"))
	require.Equal(t, idem.ActionCreate, again.Action)
	require.Equal(t, 1, again.Record.Attempt)
	require.Greater(t, again.Record.FencingToken, rec.FencingToken)
}

func testResolveComplete(t *testing.T, s *suite) {
	b := s.setup(t, "acme")
	rec := b.orphan(t, "acme", "k")
	b.resolve(t, resolution("acme", "k", idem.ResolveReview, rec.FencingToken))
	at := b.now()

	p := resolution("acme", "k", idem.ResolveComplete, rec.FencingToken)
	res := b.resolve(t, p)
	requireAudit(t, p, at, res.Audit)
	require.Equal(t, idem.StateCompleted, res.Record.State)
	require.Greater(t, res.Record.FencingToken, rec.FencingToken, "a completion by hand fences off the late worker")
	require.Equal(t, res.Record.FencingToken, res.Audit.NewFencingToken)
	require.Nil(t, res.Record.Review, "a completion clears the review flag")
	requireResponse(t, *p.Response, res.Record.Response)
	requireTime(t, at, res.Record.CompletedAt, "CompletedAt")
	requireTime(t, at.Add(defaultReplayWindow), res.Record.ReplayUntil, "ReplayUntil")

	got := b.get(t, "acme", "k")
	requireSameRecord(t, res.Record, got)
	require.Nil(t, got.Review)

	replay := b.claim(t, ClaimParams("acme", "k"))
	require.Equal(t, idem.ActionReplay, replay.Action)
	requireResponse(t, *p.Response, replay.Record.Response)

	entries := b.audit(t, "acme", "k")
	require.Len(t, entries, 2)
	require.Equal(t, []idem.ResolveAction{idem.ResolveComplete, idem.ResolveReview}, []idem.ResolveAction{entries[0].Action, entries[1].Action}, "newest first")
}

func testResolveReview(t *testing.T, s *suite) {
	b := s.setup(t, "acme")
	rec := b.create(t, "acme", "k")
	at := b.now()

	// Allowed while the lease still runs: it changes nothing but the flag.
	p := resolution("acme", "k", idem.ResolveReview, rec.FencingToken)
	p.Note = "charge_created twice?\ncheck the provider"
	res := b.resolve(t, p)
	requireAudit(t, p, at, res.Audit)
	require.NotNil(t, res.Record.Review)
	require.Equal(t, p.Note, res.Record.Review.Note)
	requireTime(t, at, res.Record.Review.At, "Review.At")
	require.Equal(t, rec.FencingToken, res.Record.FencingToken)
	require.Equal(t, idem.StateInFlight, res.Record.APIState())
	requireTime(t, rec.LeaseExpiresAt, res.Record.LeaseExpiresAt, "LeaseExpiresAt")

	got := b.get(t, "acme", "k")
	require.NotNil(t, got.Review, "the flag shows on the record")
	require.Equal(t, p.Note, got.Review.Note)
	listed, err := b.store.ListRecords(b.ctx, idem.ListRecordsParams{TenantID: "acme", Limit: 10})
	require.NoError(t, err)
	require.Len(t, listed, 1)
	require.NotNil(t, listed[0].Review, "the flag shows in listings")
	require.Equal(t, p.Note, listed[0].Review.Note)

	// Once orphaned it is listed as an orphan with its flag; a takeover
	// keeps the flag.
	b.advance(defaultLease)
	orphans, err := b.store.ListOrphans(b.ctx, idem.ListOrphansParams{Limit: 10})
	require.NoError(t, err)
	require.Len(t, orphans, 1)
	require.NotNil(t, orphans[0].Review)
	taken := b.claim(t, ClaimParams("acme", "k"))
	require.Equal(t, idem.ActionTakeover, taken.Action)
	require.NotNil(t, taken.Record.Review, "a takeover keeps the flag")

	// A worker's completion clears it.
	done := b.complete(t, "acme", "k", taken.Record.FencingToken, response(1))
	require.Nil(t, done.Review)
	require.Nil(t, b.get(t, "acme", "k").Review)
}

func testResolveRequiresOrphan(t *testing.T, s *suite) {
	b := s.setup(t, "acme")
	rec := b.create(t, "acme", "k")
	b.advance(10 * time.Second)
	for _, a := range []idem.ResolveAction{idem.ResolveRelease, idem.ResolveComplete} {
		_, err := b.store.Resolve(b.ctx, resolution("acme", "k", a, rec.FencingToken))
		requireCode(t, err, idem.ErrRequestInFlight, a)
		require.Equal(t, defaultLease-10*time.Second, retryAfter(t, err), "Retry-After is the lease left")
	}
	requireSameRecord(t, rec, b.get(t, "acme", "k"))
	require.Empty(t, b.audit(t, "acme", ""), "a refused resolution writes no audit entry")

	// At the instant the lease runs out the record is an orphan.
	b.advance(defaultLease - 10*time.Second)
	b.resolve(t, resolution("acme", "k", idem.ResolveRelease, rec.FencingToken))
}

func testResolveRefused(t *testing.T, s *suite) {
	b := s.setup(t, "acme", "other")

	for _, a := range []idem.ResolveAction{idem.ResolveRelease, idem.ResolveComplete, idem.ResolveReview} {
		_, err := b.store.Resolve(b.ctx, resolution("acme", "absent", a, 1))
		requireCode(t, err, idem.ErrKeyNotFound, a)
	}

	old := b.orphan(t, "acme", "taken")
	taken := b.claim(t, ClaimParams("acme", "taken"))
	require.Equal(t, idem.ActionTakeover, taken.Action)
	b.advance(defaultLease)
	for _, a := range []idem.ResolveAction{idem.ResolveRelease, idem.ResolveComplete, idem.ResolveReview} {
		_, err := b.store.Resolve(b.ctx, resolution("acme", "taken", a, old.FencingToken))
		requireCode(t, err, idem.ErrLeaseLost, "%s with a stale token", a)
	}

	done := b.create(t, "acme", "done")
	b.complete(t, "acme", "done", done.FencingToken, response(1))
	for _, a := range []idem.ResolveAction{idem.ResolveRelease, idem.ResolveComplete, idem.ResolveReview} {
		_, err := b.store.Resolve(b.ctx, resolution("acme", "done", a, done.FencingToken))
		requireCode(t, err, idem.ErrAlreadyCompleted, a)
	}
	requireResponse(t, response(1), b.get(t, "acme", "done").Response)

	// Another tenant's key of the same name is not reachable.
	o := b.orphan(t, "other", "k")
	_, err := b.store.Resolve(b.ctx, resolution("acme", "k", idem.ResolveRelease, o.FencingToken))
	requireCode(t, err, idem.ErrKeyNotFound)
	b.get(t, "other", "k")

	require.Empty(t, b.audit(t, "", ""), "refused resolutions write no audit entry")
}

// testResolveLateWorker: the worker of an orphan comes back after a person
// released or completed it. Its token is refused; the stored outcome stays.
func testResolveLateWorker(t *testing.T, s *suite) {
	b := s.setup(t, "acme")

	released := b.orphan(t, "acme", "released")
	b.resolve(t, resolution("acme", "released", idem.ResolveRelease, released.FencingToken))
	_, err := b.store.Complete(b.ctx, idem.CompleteParams{TenantID: "acme", Key: "released", FencingToken: released.FencingToken, Response: response(1)})
	requireCode(t, err, idem.ErrKeyNotFound, "complete after a release")
	again := b.create(t, "acme", "released")
	_, err = b.store.Complete(b.ctx, idem.CompleteParams{TenantID: "acme", Key: "released", FencingToken: released.FencingToken, Response: response(1)})
	requireCode(t, err, idem.ErrLeaseLost, "complete after a release and a new claim")
	_, err = b.store.Checkpoint(b.ctx, idem.CheckpointParams{TenantID: "acme", Key: "released", FencingToken: released.FencingToken, RecoveryPoint: "late", Lease: defaultLease})
	requireCode(t, err, idem.ErrLeaseLost, "checkpoint after a release and a new claim")
	requireSameRecord(t, again, b.get(t, "acme", "released"))

	completed := b.orphan(t, "acme", "completed")
	res := b.resolve(t, resolution("acme", "completed", idem.ResolveComplete, completed.FencingToken))
	for _, resp := range []idem.Response{response(1), response(99)} {
		_, err = b.store.Complete(b.ctx, idem.CompleteParams{TenantID: "acme", Key: "completed", FencingToken: completed.FencingToken, Response: resp})
		requireCode(t, err, idem.ErrLeaseLost, "complete after a completion by hand")
	}
	_, err = b.store.Checkpoint(b.ctx, idem.CheckpointParams{TenantID: "acme", Key: "completed", FencingToken: completed.FencingToken, RecoveryPoint: "late", Lease: defaultLease})
	requireCode(t, err, idem.ErrLeaseLost, "checkpoint after a completion by hand")
	err = b.store.Release(b.ctx, idem.ReleaseParams{TenantID: "acme", Key: "completed", FencingToken: completed.FencingToken})
	requireCode(t, err, idem.ErrLeaseLost, "release after a completion by hand")
	requireSameRecord(t, res.Record, b.get(t, "acme", "completed"))
}

// testRaceResolutions: people racing to release and complete one orphan
// (two consoles, a double click): exactly one resolution applies and is
// audited; the record agrees with the winner.
func testRaceResolutions(t *testing.T, s *suite) {
	b := s.setup(t, "acme")
	rec := b.orphan(t, "acme", "k")

	results, errs := raceEach(racers, func(i int) (idem.Resolution, error) {
		action := idem.ResolveRelease
		if i%2 == 1 {
			action = idem.ResolveComplete
		}
		p := resolution("acme", "k", action, rec.FencingToken)
		p.Note = fmt.Sprintf("racer %d", i)
		return b.store.Resolve(b.ctx, p)
	})
	winner := soleWinner(t, errs, "two resolutions applied", func(i int, err error) {
		// A loser finds the row deleted (after a release) or completed
		// with a new token (after a completion).
		code := idem.ErrorCode(err)
		require.Contains(t, []idem.Code{idem.CodeKeyNotFound, idem.CodeLeaseLost}, code, "racer %d: %v", i, err)
	})
	require.NotEqual(t, -1, winner, "no resolution applied")
	entries := b.audit(t, "acme", "k")
	require.Len(t, entries, 1, "exactly one audit entry")
	require.Equal(t, fmt.Sprintf("racer %d", winner), entries[0].Note)
	if winner%2 == 0 {
		b.requireAbsent(t, "acme", "k")
	} else {
		got := b.get(t, "acme", "k")
		require.Equal(t, idem.StateCompleted, got.State)
		require.Equal(t, results[winner].Record.FencingToken, got.FencingToken)
	}
}

// testRaceResolveVersusWorker races a completion by hand with the late
// worker's own completion: one response is stored, the other is refused.
func testRaceResolveVersusWorker(t *testing.T, s *suite) {
	for round := range 10 {
		b := s.setup(t, "acme")
		rec := b.orphan(t, "acme", "k")
		var resolveErr, workerErr error
		race(2, func(i int) {
			if i == 0 {
				_, resolveErr = b.store.Resolve(b.ctx, resolution("acme", "k", idem.ResolveComplete, rec.FencingToken))
				return
			}
			_, workerErr = b.store.Complete(b.ctx, idem.CompleteParams{TenantID: "acme", Key: "k", FencingToken: rec.FencingToken, Response: response(1)})
		})
		got := b.get(t, "acme", "k")
		require.Equal(t, idem.StateCompleted, got.State)
		switch {
		case resolveErr == nil:
			requireCode(t, workerErr, idem.ErrLeaseLost, "round %d: the worker after the resolution", round)
			requireResponse(t, response(99), got.Response)
			require.Len(t, b.audit(t, "acme", "k"), 1)
		case workerErr == nil:
			requireCode(t, resolveErr, idem.ErrAlreadyCompleted, "round %d: the resolution after the worker", round)
			requireResponse(t, response(1), got.Response)
			require.Empty(t, b.audit(t, "acme", "k"))
		default:
			t.Fatalf("round %d: both refused: %v / %v", round, resolveErr, workerErr)
		}
	}
}

// testAuditListing: listings per key, per tenant and across tenants, newest
// first, paginated by keyset without loss or repetition.
func testAuditListing(t *testing.T, s *suite) {
	b := s.setup(t, "acme", "beta")
	var want []idem.AuditEntry // oldest first
	for i := range 5 {
		for _, tenant := range []string{"acme", "beta"} {
			key := fmt.Sprintf("k%d", i%2)
			rec, err := b.store.GetRecord(b.ctx, idem.GetRecordParams{TenantID: tenant, Key: key})
			if err != nil {
				rec = b.create(t, tenant, key)
			}
			want = append(want, b.resolve(t, resolution(tenant, key, idem.ResolveReview, rec.FencingToken)).Audit)
		}
		if i%2 == 0 {
			b.advance(time.Millisecond) // some entries share an instant
		}
	}
	filter := func(tenant, key string) []idem.AuditEntry {
		var out []idem.AuditEntry
		for i := len(want) - 1; i >= 0; i-- {
			e := want[i]
			if (tenant == "" || e.TenantID == tenant) && (key == "" || e.Key == key) {
				out = append(out, e)
			}
		}
		return out
	}
	for _, f := range []struct{ tenant, key string }{{"", ""}, {"acme", ""}, {"beta", ""}, {"acme", "k0"}, {"beta", "k1"}} {
		var got []idem.AuditEntry
		var after *idem.Cursor
		for range 20 {
			page, err := b.store.ListAudit(b.ctx, idem.ListAuditParams{TenantID: f.tenant, Key: f.key, Limit: 2, After: after})
			require.NoError(t, err)
			got = append(got, page...)
			if len(page) < 2 {
				break
			}
			last := page[len(page)-1]
			after = &idem.Cursor{Time: last.CreatedAt, Key: last.Key, ID: last.ID}
		}
		require.Equal(t, filter(f.tenant, f.key), got, "tenant %q key %q", f.tenant, f.key)
	}

	// Deleting a tenant deletes its audit entries with its records.
	require.NoError(t, b.store.DeleteTenant(b.ctx, idem.DeleteTenantParams{ID: "beta"}))
	require.Empty(t, b.audit(t, "beta", ""))
	require.Equal(t, filter("acme", ""), b.audit(t, "acme", ""))
}
