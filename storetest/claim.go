package storetest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem"
)

func testClaimAbsentCreates(t *testing.T, s *suite) {
	b := s.setup(t, "acme")
	p := claimTimed("acme", "order-42", 45*time.Second, 2*time.Hour, 5*time.Hour)

	res, err := b.store.Claim(b.ctx, p)
	require.NoError(t, err)
	require.Equal(t, idem.ActionCreate, res.Action)
	r := res.Record
	now := b.now()
	require.Equal(t, "acme", r.TenantID)
	require.Equal(t, "order-42", r.Key)
	require.Equal(t, idem.StateInFlight, r.State)
	require.Equal(t, idem.StateInFlight, r.APIState())
	require.Equal(t, p.Operation, r.Operation)
	require.Equal(t, p.Fingerprint, r.Fingerprint)
	require.Equal(t, 1, r.Attempt)
	require.Positive(t, r.FencingToken)
	requireTime(t, now.Add(45*time.Second), r.LeaseExpiresAt, "LeaseExpiresAt")
	require.Equal(t, 45*time.Second, r.LeaseLeft())
	require.Empty(t, r.RecoveryPoint)
	require.Empty(t, r.RecoveryData)
	require.Nil(t, r.Response)
	require.Equal(t, 2*time.Hour, r.ReplayWindow)
	require.Equal(t, 5*time.Hour, r.ReaperThreshold)
	requireTime(t, now, r.CreatedAt, "CreatedAt")
	requireTime(t, now, r.UpdatedAt, "UpdatedAt")
	require.True(t, r.CompletedAt.IsZero(), "CompletedAt is set on a fresh claim")
	require.True(t, r.ReplayUntil.IsZero(), "ReplayUntil is set on a fresh claim")
	require.False(t, r.PurgeAfter.Before(now.Add(5*time.Hour)), "PurgeAfter %s is earlier than creation + reaper threshold", r.PurgeAfter)
	requireTime(t, now, r.ObservedAt, "ObservedAt")

	requireSameRecord(t, r, b.get(t, "acme", "order-42"))
}

// testClaimUnknownTenant: a claim in a tenant that does not exist is
// tenant_unknown and creates nothing.
func testClaimUnknownTenant(t *testing.T, s *suite) {
	b := s.setup(t, "acme")
	_, err := b.store.Claim(b.ctx, ClaimParams("nobody", "k"))
	requireCode(t, err, idem.ErrTenantUnknown)
	b.requireAbsent(t, "nobody", "k")
}

func testClaimInFlightRejected(t *testing.T, s *suite) {
	b := s.setup(t, "acme")
	first := b.create(t, "acme", "k")

	b.advance(10 * time.Second)
	_, err := b.store.Claim(b.ctx, ClaimParams("acme", "k"))
	requireCode(t, err, idem.ErrRequestInFlight)
	left := retryAfter(t, err)
	require.GreaterOrEqual(t, left, 19*time.Second, "RetryAfter should be the lease left (20s)")
	require.LessOrEqual(t, left, 20*time.Second, "RetryAfter should be the lease left (20s)")

	// One millisecond before the lease runs out the key is still in flight.
	b.advance(20*time.Second - time.Millisecond)
	_, err = b.store.Claim(b.ctx, ClaimParams("acme", "k"))
	requireCode(t, err, idem.ErrRequestInFlight)
	require.LessOrEqual(t, retryAfter(t, err), time.Second)

	// A rejected claim changes nothing.
	got := b.get(t, "acme", "k")
	requireSameRecord(t, first, got)
	require.Equal(t, idem.StateInFlight, got.APIState())
}

func testClaimInFlightMismatch(t *testing.T, s *suite) {
	b := s.setup(t, "acme")
	first := b.create(t, "acme", "k")

	b.requireMismatches(t, "acme", "k", "POST /v1/refunds", "while in flight")

	requireSameRecord(t, first, b.get(t, "acme", "k"))
}

func testClaimOrphanTakeover(t *testing.T, s *suite) {
	b := s.setup(t, "acme")
	first := b.create(t, "acme", "k")
	data := []byte(`{"charge": "ch_1",  "amount":1000}`)
	b.advance(5 * time.Second)
	cp := b.checkpoint(t, idem.CheckpointParams{
		TenantID: "acme", Key: "k", FencingToken: first.FencingToken,
		RecoveryPoint: "charge_created", Data: data, Lease: 10 * time.Second,
	})

	// The checkpoint's lease runs out; nobody renews it.
	b.advance(10*time.Second + time.Millisecond)
	require.Equal(t, idem.StateOrphaned, b.get(t, "acme", "k").APIState())

	p := ClaimParams("acme", "k")
	p.Lease = 60 * time.Second
	// Windows given at takeover do not replace the ones the record was
	// created with.
	p.ReplayWindow = time.Hour
	p.ReaperThreshold = 2 * time.Hour
	res := b.claim(t, p)
	require.Equal(t, idem.ActionTakeover, res.Action)
	r := res.Record
	now := b.now()
	require.Equal(t, idem.StateInFlight, r.State)
	require.Equal(t, idem.StateInFlight, r.APIState())
	require.Equal(t, 2, r.Attempt)
	require.Greater(t, r.FencingToken, first.FencingToken)
	requireTime(t, now.Add(60*time.Second), r.LeaseExpiresAt, "LeaseExpiresAt")
	require.Equal(t, "charge_created", r.RecoveryPoint)
	requireBytes(t, data, r.RecoveryData, "RecoveryData")
	require.Equal(t, first.Operation, r.Operation)
	require.Equal(t, first.Fingerprint, r.Fingerprint)
	require.Equal(t, defaultReplayWindow, r.ReplayWindow, "takeover changed the record's replay window")
	require.Equal(t, defaultReaperThreshold, r.ReaperThreshold, "takeover changed the record's reaper threshold")
	requireTime(t, first.CreatedAt, r.CreatedAt, "CreatedAt")
	requireTime(t, now, r.UpdatedAt, "UpdatedAt")
	require.Nil(t, r.Response)
	require.True(t, r.CompletedAt.IsZero())
	requireTime(t, now, r.ObservedAt, "ObservedAt")
	require.False(t, r.PurgeAfter.Before(cp.PurgeAfter), "takeover moved PurgeAfter backwards")

	requireSameRecord(t, r, b.get(t, "acme", "k"))

	// The new holder's lease runs: a further claim is in flight.
	_, err := b.store.Claim(b.ctx, ClaimParams("acme", "k"))
	requireCode(t, err, idem.ErrRequestInFlight)

	// A second orphaning leads to attempt 3, with a still higher token.
	b.advance(60 * time.Second)
	res3 := b.claim(t, ClaimParams("acme", "k"))
	require.Equal(t, idem.ActionTakeover, res3.Action)
	require.Equal(t, 3, res3.Record.Attempt)
	require.Greater(t, res3.Record.FencingToken, r.FencingToken)
	require.Equal(t, "charge_created", res3.Record.RecoveryPoint)
	requireBytes(t, data, res3.Record.RecoveryData, "RecoveryData")
}

func testClaimOrphanBoundary(t *testing.T, s *suite) {
	b := s.setup(t, "acme")
	first := b.create(t, "acme", "k")

	// The lease covers [created, created+lease); at the instant it runs out
	// the record is orphaned (idem.Record.StateAt).
	b.advance(defaultLease)
	require.Equal(t, idem.StateOrphaned, b.get(t, "acme", "k").APIState())
	res := b.claim(t, ClaimParams("acme", "k"))
	require.Equal(t, idem.ActionTakeover, res.Action)
	require.Equal(t, 2, res.Record.Attempt)
	require.Greater(t, res.Record.FencingToken, first.FencingToken)
}

func testClaimOrphanMismatch(t *testing.T, s *suite) {
	b := s.setup(t, "acme")
	first := b.create(t, "acme", "k")
	b.advance(time.Hour)

	b.requireMismatches(t, "acme", "k", "DELETE /v1/payments", "on an orphan")

	got := b.get(t, "acme", "k")
	requireSameRecord(t, first, got)
	require.Equal(t, idem.StateOrphaned, got.APIState())
}

func testClaimCompletedReplay(t *testing.T, s *suite) {
	b := s.setup(t, "acme")
	for _, tc := range []struct {
		key  string
		resp idem.Response
	}{
		{"utf8", response(1)},
		{"binary", binaryResponse()},
		{"empty", idem.Response{Status: 204, BodyEncoding: idem.BodyEncodingUTF8}},
	} {
		rec := b.create(t, "acme", tc.key)
		b.advance(time.Second)
		done := b.complete(t, "acme", tc.key, rec.FencingToken, tc.resp)

		b.advance(time.Hour)
		res := b.claim(t, ClaimParams("acme", tc.key))
		require.Equal(t, idem.ActionReplay, res.Action, tc.key)
		r := res.Record
		require.Equal(t, idem.StateCompleted, r.State, tc.key)
		require.Equal(t, idem.StateCompleted, r.APIState(), tc.key)
		requireResponse(t, tc.resp, r.Response)
		require.Equal(t, rec.FencingToken, r.FencingToken, "a replay must not hand out a token")
		require.Equal(t, 1, r.Attempt, "a replay is not an attempt")
		requireSameRecord(t, done, r)
		requireTime(t, b.now(), r.ObservedAt, "ObservedAt")
	}
}

func testClaimCompletedMismatch(t *testing.T, s *suite) {
	b := s.setup(t, "acme")
	rec := b.create(t, "acme", "k")
	done := b.complete(t, "acme", "k", rec.FencingToken, response(1))

	b.requireMismatches(t, "acme", "k", "POST /v1/refunds", "on a completed key")

	requireSameRecord(t, done, b.get(t, "acme", "k"))
}

func testClaimExpiredCreatesAfresh(t *testing.T, s *suite) {
	b := s.setup(t, "acme")
	p := ClaimParams("acme", "k")
	p.ReplayWindow = time.Minute
	p.ReaperThreshold = time.Hour
	rec := b.claim(t, p).Record
	b.checkpoint(t, idem.CheckpointParams{
		TenantID: "acme", Key: "k", FencingToken: rec.FencingToken,
		RecoveryPoint: "charge_created", Data: []byte(`{"a":1}`), Lease: defaultLease,
	})
	b.complete(t, "acme", "k", rec.FencingToken, response(1))
	b.advance(2 * time.Minute)
	require.Equal(t, idem.StateExpired, b.get(t, "acme", "k").APIState())

	// Any fingerprint and operation start afresh on an expired key.
	np := ClaimParams("acme", "k")
	np.Fingerprint = "sha256:other"
	np.Operation = "PUT /v1/orders"
	np.Lease = 20 * time.Second
	np.ReplayWindow = 3 * time.Hour
	np.ReaperThreshold = 4 * time.Hour
	res := b.claim(t, np)
	require.Equal(t, idem.ActionCreate, res.Action)
	r := res.Record
	now := b.now()
	require.Equal(t, idem.StateInFlight, r.State)
	require.Equal(t, 1, r.Attempt)
	require.Greater(t, r.FencingToken, rec.FencingToken)
	require.Equal(t, "sha256:other", r.Fingerprint)
	require.Equal(t, "PUT /v1/orders", r.Operation)
	require.Empty(t, r.RecoveryPoint, "the old recovery point survived expiry")
	require.Empty(t, r.RecoveryData, "the old recovery data survived expiry")
	require.Nil(t, r.Response, "the old response survived expiry")
	require.True(t, r.CompletedAt.IsZero())
	require.True(t, r.ReplayUntil.IsZero())
	require.Equal(t, 3*time.Hour, r.ReplayWindow)
	require.Equal(t, 4*time.Hour, r.ReaperThreshold)
	requireTime(t, now, r.CreatedAt, "CreatedAt")
	requireTime(t, now.Add(20*time.Second), r.LeaseExpiresAt, "LeaseExpiresAt")
	require.False(t, r.PurgeAfter.Before(now.Add(4*time.Hour)), "PurgeAfter of the fresh record")
	requireSameRecord(t, r, b.get(t, "acme", "k"))

	// The old holder's token is stale on the new record.
	_, err := b.store.Complete(b.ctx, idem.CompleteParams{TenantID: "acme", Key: "k", FencingToken: rec.FencingToken, Response: response(1)})
	requireCode(t, err, idem.ErrLeaseLost)
}

func testClaimExpiredBoundary(t *testing.T, s *suite) {
	b := s.setup(t, "acme")
	p := ClaimParams("acme", "k")
	p.ReplayWindow = time.Minute
	rec := b.claim(t, p).Record
	done := b.complete(t, "acme", "k", rec.FencingToken, response(1))

	// Replayed up to one millisecond before ReplayUntil ...
	b.clock.Set(done.ReplayUntil.Add(-time.Millisecond))
	res := b.claim(t, ClaimParams("acme", "k"))
	require.Equal(t, idem.ActionReplay, res.Action)

	// ... and brand new from ReplayUntil on.
	b.clock.Set(done.ReplayUntil)
	require.Equal(t, idem.StateExpired, b.get(t, "acme", "k").APIState())
	res = b.claim(t, ClaimParams("acme", "k"))
	require.Equal(t, idem.ActionCreate, res.Action)
	require.Equal(t, 1, res.Record.Attempt)
	require.Greater(t, res.Record.FencingToken, rec.FencingToken)
}

// testClaimDatabaseClock proves that a store opened without an injected
// clock uses a real one: a 1-second lease really runs out.
func testClaimDatabaseClock(t *testing.T, s *suite) {
	b := s.setupDBClock(t)
	b.tenant(t, "acme")
	p := ClaimParams("acme", "k")
	p.Lease = time.Second

	start := time.Now()
	first := b.claim(t, p)
	claimed := time.Now()
	require.Equal(t, idem.ActionCreate, first.Action)
	r := first.Record
	require.WithinDuration(t, time.Now(), r.ObservedAt, 5*time.Second, "ObservedAt should be the database clock")
	require.WithinDuration(t, r.CreatedAt, r.ObservedAt, time.Second)
	require.WithinDuration(t, r.CreatedAt.Add(time.Second), r.LeaseExpiresAt, 100*time.Millisecond)

	_, err := b.store.Claim(b.ctx, p)
	// Only a prompt second claim can be sure the lease still runs.
	if time.Since(start) < 500*time.Millisecond {
		requireCode(t, err, idem.ErrRequestInFlight)
		left := retryAfter(t, err)
		require.Positive(t, left)
		require.LessOrEqual(t, left, time.Second)
	}

	// The lease started before claimed; 1.1 s later it has run out by any
	// clock that ticks at the right rate.
	time.Sleep(time.Until(claimed.Add(1100 * time.Millisecond)))
	got := b.get(t, "acme", "k")
	require.Equal(t, idem.StateOrphaned, got.APIState())
	require.False(t, got.ObservedAt.Before(r.LeaseExpiresAt))

	res := b.claim(t, p)
	require.Equal(t, idem.ActionTakeover, res.Action)
	require.Equal(t, 2, res.Record.Attempt)
	require.Greater(t, res.Record.FencingToken, r.FencingToken)
	require.True(t, res.Record.LeaseExpiresAt.After(r.LeaseExpiresAt))
	require.WithinDuration(t, time.Now(), res.Record.ObservedAt, 5*time.Second)
}

// requireMismatches requires that a claim of key in tenant with another
// fingerprint, and one with operation in place of the default, are both
// refused with fingerprint_mismatch; when says of what, for the messages.
func (b *bundle) requireMismatches(t *testing.T, tenant, key, operation, when string) {
	t.Helper()
	p := ClaimParams(tenant, key)
	p.Fingerprint = "sha256:bbbb"
	_, err := b.store.Claim(b.ctx, p)
	requireCode(t, err, idem.ErrFingerprintMismatch, "different fingerprint "+when)

	p = ClaimParams(tenant, key)
	p.Operation = operation
	_, err = b.store.Claim(b.ctx, p)
	requireCode(t, err, idem.ErrFingerprintMismatch, "different operation "+when)
}
