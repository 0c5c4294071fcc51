package idem_test

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem"
)

func TestMatchOperationAndPickCompleter(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		pattern, op string
		want        bool
	}{
		{"", "POST /orders", true},
		{"POST /orders", "POST /orders", true},
		{"POST /orders", "POST /orders/1", false},
		{"POST /orders*", "POST /orders/1", true},
		{"POST /orders*", "POST /order", false},
		{"*", "", true},
	} {
		require.Equal(t, tc.want, idem.MatchOperation(tc.pattern, tc.op), "%q %q", tc.pattern, tc.op)
	}
	cs := []idem.Completer{{ID: "any"}, {ID: "orders", OperationPattern: "POST /orders*"}, {ID: "refund", OperationPattern: "POST /orders/refund"}}
	c, ok := idem.PickCompleter(cs, "POST /orders/refund")
	require.True(t, ok)
	require.Equal(t, "refund", c.ID, "the most specific pattern wins")
	c, _ = idem.PickCompleter(cs, "POST /payments")
	require.Equal(t, "any", c.ID)
	_, ok = idem.PickCompleter(cs[1:], "POST /payments")
	require.False(t, ok)
	require.Error(t, idem.ValidateOperationPattern("POST /*/refund"))
	require.NoError(t, idem.ValidateOperationPattern("POST /orders*"))
}

// A claim of a record the completer holds is refused with outcome_unknown
// (Retry-After = the next attempt) and never taken over, even once its
// lease ran out; one it flagged is outcome_review; a mismatch is still a
// mismatch.
func TestDecideClaimCompleterHold(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 1, 23, 0, 0, 0, time.UTC)
	rec := func(state idem.CompletionState, lease time.Time) *idem.Record {
		return &idem.Record{Key: "k", State: idem.StateInFlight, Operation: "op", Fingerprint: "fp", LeaseExpiresAt: lease,
			Completion: &idem.Completion{State: state, Attempts: 2, NextAttemptAt: now.Add(40 * time.Second)}}
	}
	p := idem.ClaimParams{Operation: "op", Fingerprint: "fp"}
	for _, tc := range []struct {
		stored *idem.Record
		want   idem.ClaimAction
		code   idem.Code
		retry  time.Duration
	}{
		{rec(idem.CompletionResuming, now.Add(10*time.Second)), idem.ActionRejectUnknown, idem.CodeOutcomeUnknown, 10 * time.Second},
		{rec(idem.CompletionResuming, now.Add(-time.Second)), idem.ActionRejectUnknown, idem.CodeOutcomeUnknown, time.Second},
		{rec(idem.CompletionUnknown, now), idem.ActionRejectUnknown, idem.CodeOutcomeUnknown, 40 * time.Second},
		{rec(idem.CompletionReview, now), idem.ActionRejectReview, idem.CodeOutcomeReview, 0},
	} {
		action := idem.DecideClaim(tc.stored, p, now)
		require.Equal(t, tc.want, action, tc.stored.Completion.State)
		err := idem.ClaimError(action, tc.stored, now)
		var e *idem.Error
		require.True(t, errors.As(err, &e))
		require.Equal(t, tc.code, e.Code)
		require.Equal(t, tc.retry, e.RetryAfter)
	}
	require.Equal(t, idem.ActionRejectMismatch, idem.DecideClaim(rec(idem.CompletionReview, now), idem.ClaimParams{Operation: "other", Fingerprint: "fp"}, now))
	flagged := rec(idem.CompletionUnknown, now)
	flagged.Review = &idem.Review{Note: "a person looks at it"}
	require.Equal(t, idem.ActionRejectReview, idem.DecideClaim(flagged, p, now), "a person's flag stops the completer: the key waits for the person")
}
