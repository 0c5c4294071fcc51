// Package budget is a budget of bytes held in memory across requests, the
// one the API server (package api) and the gateway both charge request
// bodies against before they read them, so that many large or slow bodies
// at once are refused (503 server_busy) instead of running the process out
// of memory.
package budget

import "sync/atomic"

// Bytes is a budget of bytes in flight: Acquire reserves, Release gives
// back. The zero value has no room; use New.
type Bytes struct {
	limit int64
	used  atomic.Int64
}

// New returns a budget of limit bytes.
func New(limit int64) *Bytes { return &Bytes{limit: limit} }

// Limit returns the budget's size.
func (b *Bytes) Limit() int64 { return b.limit }

// Used returns the bytes reserved now, for a gauge read at scrape time.
func (b *Bytes) Used() int64 { return b.used.Load() }

// Acquire reserves n bytes (n >= 0), or reports false when that would pass
// the limit.
func (b *Bytes) Acquire(n int64) bool {
	for {
		cur := b.used.Load()
		if n < 0 || cur+n > b.limit {
			return false
		}
		if b.used.CompareAndSwap(cur, cur+n) {
			return true
		}
	}
}

// Release gives back n bytes an Acquire reserved.
func (b *Bytes) Release(n int64) {
	if n > 0 {
		b.used.Add(-n)
	}
}
