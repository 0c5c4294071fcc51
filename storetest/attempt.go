package storetest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem"
)

// attemptClaim is the suite's default claim of key carrying attemptID.
func attemptClaim(tenant, key, attemptID string) idem.ClaimParams {
	p := ClaimParams(tenant, key)
	p.AttemptID = attemptID
	return p
}

// testAttemptRecovered: a claim repeated with the same attempt id and
// request while its lease runs gets the attempt back as it is (same fencing
// token, attempt and recovery point) with its lease renewed from now,
// instead of request_in_flight; the recovered token still writes.
func testAttemptRecovered(t *testing.T, s *suite) {
	b := s.setup(t, "acme")
	first := b.claim(t, attemptClaim("acme", "k", "att-1"))
	require.Equal(t, idem.ActionCreate, first.Action)
	require.Equal(t, "att-1", first.Record.AttemptID)

	b.advance(5 * time.Second)
	again := b.claim(t, attemptClaim("acme", "k", "att-1"))
	require.Equal(t, idem.ActionRecover, again.Action)
	require.Equal(t, first.Record.FencingToken, again.Record.FencingToken)
	require.Equal(t, 1, again.Record.Attempt)
	require.Equal(t, idem.StateInFlight, again.Record.APIState())
	requireTime(t, b.now().Add(defaultLease), again.Record.LeaseExpiresAt, "LeaseExpiresAt (renewed from now)")
	require.False(t, again.Record.PurgeAfter.Before(again.Record.LeaseExpiresAt), "the purge follows the renewed lease")
	got := b.get(t, "acme", "k")
	requireTime(t, again.Record.LeaseExpiresAt, got.LeaseExpiresAt, "stored LeaseExpiresAt")
	require.Equal(t, first.Record.FencingToken, got.FencingToken)

	// The state it has now: a checkpoint's recovery point comes back too.
	b.checkpoint(t, idem.CheckpointParams{TenantID: "acme", Key: "k", FencingToken: first.Record.FencingToken, RecoveryPoint: "charged", Data: []byte(`{"charge":"ch_1"}`), Lease: time.Minute})
	again = b.claim(t, attemptClaim("acme", "k", "att-1"))
	require.Equal(t, idem.ActionRecover, again.Action)
	require.Equal(t, first.Record.FencingToken, again.Record.FencingToken)
	require.Equal(t, "charged", again.Record.RecoveryPoint)
	require.JSONEq(t, `{"charge":"ch_1"}`, string(again.Record.RecoveryData))

	done := b.complete(t, "acme", "k", again.Record.FencingToken, response(1))
	require.Equal(t, idem.StateCompleted, done.State)
	res := b.claim(t, attemptClaim("acme", "k", "att-1"))
	require.Equal(t, idem.ActionReplay, res.Action, "a completed key replays, attempt id or not")
}

// testAttemptOtherRejected: another attempt id, no attempt id, or the same
// attempt id with another request do not get the attempt: request_in_flight
// (with the lease left) or fingerprint_mismatch, and nothing changes.
func testAttemptOtherRejected(t *testing.T, s *suite) {
	b := s.setup(t, "acme")
	first := b.claim(t, attemptClaim("acme", "k", "att-1")).Record
	b.claim(t, ClaimParams("acme", "plain"))

	_, err := b.store.Claim(b.ctx, attemptClaim("acme", "k", "att-2"))
	requireCode(t, err, idem.ErrRequestInFlight, "another attempt id")
	require.Equal(t, defaultLease, retryAfter(t, err))
	_, err = b.store.Claim(b.ctx, ClaimParams("acme", "k"))
	requireCode(t, err, idem.ErrRequestInFlight, "no attempt id")
	_, err = b.store.Claim(b.ctx, attemptClaim("acme", "plain", "att-1"))
	requireCode(t, err, idem.ErrRequestInFlight, "an attempt id on a claim made without one")
	other := attemptClaim("acme", "k", "att-1")
	other.Fingerprint = "sha256:bbbb"
	_, err = b.store.Claim(b.ctx, other)
	requireCode(t, err, idem.ErrFingerprintMismatch, "same attempt id, another request")

	got := b.get(t, "acme", "k")
	require.Equal(t, first.FencingToken, got.FencingToken)
	require.Equal(t, "att-1", got.AttemptID)
}

// testAttemptTakeoverNewToken: once the lease ran out, even the same attempt
// id takes over with a new fencing token (attempt+1); the taker's attempt id
// then holds the lease, the old one gets request_in_flight.
func testAttemptTakeoverNewToken(t *testing.T, s *suite) {
	b := s.setup(t, "acme")
	first := b.claim(t, attemptClaim("acme", "k", "att-1")).Record
	b.clock.Set(first.LeaseExpiresAt)

	res := b.claim(t, attemptClaim("acme", "k", "att-1"))
	require.Equal(t, idem.ActionTakeover, res.Action, "an orphan is taken over, not recovered")
	require.Greater(t, res.Record.FencingToken, first.FencingToken)
	require.Equal(t, 2, res.Record.Attempt)
	b.clock.Set(res.Record.LeaseExpiresAt)

	taken := b.claim(t, attemptClaim("acme", "k", "att-2"))
	require.Equal(t, idem.ActionTakeover, taken.Action)
	require.Greater(t, taken.Record.FencingToken, res.Record.FencingToken)
	require.Equal(t, "att-2", taken.Record.AttemptID)

	_, err := b.store.Claim(b.ctx, attemptClaim("acme", "k", "att-1"))
	requireCode(t, err, idem.ErrRequestInFlight, "the old attempt id after a takeover")
	again := b.claim(t, attemptClaim("acme", "k", "att-2"))
	require.Equal(t, idem.ActionRecover, again.Action)
	require.Equal(t, taken.Record.FencingToken, again.Record.FencingToken)
	require.Equal(t, 3, again.Record.Attempt)
	_, err = b.store.Complete(b.ctx, idem.CompleteParams{TenantID: "acme", Key: "k", FencingToken: res.Record.FencingToken, Response: response(1)})
	requireCode(t, err, idem.ErrLeaseLost, "the taken-over token is fenced off")
}
