package storetest

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem"
)

func testFencingTokensIncrease(t *testing.T, s *suite) {
	b := s.setup(t, "acme")
	var tokens []int64
	next := func(r idem.Record) {
		t.Helper()
		if len(tokens) > 0 {
			require.Greater(t, r.FencingToken, tokens[len(tokens)-1], "fencing tokens must strictly increase (history %v)", tokens)
		}
		tokens = append(tokens, r.FencingToken)
	}

	// create
	rec := b.create(t, "acme", "k")
	next(rec)
	// takeover
	b.advance(time.Hour)
	res := b.claim(t, ClaimParams("acme", "k"))
	require.Equal(t, idem.ActionTakeover, res.Action)
	next(res.Record)
	// release + re-claim
	require.NoError(t, b.store.Release(b.ctx, idem.ReleaseParams{TenantID: "acme", Key: "k", FencingToken: res.Record.FencingToken}))
	rec = b.create(t, "acme", "k")
	next(rec)
	// complete, expire + re-claim
	p := ClaimParams("acme", "k")
	b.complete(t, "acme", "k", rec.FencingToken, response(1))
	b.advance(defaultReplayWindow)
	res = b.claim(t, p)
	require.Equal(t, idem.ActionCreate, res.Action)
	next(res.Record)
	// Another key in between does not lower this key's next token.
	b.create(t, "acme", "other")
	b.advance(time.Hour)
	res = b.claim(t, p)
	require.Equal(t, idem.ActionTakeover, res.Action)
	next(res.Record)
}

func testFencingStaleToken(t *testing.T, s *suite) {
	b := s.setup(t, "acme")
	old := b.create(t, "acme", "k")
	b.advance(time.Hour)
	cur := b.claim(t, ClaimParams("acme", "k")).Record

	for _, token := range []int64{old.FencingToken, cur.FencingToken + 1000, 0, -1} {
		_, err := b.store.Checkpoint(b.ctx, idem.CheckpointParams{
			TenantID: "acme", Key: "k", FencingToken: token, RecoveryPoint: "p", Lease: defaultLease,
		})
		requireCode(t, err, idem.ErrLeaseLost, "checkpoint with token %d", token)
		_, err = b.store.Complete(b.ctx, idem.CompleteParams{TenantID: "acme", Key: "k", FencingToken: token, Response: response(1)})
		requireCode(t, err, idem.ErrLeaseLost, "complete with token %d", token)
		err = b.store.Release(b.ctx, idem.ReleaseParams{TenantID: "acme", Key: "k", FencingToken: token})
		requireCode(t, err, idem.ErrLeaseLost, "release with token %d", token)
	}
	// The refused writes changed nothing; the current holder still writes.
	requireSameRecord(t, cur, b.get(t, "acme", "k"))
	b.complete(t, "acme", "k", cur.FencingToken, response(2))

	// A stale token on a completed record is still lease_lost.
	_, err := b.store.Complete(b.ctx, idem.CompleteParams{TenantID: "acme", Key: "k", FencingToken: old.FencingToken, Response: response(2)})
	requireCode(t, err, idem.ErrLeaseLost, "complete of a completed record with a stale token")
	err = b.store.Release(b.ctx, idem.ReleaseParams{TenantID: "acme", Key: "k", FencingToken: old.FencingToken})
	requireCode(t, err, idem.ErrLeaseLost, "release of a completed record with a stale token")
	_, err = b.store.Checkpoint(b.ctx, idem.CheckpointParams{TenantID: "acme", Key: "k", FencingToken: old.FencingToken, RecoveryPoint: "p", Lease: defaultLease})
	requireCode(t, err, idem.ErrLeaseLost, "checkpoint of a completed record with a stale token")
	requireResponse(t, response(2), b.get(t, "acme", "k").Response)
}

func testFencingAbsentKey(t *testing.T, s *suite) {
	b := s.setup(t, "acme")
	rec := b.create(t, "acme", "present")

	_, err := b.store.Checkpoint(b.ctx, idem.CheckpointParams{
		TenantID: "acme", Key: "absent", FencingToken: rec.FencingToken, RecoveryPoint: "p", Lease: defaultLease,
	})
	requireCode(t, err, idem.ErrKeyNotFound, "checkpoint")
	_, err = b.store.Complete(b.ctx, idem.CompleteParams{TenantID: "acme", Key: "absent", FencingToken: rec.FencingToken, Response: response(1)})
	requireCode(t, err, idem.ErrKeyNotFound, "complete")
	err = b.store.Release(b.ctx, idem.ReleaseParams{TenantID: "acme", Key: "absent", FencingToken: rec.FencingToken})
	requireCode(t, err, idem.ErrKeyNotFound, "release")
	b.requireAbsent(t, "acme", "absent")
	// Nothing was created by the refused writes.
	recs, err := b.store.ListRecords(b.ctx, idem.ListRecordsParams{TenantID: "acme", Limit: 10})
	require.NoError(t, err)
	require.Equal(t, []string{"present"}, keysOf(recs))
}

func testCompleteStoresResponse(t *testing.T, s *suite) {
	b := s.setup(t, "acme")
	p := ClaimParams("acme", "k")
	p.ReplayWindow = 10 * time.Minute
	p.ReaperThreshold = time.Hour
	rec := b.claim(t, p).Record
	b.checkpoint(t, idem.CheckpointParams{
		TenantID: "acme", Key: "k", FencingToken: rec.FencingToken,
		RecoveryPoint: "charge_created", Data: []byte(`{"x":1}`), Lease: defaultLease,
	})
	b.advance(7 * time.Second)
	now := b.now()
	resp := binaryResponse()
	done := b.complete(t, "acme", "k", rec.FencingToken, resp)

	require.Equal(t, idem.StateCompleted, done.State)
	require.Equal(t, idem.StateCompleted, done.APIState())
	requireResponse(t, resp, done.Response)
	require.Equal(t, rec.FencingToken, done.FencingToken)
	require.Equal(t, 1, done.Attempt)
	require.True(t, done.LeaseExpiresAt.IsZero(), "a completed record has no lease")
	require.Zero(t, done.LeaseLeft())
	requireTime(t, now, done.CompletedAt, "CompletedAt")
	requireTime(t, now.Add(10*time.Minute), done.ReplayUntil, "ReplayUntil = CompletedAt + the claim's replay window")
	require.False(t, done.PurgeAfter.Before(done.ReplayUntil), "PurgeAfter %s before ReplayUntil %s", done.PurgeAfter, done.ReplayUntil)
	require.False(t, done.PurgeAfter.Before(rec.CreatedAt.Add(time.Hour)), "PurgeAfter before creation + reaper threshold")
	requireTime(t, rec.CreatedAt, done.CreatedAt, "CreatedAt")
	requireTime(t, now, done.UpdatedAt, "UpdatedAt")
	requireTime(t, now, done.ObservedAt, "ObservedAt")
	// Completing keeps the recovery point for humans to inspect.
	require.Equal(t, "charge_created", done.RecoveryPoint)
	requireBytes(t, []byte(`{"x":1}`), done.RecoveryData, "RecoveryData")

	requireSameRecord(t, done, b.get(t, "acme", "k"))
}

func testCompleteAfterLeaseRanOut(t *testing.T, s *suite) {
	b := s.setup(t, "acme")
	rec := b.create(t, "acme", "k")
	b.advance(10 * time.Minute)
	require.Equal(t, idem.StateOrphaned, b.get(t, "acme", "k").APIState())

	done := b.complete(t, "acme", "k", rec.FencingToken, response(1))
	require.Equal(t, idem.StateCompleted, done.State)
	requireTime(t, b.now(), done.CompletedAt, "CompletedAt")
	requireTime(t, b.now().Add(defaultReplayWindow), done.ReplayUntil, "ReplayUntil")

	res := b.claim(t, ClaimParams("acme", "k"))
	require.Equal(t, idem.ActionReplay, res.Action)
	requireResponse(t, response(1), res.Record.Response)
}

func testCompleteSameResponseNoop(t *testing.T, s *suite) {
	b := s.setup(t, "acme")
	rec := b.create(t, "acme", "k")
	done := b.complete(t, "acme", "k", rec.FencingToken, response(1))

	b.advance(time.Minute)
	again := b.complete(t, "acme", "k", rec.FencingToken, response(1))
	requireSameRecord(t, done, again)
	requireTime(t, b.now(), again.ObservedAt, "ObservedAt")
	requireSameRecord(t, done, b.get(t, "acme", "k"))
}

func testCompleteDifferentResponse(t *testing.T, s *suite) {
	b := s.setup(t, "acme")
	rec := b.create(t, "acme", "k")
	done := b.complete(t, "acme", "k", rec.FencingToken, response(1))
	b.advance(time.Minute)

	other := response(1)
	other.Status = 200
	headers := response(1)
	headers.Headers = map[string]string{"Content-Type": "text/plain"}
	for name, resp := range map[string]idem.Response{
		"body":    response(2),
		"status":  other,
		"headers": headers,
	} {
		_, err := b.store.Complete(b.ctx, idem.CompleteParams{TenantID: "acme", Key: "k", FencingToken: rec.FencingToken, Response: resp})
		requireCode(t, err, idem.ErrAlreadyCompleted, "different %s", name)
	}
	requireSameRecord(t, done, b.get(t, "acme", "k"))
}

func testCompleteRefusesCheckpointRelease(t *testing.T, s *suite) {
	b := s.setup(t, "acme")
	rec := b.create(t, "acme", "k")
	done := b.complete(t, "acme", "k", rec.FencingToken, response(1))

	_, err := b.store.Checkpoint(b.ctx, idem.CheckpointParams{
		TenantID: "acme", Key: "k", FencingToken: rec.FencingToken, RecoveryPoint: "late", Lease: defaultLease,
	})
	requireCode(t, err, idem.ErrAlreadyCompleted, "checkpoint of a completed record")
	err = b.store.Release(b.ctx, idem.ReleaseParams{TenantID: "acme", Key: "k", FencingToken: rec.FencingToken})
	requireCode(t, err, idem.ErrAlreadyCompleted, "release of a completed record")
	requireSameRecord(t, done, b.get(t, "acme", "k"))
}

func testCompleteKeepsWindows(t *testing.T, s *suite) {
	b := s.setup(t, "acme")
	// Two claims under different settings, as after a settings change.
	p1 := ClaimParams("acme", "before")
	p1.ReplayWindow = 10 * time.Minute
	p1.ReaperThreshold = time.Hour
	r1 := b.claim(t, p1).Record
	p2 := ClaimParams("acme", "after")
	p2.ReplayWindow = 2 * time.Hour
	p2.ReaperThreshold = 3 * time.Hour
	r2 := b.claim(t, p2).Record
	require.Equal(t, 10*time.Minute, r1.ReplayWindow)
	require.Equal(t, time.Hour, r1.ReaperThreshold)
	require.Equal(t, 2*time.Hour, r2.ReplayWindow)
	require.Equal(t, 3*time.Hour, r2.ReaperThreshold)

	// The replay window starts at completion, not at the claim.
	b.advance(5 * time.Minute)
	d1 := b.complete(t, "acme", "before", r1.FencingToken, response(1))
	d2 := b.complete(t, "acme", "after", r2.FencingToken, response(2))
	requireTime(t, d1.CompletedAt.Add(10*time.Minute), d1.ReplayUntil, "ReplayUntil of before")
	requireTime(t, d2.CompletedAt.Add(2*time.Hour), d2.ReplayUntil, "ReplayUntil of after")
	require.Equal(t, 10*time.Minute, d1.ReplayWindow)
	require.Equal(t, 2*time.Hour, d2.ReplayWindow)
	require.False(t, d1.PurgeAfter.Before(d1.ReplayUntil))
	require.False(t, d2.PurgeAfter.Before(d2.ReplayUntil))

	// Ten minutes after completion "before" is expired and "after" still replays.
	b.advance(10 * time.Minute)
	require.Equal(t, idem.StateExpired, b.get(t, "acme", "before").APIState())
	require.Equal(t, idem.StateCompleted, b.get(t, "acme", "after").APIState())
	res := b.claim(t, ClaimParams("acme", "after"))
	require.Equal(t, idem.ActionReplay, res.Action)
	res = b.claim(t, ClaimParams("acme", "before"))
	require.Equal(t, idem.ActionCreate, res.Action)
}

func testCheckpointRenews(t *testing.T, s *suite) {
	b := s.setup(t, "acme")
	rec := b.create(t, "acme", "k")
	b.advance(20 * time.Second)

	// Data is kept byte for byte: spacing, key order and number forms.
	data := []byte(`{"z": 1.50, "a":[true,null],  "u":"\u00e9"}`)
	cp := b.checkpoint(t, idem.CheckpointParams{
		TenantID: "acme", Key: "k", FencingToken: rec.FencingToken,
		RecoveryPoint: "charge_created", Data: data, Lease: 90 * time.Second,
	})
	now := b.now()
	require.Equal(t, idem.StateInFlight, cp.State)
	require.Equal(t, rec.FencingToken, cp.FencingToken, "a checkpoint keeps the token")
	require.Equal(t, 1, cp.Attempt, "a checkpoint is not an attempt")
	requireTime(t, now.Add(90*time.Second), cp.LeaseExpiresAt, "LeaseExpiresAt = now + Lease")
	require.Equal(t, "charge_created", cp.RecoveryPoint)
	requireBytes(t, data, cp.RecoveryData, "RecoveryData")
	requireTime(t, rec.CreatedAt, cp.CreatedAt, "CreatedAt")
	requireTime(t, now, cp.UpdatedAt, "UpdatedAt")
	requireTime(t, now, cp.ObservedAt, "ObservedAt")
	requireSameRecord(t, cp, b.get(t, "acme", "k"))

	// The renewed lease protects the key past the first lease.
	b.advance(60 * time.Second)
	_, err := b.store.Claim(b.ctx, ClaimParams("acme", "k"))
	requireCode(t, err, idem.ErrRequestInFlight)
	require.Equal(t, 30*time.Second, retryAfter(t, err).Round(time.Second))

	// A later checkpoint replaces the point; nil data keeps none.
	cp2 := b.checkpoint(t, idem.CheckpointParams{
		TenantID: "acme", Key: "k", FencingToken: rec.FencingToken,
		RecoveryPoint: "email_sent", Lease: 5 * time.Second,
	})
	require.Equal(t, "email_sent", cp2.RecoveryPoint)
	require.Empty(t, cp2.RecoveryData)
	requireTime(t, b.now().Add(5*time.Second), cp2.LeaseExpiresAt, "LeaseExpiresAt")
	requireSameRecord(t, cp2, b.get(t, "acme", "k"))
}

func testCheckpointAfterLeaseRanOut(t *testing.T, s *suite) {
	b := s.setup(t, "acme")
	rec := b.create(t, "acme", "k")
	b.advance(time.Hour)
	require.Equal(t, idem.StateOrphaned, b.get(t, "acme", "k").APIState())

	cp := b.checkpoint(t, idem.CheckpointParams{
		TenantID: "acme", Key: "k", FencingToken: rec.FencingToken,
		RecoveryPoint: "late", Lease: defaultLease,
	})
	require.Equal(t, idem.StateInFlight, cp.APIState())
	require.Equal(t, 1, cp.Attempt)
	requireTime(t, b.now().Add(defaultLease), cp.LeaseExpiresAt, "LeaseExpiresAt")

	_, err := b.store.Claim(b.ctx, ClaimParams("acme", "k"))
	requireCode(t, err, idem.ErrRequestInFlight, "the renewed lease runs again")
}

func testReleaseRemoves(t *testing.T, s *suite) {
	b := s.setup(t, "acme")
	rec := b.create(t, "acme", "k")
	b.checkpoint(t, idem.CheckpointParams{
		TenantID: "acme", Key: "k", FencingToken: rec.FencingToken,
		RecoveryPoint: "p", Data: []byte(`{}`), Lease: defaultLease,
	})
	require.NoError(t, b.store.Release(b.ctx, idem.ReleaseParams{TenantID: "acme", Key: "k", FencingToken: rec.FencingToken}))
	b.requireAbsent(t, "acme", "k")

	// Releasing again finds nothing.
	err := b.store.Release(b.ctx, idem.ReleaseParams{TenantID: "acme", Key: "k", FencingToken: rec.FencingToken})
	requireCode(t, err, idem.ErrKeyNotFound)

	// The next claim starts afresh, with any fingerprint.
	p := ClaimParams("acme", "k")
	p.Fingerprint = "sha256:different"
	res := b.claim(t, p)
	require.Equal(t, idem.ActionCreate, res.Action)
	require.Equal(t, 1, res.Record.Attempt)
	require.Greater(t, res.Record.FencingToken, rec.FencingToken)
	require.Empty(t, res.Record.RecoveryPoint)
	require.Empty(t, res.Record.RecoveryData)

	// The released token is stale on the new record.
	_, err = b.store.Complete(b.ctx, idem.CompleteParams{TenantID: "acme", Key: "k", FencingToken: rec.FencingToken, Response: response(1)})
	requireCode(t, err, idem.ErrLeaseLost)
}

func testReleaseOrphaned(t *testing.T, s *suite) {
	b := s.setup(t, "acme")
	rec := b.create(t, "acme", "k")
	b.advance(time.Hour)
	require.NoError(t, b.store.Release(b.ctx, idem.ReleaseParams{TenantID: "acme", Key: "k", FencingToken: rec.FencingToken}),
		"the current token releases an orphan nobody took over")
	b.requireAbsent(t, "acme", "k")
}

// testCompleteAnswerIsStored: whatever the response holds (no body, an
// empty one, no headers, base64, a checkpointed record's recovery data), the
// record Complete answers with is the one a read returns afterwards.
func testCompleteAnswerIsStored(t *testing.T, s *suite) {
	b := s.setup(t, "acme")
	base64Body := response(1)
	base64Body.Body, base64Body.BodyEncoding = []byte("AAEC/w=="), idem.BodyEncodingBase64
	for name, resp := range map[string]idem.Response{
		"nil body":   {Status: 204, Headers: map[string]string{"X-A": "1"}, BodyEncoding: idem.BodyEncodingUTF8},
		"empty body": {Status: 200, Headers: map[string]string{}, Body: []byte{}, BodyEncoding: idem.BodyEncodingUTF8},
		"no headers": {Status: 500, Body: []byte(`{"error":"x"}`), BodyEncoding: idem.BodyEncodingUTF8},
		"base64":     base64Body,
	} {
		rec := b.create(t, "acme", name)
		done := b.complete(t, "acme", name, rec.FencingToken, resp) // compares with a read
		requireResponse(t, resp, done.Response)
	}
	rec := b.create(t, "acme", "checkpointed")
	b.checkpoint(t, idem.CheckpointParams{
		TenantID: "acme", Key: "checkpointed", FencingToken: rec.FencingToken,
		RecoveryPoint: "charged", Data: json.RawMessage(`{"charge":"ch_1"}`), Lease: defaultLease,
	})
	done := b.complete(t, "acme", "checkpointed", rec.FencingToken, response(1))
	require.Equal(t, "charged", done.RecoveryPoint)
	requireBytes(t, []byte(`{"charge":"ch_1"}`), done.RecoveryData, "recovery data kept by the complete")
}

// testCompleteStatusRange: a completion (a worker's or a person's) whose
// status is outside 100–599, which a replay cannot send and the API cannot
// show, is refused invalid_request naming response.status, the record left
// as it was, no audit entry written; 100 and 599 are stored. The API checks
// the range first; the store checks it again for callers that reach it
// directly (the gateway stored an upstream's 799 as it was).
func testCompleteStatusRange(t *testing.T, s *suite) {
	b := s.setup(t, "acme")
	rec := b.create(t, "acme", "k")
	for _, status := range []int{0, 99, 600, 799, 1000, -1} {
		resp := response(1)
		resp.Status = status
		_, err := b.store.Complete(b.ctx, idem.CompleteParams{TenantID: "acme", Key: "k", FencingToken: rec.FencingToken, Response: resp})
		requireCode(t, err, idem.ErrInvalidRequest, "status %d", status)
		var ie *idem.Error
		require.ErrorAs(t, err, &ie)
		require.Equal(t, []idem.FieldError{{Field: "response.status", Message: "must be between 100 and 599"}}, ie.Fields)
	}
	requireSameRecord(t, rec, b.get(t, "acme", "k"))

	b.advance(defaultLease)
	p := resolution("acme", "k", idem.ResolveComplete, rec.FencingToken)
	p.Response.Status = 799
	_, err := b.store.Resolve(b.ctx, p)
	requireCode(t, err, idem.ErrInvalidRequest, "a completion by hand")
	requireSameRecord(t, rec, b.get(t, "acme", "k"))
	require.Empty(t, b.audit(t, "acme", ""), "a refused resolution writes no audit entry")

	for _, status := range []int{100, 599} {
		key := fmt.Sprintf("k-%d", status)
		r := b.create(t, "acme", key)
		resp := response(1)
		resp.Status = status
		done := b.complete(t, "acme", key, r.FencingToken, resp)
		require.Equal(t, status, done.Response.Status)
	}
}
