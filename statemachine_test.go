package idem_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem"
)

func TestDecideClaim(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	inFlight := &idem.Record{Key: "k", State: idem.StateInFlight, Operation: "op", Fingerprint: "fp", LeaseExpiresAt: now.Add(time.Second)}
	orphaned := &idem.Record{Key: "k", State: idem.StateInFlight, Operation: "op", Fingerprint: "fp", LeaseExpiresAt: now}
	inFlightA := &idem.Record{Key: "k", State: idem.StateInFlight, Operation: "op", Fingerprint: "fp", AttemptID: "a", LeaseExpiresAt: now.Add(time.Second)}
	orphanedA := &idem.Record{Key: "k", State: idem.StateInFlight, Operation: "op", Fingerprint: "fp", AttemptID: "a", LeaseExpiresAt: now}
	completed := &idem.Record{Key: "k", State: idem.StateCompleted, Operation: "op", Fingerprint: "fp", ReplayUntil: now.Add(time.Second)}
	expired := &idem.Record{Key: "k", State: idem.StateCompleted, Operation: "op", Fingerprint: "fp", ReplayUntil: now}

	cases := []struct {
		name              string
		stored            *idem.Record
		op, fp, attemptID string
		want              idem.ClaimAction
	}{
		{"absent", nil, "op", "fp", "", idem.ActionCreate},
		{"expired, same request", expired, "op", "fp", "", idem.ActionCreate},
		{"expired, other request", expired, "other", "other", "", idem.ActionCreate},
		{"in flight, same request", inFlight, "op", "fp", "", idem.ActionRejectInFlight},
		{"in flight, other fingerprint", inFlight, "op", "fp2", "", idem.ActionRejectMismatch},
		{"orphaned, same request", orphaned, "op", "fp", "", idem.ActionTakeover},
		{"orphaned, other operation", orphaned, "op2", "fp", "", idem.ActionRejectMismatch},
		{"completed, same request", completed, "op", "fp", "", idem.ActionReplay},
		{"completed, other fingerprint", completed, "op", "fp2", "", idem.ActionRejectMismatch},
		{"completed, other operation", completed, "op2", "fp", "", idem.ActionRejectMismatch},
		{"in flight, same attempt id", inFlightA, "op", "fp", "a", idem.ActionRecover},
		{"in flight, other attempt id", inFlightA, "op", "fp", "b", idem.ActionRejectInFlight},
		{"in flight, no attempt id", inFlightA, "op", "fp", "", idem.ActionRejectInFlight},
		{"in flight without one, an attempt id", inFlight, "op", "fp", "a", idem.ActionRejectInFlight},
		{"in flight, same attempt id, other fingerprint", inFlightA, "op", "fp2", "a", idem.ActionRejectMismatch},
		{"orphaned, same attempt id", orphanedA, "op", "fp", "a", idem.ActionTakeover},
		{"completed, an attempt id", completed, "op", "fp", "a", idem.ActionReplay},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := idem.DecideClaim(tc.stored, idem.ClaimParams{Operation: tc.op, Fingerprint: tc.fp, AttemptID: tc.attemptID}, now)
			require.Equal(t, tc.want, got, "got %v", got)
		})
	}
}

func TestClaimError(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	rec := &idem.Record{Key: "order-42", State: idem.StateInFlight, LeaseExpiresAt: now.Add(2500 * time.Millisecond)}

	err := idem.ClaimError(idem.ActionRejectInFlight, rec, now)
	require.ErrorIs(t, err, idem.ErrRequestInFlight)
	var e *idem.Error
	require.True(t, errors.As(err, &e))
	require.Equal(t, 2500*time.Millisecond, e.RetryAfter)

	require.ErrorIs(t, idem.ClaimError(idem.ActionRejectMismatch, rec, now), idem.ErrFingerprintMismatch)
	require.NoError(t, idem.ClaimError(idem.ActionCreate, rec, now))
	require.NoError(t, idem.ClaimError(idem.ActionReplay, rec, now))
}

func TestCheckToken(t *testing.T) {
	t.Parallel()
	rec := &idem.Record{Key: "k", FencingToken: 7}
	require.ErrorIs(t, idem.CheckToken(nil, 7), idem.ErrKeyNotFound)
	require.ErrorIs(t, idem.CheckToken(rec, 6), idem.ErrLeaseLost)
	require.ErrorIs(t, idem.CheckToken(rec, 8), idem.ErrLeaseLost)
	require.NoError(t, idem.CheckToken(rec, 7))
}

func TestCheckWriteAndComplete(t *testing.T) {
	t.Parallel()
	resp := idem.Response{Status: 201, Headers: map[string]string{"A": "1"}, Body: []byte("ok"), BodyEncoding: idem.BodyEncodingUTF8}
	inFlight := &idem.Record{Key: "k", FencingToken: 7, State: idem.StateInFlight}
	done := &idem.Record{Key: "k", FencingToken: 7, State: idem.StateCompleted, Response: &resp}

	require.ErrorIs(t, idem.CheckWrite(nil, 7), idem.ErrKeyNotFound)
	require.ErrorIs(t, idem.CheckWrite(inFlight, 6), idem.ErrLeaseLost)
	require.NoError(t, idem.CheckWrite(inFlight, 7))
	require.ErrorIs(t, idem.CheckWrite(done, 7), idem.ErrAlreadyCompleted, "a stored response is never changed or thrown away")
	require.ErrorIs(t, idem.CheckWrite(done, 6), idem.ErrLeaseLost, "the token is checked first")

	repeat, err := idem.CheckComplete(done, 7, resp)
	require.NoError(t, err)
	require.True(t, repeat, "completing again with an equal response is a no-op")
	other := resp
	other.Status = 500
	repeat, err = idem.CheckComplete(done, 7, other)
	require.ErrorIs(t, err, idem.ErrAlreadyCompleted)
	require.False(t, repeat)
	repeat, err = idem.CheckComplete(done, 6, resp)
	require.ErrorIs(t, err, idem.ErrLeaseLost)
	require.False(t, repeat)
	repeat, err = idem.CheckComplete(inFlight, 7, resp)
	require.NoError(t, err)
	require.False(t, repeat, "an in-flight record is completed, not repeated")
}

func TestRecordStates(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	r := idem.Record{State: idem.StateInFlight, LeaseExpiresAt: now.Add(3 * time.Second), ObservedAt: now}
	require.Equal(t, idem.StateInFlight, r.APIState())
	require.Equal(t, 3*time.Second, r.LeaseLeft())
	require.Equal(t, idem.StateOrphaned, r.StateAt(now.Add(3*time.Second)))

	c := idem.Record{State: idem.StateCompleted, ReplayUntil: now.Add(time.Hour), ObservedAt: now}
	require.Equal(t, idem.StateCompleted, c.APIState())
	require.Zero(t, c.LeaseLeft())
	require.Equal(t, idem.StateExpired, c.StateAt(now.Add(time.Hour)))
}

func TestErrorMatchesByCode(t *testing.T) {
	t.Parallel()
	err := errors.Join(errors.New("context"), idem.Errorf(idem.CodeLeaseLost, "token %d is stale", 3))
	require.ErrorIs(t, err, idem.ErrLeaseLost)
	require.NotErrorIs(t, err, idem.ErrKeyNotFound)
	require.Equal(t, idem.CodeLeaseLost, idem.ErrorCode(err))
	require.Equal(t, idem.CodeInternal, idem.ErrorCode(errors.New("boom")))
	require.Equal(t, idem.Code(""), idem.ErrorCode(nil))
}

func TestValidateKey(t *testing.T) {
	t.Parallel()
	require.NoError(t, idem.ValidateKey("order-42"))
	require.NoError(t, idem.ValidateKey("!~"))
	require.NoError(t, idem.ValidateKey(strings.Repeat("k", 255)))
	for _, bad := range []string{"", strings.Repeat("k", 256), "has space", "tab\t", "é", "del\x7f"} {
		require.ErrorIs(t, idem.ValidateKey(bad), idem.ErrInvalidKey, "key %q", bad)
	}
}

func TestValidateTenantID(t *testing.T) {
	t.Parallel()
	require.NoError(t, idem.ValidateTenantID("acme_eu-1"))
	for _, bad := range []string{"", "Acme", "a b", strings.Repeat("a", 65), "a.b"} {
		require.ErrorIs(t, idem.ValidateTenantID(bad), idem.ErrInvalidRequest, "id %q", bad)
	}
}

func TestSettingsValidate(t *testing.T) {
	t.Parallel()
	require.NoError(t, idem.DefaultSettings().Validate())

	ptr := func(v int) *int { return &v }
	cases := []struct {
		patch idem.SettingsPatch
		field string
	}{
		{idem.SettingsPatch{ReplayWindowSeconds: ptr(0)}, "settings.replay_window_seconds"},
		{idem.SettingsPatch{ReplayWindowSeconds: ptr(31536001)}, "settings.replay_window_seconds"},
		{idem.SettingsPatch{ReaperThresholdSeconds: ptr(3600)}, "settings.reaper_threshold_seconds"},
		{idem.SettingsPatch{LeaseSecondsDefault: ptr(3601)}, "settings.lease_seconds_default"},
		{idem.SettingsPatch{LeaseSecondsMax: ptr(86401)}, "settings.lease_seconds_max"},
		{idem.SettingsPatch{MaxResponseBytes: ptr(8<<20 + 1)}, "settings.max_response_bytes"},
		{idem.SettingsPatch{RateLimitPerSecond: ptr(-1)}, "settings.rate_limit_per_second"},
		{idem.SettingsPatch{MaxWaitSeconds: ptr(-1)}, "settings.max_wait_seconds"},
		{idem.SettingsPatch{MaxWaitSeconds: ptr(301)}, "settings.max_wait_seconds"},
	}
	for _, tc := range cases {
		err := idem.DefaultSettings().Apply(tc.patch).Validate()
		var e *idem.Error
		require.True(t, errors.As(err, &e), "patch for %s must fail", tc.field)
		require.Equal(t, idem.CodeInvalidRequest, e.Code)
		require.Equal(t, tc.field, e.Fields[0].Field)
	}
}

func TestWaitFor(t *testing.T) {
	t.Parallel()
	s := idem.DefaultSettings()
	require.Equal(t, time.Duration(0), s.WaitFor(0))
	require.Equal(t, 5*time.Second, s.WaitFor(5))
	require.Equal(t, 20*time.Second, s.WaitFor(300), "capped by max_wait_seconds")
	s.MaxWaitSeconds = 0
	require.Equal(t, time.Duration(0), s.WaitFor(10), "0 turns waiting off")
}

func TestLeaseFor(t *testing.T) {
	t.Parallel()
	s := idem.DefaultSettings()
	d, err := s.LeaseFor(0)
	require.NoError(t, err)
	require.Equal(t, 30*time.Second, d)
	d, err = s.LeaseFor(3600)
	require.NoError(t, err)
	require.Equal(t, time.Hour, d)
	_, err = s.LeaseFor(3601)
	require.ErrorIs(t, err, idem.ErrInvalidRequest)
	_, err = s.LeaseFor(-1)
	require.ErrorIs(t, err, idem.ErrInvalidRequest)
}

func TestResponseEqualAndSize(t *testing.T) {
	t.Parallel()
	a := idem.Response{Status: 201, Headers: map[string]string{"Content-Type": "application/json"}, Body: []byte(`{"id":1}`), BodyEncoding: idem.BodyEncodingUTF8}
	b := a
	b.BodyEncoding = idem.BodyEncodingBase64
	require.True(t, a.Equal(b), "encoding does not take part in equality")
	c := a
	c.Body = []byte(`{"id":2}`)
	require.False(t, a.Equal(c))
	require.Equal(t, len(`{"id":1}`)+len("Content-Type")+len("application/json"), a.Size())
}
