package storetest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem"
)

// testClaimKeptRecordTakesNoToken: a claim that leaves the record as it is
// (a replay, a refusal of a key in flight, a fingerprint mismatch) writes
// nothing: the token source does not move, and the record is byte for byte
// what it was. A claim of a completed key is a read (issue 23, goal 2).
func testClaimKeptRecordTakesNoToken(t *testing.T, s *suite) {
	b := s.setup(t, "acme")
	l := b.ledger(t)
	rec := b.create(t, "acme", "done")
	done := b.complete(t, "acme", "done", rec.FencingToken, response(1))
	busy := b.create(t, "acme", "busy")
	b.advance(time.Second)

	before, err := l.LedgerState(b.ctx)
	require.NoError(t, err)
	for range 3 {
		res := b.claim(t, ClaimParams("acme", "done"))
		require.Equal(t, idem.ActionReplay, res.Action)
		requireSameRecord(t, done, res.Record)

		p := ClaimParams("acme", "done")
		p.Fingerprint = "sha256:bbbb"
		_, err := b.store.Claim(b.ctx, p)
		requireCode(t, err, idem.ErrFingerprintMismatch)

		_, err = b.store.Claim(b.ctx, ClaimParams("acme", "busy"))
		requireCode(t, err, idem.ErrRequestInFlight)
		require.Equal(t, 29*time.Second, retryAfter(t, err), "the lease left at the claim's instant")
	}
	after, err := l.LedgerState(b.ctx)
	require.NoError(t, err)
	require.Equal(t, before.SourceToken, after.SourceToken, "a claim that wrote nothing took a token")
	requireSameRecord(t, done, b.get(t, "acme", "done"))
	got := b.get(t, "acme", "busy")
	requireSameRecord(t, busy, got)
	require.True(t, got.UpdatedAt.Equal(busy.UpdatedAt), "a refused claim changed the record")

	fresh := b.create(t, "acme", "fresh")
	require.Greater(t, fresh.FencingToken, before.SourceToken)
}

// testRaceClaimsVersusComplete races claims of a key in flight with its
// completion: the store may answer a claim from what it read before the
// completion landed, so each claim is either request_in_flight or the
// replay of the one stored response, never a new attempt, and once the
// completion has returned every claim replays it.
func testRaceClaimsVersusComplete(t *testing.T, s *suite) {
	b := s.setup(t, "acme")
	b.eachKeyInFlight(t, func(k int, key string, rec idem.Record) {
		var done idem.Record
		var doneErr error
		results, errs := b.raceClaimsWith("acme", key, func() {
			done, doneErr = b.store.Complete(b.ctx, idem.CompleteParams{TenantID: "acme", Key: key, FencingToken: rec.FencingToken, Response: response(k)})
		})
		require.NoError(t, doneErr)
		requireReplays(t, results, errs, done, idem.ErrRequestInFlight)
		res := b.claim(t, ClaimParams("acme", key))
		require.Equal(t, idem.ActionReplay, res.Action)
		requireSameRecord(t, done, res.Record)
	})
}

// testRaceClaimsVersusRelease races claims of a key in flight with its
// release: a claim that read the record in flight is refused, one that
// came after the release may create the key afresh — at most one does, and
// the record stored at the end is that claim's.
func testRaceClaimsVersusRelease(t *testing.T, s *suite) {
	b := s.setup(t, "acme")
	b.eachKeyInFlight(t, func(_ int, key string, rec idem.Record) {
		var relErr error
		results, errs := b.raceClaimsWith("acme", key, func() {
			relErr = b.store.Release(b.ctx, idem.ReleaseParams{TenantID: "acme", Key: key, FencingToken: rec.FencingToken})
		})
		require.NoError(t, relErr)
		winner := soleClaim(t, results, errs, idem.ActionCreate, "two claims created the key", "racer %d")
		if winner == -1 {
			b.requireAbsent(t, "acme", key)
			return
		}
		require.Greater(t, results[winner].Record.FencingToken, rec.FencingToken)
		requireSameRecord(t, results[winner].Record, b.get(t, "acme", key))
	})
}

// testRaceClaimsAtExpiry: claims of a completed key whose replay window has
// just ended race to create it afresh. Exactly one does; the others are
// refused as in flight, and none replays the expired response.
func testRaceClaimsAtExpiry(t *testing.T, s *suite) {
	b := s.setup(t, "acme")
	p := ClaimParams("acme", "k")
	p.ReplayWindow = time.Minute
	rec := b.claim(t, p).Record
	done := b.complete(t, "acme", "k", rec.FencingToken, response(1))
	b.clock.Set(done.ReplayUntil)

	results, errs := b.raceClaims("acme", "k")
	winner := soleClaim(t, results, errs, idem.ActionCreate, "two claims created the key", "racer %d: an expired record was replayed")
	require.NotEqual(t, -1, winner, "nobody created the expired key afresh")
	got := b.get(t, "acme", "k")
	require.Nil(t, got.Response)
	requireSameRecord(t, results[winner].Record, got)
}

// testRaceReplaysVersusTenantDelete races replays of a completed key with
// the deletion of its tenant: each claim replays (it read the record before
// the deletion) or is tenant_unknown, none creates a record, and after the
// deletion the key stays absent.
func testRaceReplaysVersusTenantDelete(t *testing.T, s *suite) {
	b := s.setup(t)
	for k := range 4 {
		tenant := "t" + string(rune('a'+k))
		b.tenant(t, tenant)
		rec := b.create(t, tenant, "k")
		done := b.complete(t, tenant, "k", rec.FencingToken, response(k))
		var delErr error
		results, errs := b.raceClaimsWith(tenant, "k", func() {
			delErr = b.store.DeleteTenant(b.ctx, idem.DeleteTenantParams{ID: tenant})
		})
		require.NoError(t, delErr)
		requireReplays(t, results, errs, done, idem.ErrTenantUnknown)
		_, err := b.store.Claim(b.ctx, ClaimParams(tenant, "k"))
		requireCode(t, err, idem.ErrTenantUnknown)
		b.requireAbsent(t, tenant, "k")
	}
}
