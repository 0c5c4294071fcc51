package retrybudget

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestParseAttempt(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   []string
		want Attempt
	}{
		{nil, First},
		{[]string{"1"}, First},
		{[]string{"2;cause=timeout"}, Attempt{2, CauseTimeout}},
		{[]string{"3; cause=server-error"}, Attempt{3, CauseServerError}}, // RFC 9651 allows spaces after ';'
		{[]string{"3 ;cause=server-error"}, First},                        // but none before it
		{[]string{"3;cause=server-error"}, Attempt{3, CauseServerError}},
		{[]string{"4;cause=in-flight"}, Attempt{4, CauseInFlight}},
		{[]string{"2"}, Attempt{2, CauseOther}},
		{[]string{"2;cause=sunspots"}, Attempt{2, CauseOther}},
		{[]string{`2;cause="timeout"`}, Attempt{2, CauseOther}}, // a String, not a Token
		{[]string{"0"}, First},
		{[]string{"-3"}, First},
		{[]string{"abc"}, First},
		{[]string{"2", "3"}, First}, // two lines make a List, not an Item
		{[]string{"2.5"}, First},
		{[]string{"9999999999999999"}, First}, // past RFC 9651's 15 digits
	} {
		require.Equal(t, tc.want, ParseAttempt(tc.in), "%q", tc.in)
	}
}

func TestFormatRoundTrip(t *testing.T) {
	t.Parallel()
	require.Equal(t, "1", Format(1, CauseTimeout))
	require.Equal(t, "2;cause=timeout", Format(2, CauseTimeout))
	for _, c := range Causes {
		require.Equal(t, Attempt{5, c}, ParseAttempt([]string{Format(5, c)}))
	}
}

type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func TestBudgetShareAndFloor(t *testing.T) {
	t.Parallel()
	c := &clock{t: time.Unix(1_000_000, 0)}
	b := New(10*time.Second, c.now)
	retry := Attempt{2, CauseUnavailable}
	b.Admit("a", KindClaim, First)
	b.SetPercent("a", 10)
	// 199 more first attempts: 200 in the window, 10 % is 20 retries.
	for range 199 {
		require.True(t, b.Admit("a", KindClaim, First).Allowed)
	}
	for i := range 20 {
		require.True(t, b.Admit("a", KindClaim, retry).Allowed, "retry %d", i)
	}
	d := b.Admit("a", KindClaim, retry)
	require.False(t, d.Allowed)
	require.Equal(t, 11*time.Second, d.RetryAfter, "until the slot of the retries has wholly left the window")
	require.True(t, b.Admit("a", KindClaim, First).Allowed, "first attempts are always served")

	// A quiet tenant (no first attempts, percent 0) has the floor.
	b.Admit("q", KindClaim, First)
	b.SetPercent("q", 0)
	for i := range Floor {
		require.True(t, b.Admit("q", KindClaim, retry).Allowed, "retry %d", i)
	}
	require.False(t, b.Admit("q", KindClaim, retry).Allowed)

	// The window slides: after it, room again; Retry-After counted down.
	c.t = c.t.Add(4 * time.Second)
	require.Equal(t, 7*time.Second, b.Admit("q", KindClaim, retry).RetryAfter)
	c.t = c.t.Add(6 * time.Second)
	require.False(t, b.Admit("q", KindClaim, retry).Allowed, "10 s on, the retries' slot is still wholly in the window")
	c.t = c.t.Add(500 * time.Millisecond)
	for i := range 5 {
		require.True(t, b.Admit("q", KindClaim, retry).Allowed, "half of the slot is out: 5 of its 10 retries count, room for 5 (%d)", i)
	}
	require.False(t, b.Admit("q", KindClaim, retry).Allowed)

	// Off admits every retry.
	b.Admit("off", KindClaim, First)
	b.SetPercent("off", Off)
	for range 100 {
		require.True(t, b.Admit("off", KindClaim, retry).Allowed)
	}
}

func TestSnapshotAmplification(t *testing.T) {
	t.Parallel()
	c := &clock{t: time.Unix(1_000_000, 0)}
	b := New(10*time.Second, c.now)
	for range 10 {
		b.Admit("a", KindClaim, First)
	}
	for range 15 {
		b.Admit("a", KindClaim, Attempt{2, CauseTimeout})
	}
	s := b.Snapshot()
	require.Len(t, s, 1)
	require.Equal(t, Stats{Tenant: "a", First: 10, Retries: 10, Refused: 5}, s[0])
	require.InDelta(t, 2.5, s[0].Amplification(), 1e-9)
	c.t = c.t.Add(11 * time.Second)
	require.Empty(t, b.Snapshot(), "an idle tenant leaves the snapshot")
}

// TestHistory: the last hour keeps one bucket per minute of what Admit
// counted (refused retries apart), outlives the window, slides minute by
// minute, and lets the tenant go once it has been idle for an hour.
func TestHistory(t *testing.T) {
	t.Parallel()
	c := &clock{t: time.Unix(1_000_000*60, 0)} // on a minute
	b := New(10*time.Second, c.now)
	for range 20 {
		b.Admit("a", KindClaim, First)
	}
	for range 15 {
		b.Admit("a", KindClaim, Attempt{2, CauseUnavailable}) // 10 admitted (the floor), 5 refused
	}
	c.t = c.t.Add(90 * time.Second) // the next minute but one, the window long gone
	b.Admit("a", KindClaim, First)
	b.Admit("b", KindClaim, Attempt{3, CauseTimeout})

	h := b.History("a")
	require.Len(t, h.Buckets, HistoryBuckets)
	last := h.Buckets[HistoryBuckets-1]
	require.Equal(t, time.Unix(1_000_001*60, 0).UTC(), last.Start)
	require.Equal(t, Bucket{Start: last.Start, First: 1}, last)
	require.Equal(t, Bucket{Start: time.Unix(1_000_000*60, 0).UTC(), First: 20, Retries: 10, Refused: 5}, h.Buckets[HistoryBuckets-2])
	require.InDelta(t, 35.0/20, h.Buckets[HistoryBuckets-2].Amplification(), 1e-9)
	require.Equal(t, Stats{Tenant: "a", First: 1}, h.Window)
	var total Bucket
	for _, k := range h.Buckets {
		total.First += k.First
		total.Retries += k.Retries
		total.Refused += k.Refused
	}
	require.Equal(t, Bucket{First: 21, Retries: 10, Refused: 5}, total)

	all := b.Histories()
	require.Len(t, all, 2)
	require.Equal(t, "a", all[0].Window.Tenant)
	require.Equal(t, "b", all[1].Window.Tenant)
	require.Equal(t, int64(1), all[1].Buckets[HistoryBuckets-1].Retries)

	never := b.History("nobody")
	require.Len(t, never.Buckets, HistoryBuckets)
	require.Equal(t, Stats{Tenant: "nobody"}, never.Window)

	// The window is empty but the hour is not: the tenant stays, out of
	// the snapshot (the gauge) but in the history.
	c.t = c.t.Add(30 * time.Second)
	require.Empty(t, b.Snapshot())
	require.Len(t, b.Histories(), 2)
	require.Equal(t, int64(20), b.History("a").Buckets[HistoryBuckets-3].First)

	// An hour later the minutes have slid out, and the tenants are gone.
	c.t = c.t.Add(time.Hour)
	require.Empty(t, b.Snapshot())
	require.Empty(t, b.Histories())
	require.Empty(t, b.tenants)
}

// TestInvite: the signal says spent once the failures answered without it
// (each inviting a retry) or the retries admitted fill the allowance; the
// invitations leave with the window; off and unknown tenants are never
// spent.
func TestInvite(t *testing.T) {
	t.Parallel()
	c := &clock{t: time.Unix(1_000_000, 0)}
	b := New(10*time.Second, c.now)
	for range 200 {
		b.Admit("a", KindClaim, First)
	}
	b.SetPercent("a", 10) // allowance 20
	for i := range 20 {
		require.False(t, b.Invite("a", KindClaim), "failure %d invites a retry", i)
	}
	require.True(t, b.Invite("a", KindClaim), "20 retries invited: spent")
	require.True(t, b.Admit("a", KindClaim, Attempt{2, CauseUnavailable}).Allowed, "the signal is advice: the refusal rule is unchanged")

	c.t = c.t.Add(11 * time.Second) // the window is empty again
	for range 200 {
		b.Admit("a", KindClaim, First)
	}
	require.False(t, b.Invite("a", KindClaim))

	// Spent by admitted retries alone.
	b.Admit("q", KindClaim, First)
	b.SetPercent("q", 0)
	for range Floor {
		require.True(t, b.Admit("q", KindClaim, Attempt{2, CauseTimeout}).Allowed)
	}
	require.True(t, b.Invite("q", KindClaim))

	b.Admit("off", KindClaim, First)
	b.SetPercent("off", Off)
	for range 100 {
		require.False(t, b.Invite("off", KindClaim))
	}
	require.False(t, b.Invite("never-seen", KindClaim))
}

// TestBudgetPerKind: a retry spends the allowance of the first attempts of
// its own kind of call. The storm's window before a store outage holds
// claims and completes in equal numbers; during it only claims come, and
// only claims are retried: the claims' retries are 10 % of the claims (20
// of 200), not 10 % of claims and completes together (40, what the rule
// of one count per tenant admitted, 20 % of the claims). The floor is the
// tenant's over every kind; each kind's invitations (the signal) are
// counted against its own allowance too.
func TestBudgetPerKind(t *testing.T) {
	t.Parallel()
	c := &clock{t: time.Unix(1_000_000, 0)}
	b := New(10*time.Second, c.now)
	retry := Attempt{2, CauseUnavailable}
	for range 200 {
		b.Admit("a", KindClaim, First)
		b.Admit("a", KindComplete, First)
	}
	b.SetPercent("a", 10)
	admitted := 0
	for range 60 {
		if b.Admit("a", KindClaim, retry).Allowed {
			admitted++
		}
	}
	require.Equal(t, 20, admitted, "10 %% of the 200 claims, not of the 400 first attempts")
	d := b.Admit("a", KindClaim, retry)
	require.False(t, d.Allowed)
	require.Equal(t, 11*time.Second, d.RetryAfter)
	// The completes have their own 20.
	for i := range 20 {
		require.True(t, b.Admit("a", KindComplete, retry).Allowed, "complete retry %d", i)
	}
	require.False(t, b.Admit("a", KindComplete, retry).Allowed)
	// A kind without first attempts has only the floor, and it is spent.
	require.False(t, b.Admit("a", KindRelease, retry).Allowed)
	require.Equal(t, Stats{Tenant: "a", First: 400, Retries: 40, Refused: 43}, b.Snapshot()[0])

	// The floor is the tenant's: 10 retries whatever their kinds.
	b.Admit("q", KindOther, First)
	b.SetPercent("q", 0)
	for i := range Floor {
		require.True(t, b.Admit("q", []Kind{KindClaim, KindComplete, KindOther}[i%3], retry).Allowed, "retry %d", i)
	}
	for _, k := range []Kind{KindClaim, KindCheckpoint, KindComplete, KindRelease, KindOther, Kind(200)} {
		require.False(t, b.Admit("q", k, retry).Allowed, "kind %s past the floor", k)
	}

	// Invitations: the claims' allowance (20) fills with claim failures;
	// the completes still have room for theirs.
	c.t = c.t.Add(11 * time.Second)
	for range 200 {
		b.Admit("a", KindClaim, First)
		b.Admit("a", KindComplete, First)
	}
	for i := range 20 {
		require.False(t, b.Invite("a", KindClaim), "claim failure %d invites a retry", i)
	}
	require.True(t, b.Invite("a", KindClaim), "20 claim retries invited: spent")
	require.False(t, b.Invite("a", KindComplete), "the completes' allowance is their own")
}

// TestBudgetWindowSlidesSmoothly: the oldest slot leaves the window little
// by little, not all at once when a slot begins: 100 first claims in each
// of 10 slots make an allowance of 100 that stays 100 as the window
// slides on over claims at the same rate, so a retry invited at the end of
// a slot is not refused at the start of the next (dropping the oldest slot
// whole took 10 % of the first attempts, and of the allowance, out at each
// slot boundary).
func TestBudgetWindowSlidesSmoothly(t *testing.T) {
	t.Parallel()
	c := &clock{t: time.Unix(1_000_000, 0)}
	b := New(10*time.Second, c.now)
	b.Admit("a", KindClaim, First)
	b.SetPercent("a", 10)
	for range 10 {
		for range 100 {
			b.Admit("a", KindClaim, First)
		}
		c.t = c.t.Add(time.Second)
	}
	// Just past a slot boundary: the new slot holds nothing yet; the
	// oldest slot (100 claims and the 1 above) is still almost wholly in.
	c.t = c.t.Add(time.Millisecond)
	for i := range 100 {
		require.True(t, b.Admit("a", KindClaim, Attempt{2, CauseUnavailable}).Allowed, "retry %d", i)
	}
	require.False(t, b.Admit("a", KindClaim, Attempt{2, CauseUnavailable}).Allowed)
}
