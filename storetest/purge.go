package storetest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem"
)

// testReapPurgeTimes: every write sets purge_after (and a complete
// replay_until) to the exact instant the contract gives, which each engine
// computes in its own SQL: an in-flight record is kept for its reaper
// threshold from the write and never less than its lease; a renewal (a
// recovered attempt, a checkpoint) never brings the purge forward; a
// takeover starts from now; a completed record is kept for its reaper
// threshold from its completion. What each write counts (Record.
// StoredBytes, summed in the tenant's usage) follows it.
func testReapPurgeTimes(t *testing.T, s *suite) {
	b := s.setup(t)
	b.tenant(t, "acme")
	t0 := b.now()
	p := attemptClaim("acme", "k", "att-1")
	p.Lease = 60 * time.Second
	p.ReplayWindow = 2 * time.Second
	p.ReaperThreshold = 3 * time.Second

	rec := b.claim(t, p).Record
	requireTime(t, t0.Add(60*time.Second), rec.PurgeAfter, "claim: the lease outlasts the reaper threshold")
	b.requireUsage(t, "acme", idem.ClaimBytes("k", p.Operation, p.Fingerprint), "k")

	b.advance(10 * time.Second)
	again := b.claim(t, p)
	require.Equal(t, idem.ActionRecover, again.Action)
	requireTime(t, t0.Add(70*time.Second), again.Record.PurgeAfter, "recovered attempt: the purge follows the renewed lease")

	b.advance(10 * time.Second)
	data := []byte(`{"charge":"ch_1"}`)
	rec = b.checkpoint(t, idem.CheckpointParams{TenantID: "acme", Key: "k", FencingToken: rec.FencingToken, RecoveryPoint: "charged", Data: data, Lease: 5 * time.Second})
	requireTime(t, t0.Add(70*time.Second), rec.PurgeAfter, "a short checkpoint lease never brings the purge forward")
	b.requireUsage(t, "acme", idem.ClaimBytes("k", p.Operation, p.Fingerprint)+idem.RecoveryBytes("charged", data), "k")
	rec = b.checkpoint(t, idem.CheckpointParams{TenantID: "acme", Key: "k", FencingToken: rec.FencingToken, RecoveryPoint: "sent", Lease: 100 * time.Second})
	requireTime(t, t0.Add(120*time.Second), rec.PurgeAfter, "checkpoint: the purge follows the renewed lease")
	b.requireUsage(t, "acme", idem.ClaimBytes("k", p.Operation, p.Fingerprint)+idem.RecoveryBytes("sent", nil), "k")

	b.clock.Set(t0.Add(121 * time.Second))
	p.AttemptID = "att-2"
	res := b.claim(t, p)
	require.Equal(t, idem.ActionTakeover, res.Action)
	requireTime(t, t0.Add(181*time.Second), res.Record.PurgeAfter, "takeover: the new lease from now")
	b.requireUsage(t, "acme", idem.ClaimBytes("k", p.Operation, p.Fingerprint)+idem.RecoveryBytes("sent", nil), "k")

	b.advance(10 * time.Second)
	resp := response(1)
	done := b.complete(t, "acme", "k", res.Record.FencingToken, resp)
	requireTime(t, t0.Add(133*time.Second), done.ReplayUntil, "complete: ReplayUntil")
	requireTime(t, t0.Add(134*time.Second), done.PurgeAfter, "complete: the reaper threshold from the completion")
	b.requireUsage(t, "acme", idem.ClaimBytes("k", p.Operation, p.Fingerprint)+idem.RecoveryBytes("sent", nil)+int64(resp.Size()), "k")

	// A reaper threshold longer than the lease keeps the record that long.
	q := ClaimParams("acme", "long")
	q.ReaperThreshold = time.Hour
	created := b.claim(t, q).Record
	requireTime(t, b.now().Add(time.Hour), created.PurgeAfter, "claim: the reaper threshold outlasts the lease")
}

// testCompleterDeadlineBeforePurge: the completer's deadline, set on its
// first takeover, is the policy's from then, but never past the record's
// purge time (the reaper would delete the record before the completer
// gave up on it).
func testCompleterDeadlineBeforePurge(t *testing.T, s *suite) {
	b := s.setup(t)
	b.tenant(t, "acme")
	b.completer(t, "acme", "")
	p := ClaimParams("acme", "k")
	p.ReaperThreshold = 30 * time.Minute // before the policy's hour
	rec := b.claim(t, p).Record
	b.advance(defaultLease)
	picked := b.pick(t)
	require.Len(t, picked, 1)
	require.NotNil(t, picked[0].Record.Completion)
	requireTime(t, rec.PurgeAfter, picked[0].Record.Completion.Deadline, "Deadline (the purge time)")
}
