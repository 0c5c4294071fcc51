package client

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestFullJitterBounds(t *testing.T) {
	t.Parallel()
	p := DefaultRetryPolicy()
	for n, ceiling := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, 30 * time.Second, 30 * time.Second} {
		const draws = 20000
		var sum float64
		lo, hi := time.Duration(math.MaxInt64), time.Duration(0)
		for range draws {
			d := p.backoff(n, 0)
			require.GreaterOrEqual(t, d, time.Duration(0))
			require.Less(t, d, ceiling)
			lo, hi = min(lo, d), max(hi, d)
			sum += float64(d)
		}
		mean := sum / draws
		// Uniform on [0, ceiling): mean ceiling/2, spread over the window.
		require.InEpsilon(t, float64(ceiling)/2, mean, 0.03, "retry %d", n)
		require.Less(t, lo, ceiling/50)
		require.Greater(t, hi, ceiling-ceiling/50)
	}
	require.Less(t, p.backoff(100, 0), 30*time.Second, "no overflow for large n")
}

func TestDecorrelatedJitterBounds(t *testing.T) {
	t.Parallel()
	p := RetryPolicy{Jitter: DecorrelatedJitter}.withDefaults()
	prev := time.Duration(0)
	for range 20000 {
		d := p.backoff(0, prev)
		lower := p.BaseDelay
		upper := min(3*max(prev, p.BaseDelay), p.MaxDelay)
		require.GreaterOrEqual(t, d, lower)
		require.LessOrEqual(t, d, upper)
		prev = d
	}
}

func TestRetryAfterParsing(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	require.Equal(t, 3*time.Second, parseRetryAfter("3", now))
	require.Equal(t, 90*time.Second, parseRetryAfter(now.Add(90*time.Second).Format("Mon, 02 Jan 2006 15:04:05 GMT"), now))
	require.Zero(t, parseRetryAfter(now.Add(-time.Minute).Format("Mon, 02 Jan 2006 15:04:05 GMT"), now))
	require.Zero(t, parseRetryAfter("", now))
	require.Zero(t, parseRetryAfter("soon", now))
	require.Zero(t, parseRetryAfter("-5", now))
}

func TestBudget(t *testing.T) {
	t.Parallel()
	b := newRetryBudget(DefaultRetryPolicy())
	for range 10 {
		require.True(t, b.take())
	}
	require.False(t, b.take())
	for range 9 {
		b.success()
	}
	require.False(t, b.take(), "0.9 tokens do not pay for a retry")
	b.success()
	require.True(t, b.take())
	for range 1000 {
		b.success()
	}
	require.InDelta(t, 10, b.left(), 1e-9, "refunds stop at the capacity")
	off := newRetryBudget(RetryPolicy{BudgetCapacity: -1}.withDefaults())
	for range 1000 {
		require.True(t, off.take())
	}
}
