// Package backoff is the one exponential ceiling of idem's full-jitter
// backoffs: the SDK's retry loop, the webhook deliveries' retries and the
// completer's attempts each wait a random time below Ceiling. It lives in
// the SDK module, beside errcode, because both modules use it and the SDK
// must not import the server. It imports nothing but the standard library.
package backoff

import "time"

// Ceiling returns min(limit, base·2^n), the exclusive upper bound of the
// full-jitter wait before retry n (0 for the first): limit once base·2^n
// reaches it or would overflow, and for a negative n.
func Ceiling(base, limit time.Duration, n int) time.Duration {
	if n >= 0 && n < 63 {
		if c := base << n; c > 0 && c>>n == base && c < limit {
			return c
		}
	}
	return limit
}
