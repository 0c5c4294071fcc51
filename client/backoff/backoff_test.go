package backoff

import (
	"math"
	"testing"
	"time"
)

// TestCeilingIsTheFormerCeilings: for the bases, limits and retry numbers
// the SDK, the webhook deliveries and the completer use, Ceiling is what
// each of their own formulas gave before they shared it.
func TestCeilingIsTheFormerCeilings(t *testing.T) {
	sdk := func(base, limit time.Duration, n int) time.Duration { // client/retry.go
		if n < 62 {
			if c := float64(base) * math.Pow(2, float64(n)); c < float64(limit) {
				return time.Duration(c)
			}
		}
		return limit
	}
	jobs := func(base, limit time.Duration, n int) time.Duration { // webhooks, completer
		c := limit
		if n < 40 && base<<n > 0 {
			c = min(c, base<<n)
		}
		return c
	}
	for _, base := range []time.Duration{time.Millisecond, 100 * time.Millisecond, time.Second, 10 * time.Second} {
		for _, limit := range []time.Duration{base, 30 * time.Second, 10 * time.Minute, time.Hour} {
			for n := range 80 {
				got := Ceiling(base, limit, n)
				if want := sdk(base, limit, n); got != want {
					t.Errorf("Ceiling(%s, %s, %d) = %s, the SDK's formula %s", base, limit, n, got, want)
				}
				if want := jobs(base, limit, n); got != want {
					t.Errorf("Ceiling(%s, %s, %d) = %s, the jobs' formula %s", base, limit, n, got, want)
				}
			}
		}
	}
	if got := Ceiling(time.Second, time.Minute, -1); got != time.Minute {
		t.Errorf("a negative n: %s, want the limit", got)
	}
}
