// Package budget is a budget of bytes held in memory across requests, the
// one the API server (package api) and the gateway both charge request
// bodies and answers against, so that many large or slow bodies at once
// are refused (503 server_busy) instead of running the process out of
// memory, and so that one owner of requests (a tenant at the API, a caller
// at the gateway) cannot take the whole budget from the others.
package budget

import (
	"math"
	"sync"
	"sync/atomic"
)

// DefaultShare is the part of the budget each owner may always hold unless
// the operator says otherwise (IDEM_INFLIGHT_SHARE): half, like the store
// connections (storemw.DefaultStoreShare) and the waiter places.
const DefaultShare = 0.5

// Bytes is a budget of bytes in flight: Acquire reserves, Release gives
// back. The zero value has no room; use New or NewShared.
//
// A budget with shares (NewShared) also counts what each owner holds. An
// owner may always hold its share; past it a reservation still succeeds
// while the bytes in flight of all owners, its own included, leave a whole
// share free. So an owner alone uses all of the budget but one share, and
// whatever one owner holds (a slow body, an answer its client does not
// read) the others always find a share: without it, two requests declaring
// a large body and sending it one byte at a time refused every other
// tenant's requests until the read timeout. The bytes the owner "" charges
// count in the total only (the operator's requests at the API).
type Bytes struct {
	limit int64
	used  atomic.Int64
	// share is what one owner may always hold; 0 when the budget has no
	// shares. borrow is the most bytes in flight, in total, with which an
	// owner past its share may still reserve more: limit − share. Both
	// change only under mu (SetShare).
	share, borrow int64

	// mu guards owners and the fields above: a reservation's check of its
	// owner's and the total's bytes and their update are one step. The
	// section is a map lookup, so the lock is held for tens of
	// nanoseconds.
	mu sync.Mutex
	// owners maps an owner to the bytes it holds. An owner that holds
	// nothing keeps its entry (deleting and adding it back on every
	// request cost more than the rest of a reservation) until the map
	// reaches sweepAt entries; then those holding nothing are dropped and
	// sweepAt doubles past what is left, so owners the gateway sees once
	// (client addresses) do not pile up, and the sweeps cost O(1) per
	// reservation over time.
	owners  map[string]int64
	sweepAt int
}

// minSweep is the fewest entries at which owners holding nothing are
// dropped: far more tenants than a server has, few enough to scan in
// microseconds.
const minSweep = 1024

// New returns a budget of limit bytes without shares.
func New(limit int64) *Bytes { return &Bytes{limit: limit} }

// NewShared returns a budget of limit bytes of which each owner may always
// hold share bytes (see Bytes). share <= 0 or share >= limit gives a
// budget without shares.
func NewShared(limit, share int64) *Bytes {
	b := &Bytes{limit: limit, owners: make(map[string]int64), sweepAt: minSweep}
	b.SetShare(share)
	return b
}

// ShareOf returns the share of each owner in a budget of limit bytes:
// fraction of it, rounded up, and at least largest (the most one request
// may hold), so that a request of the largest size is never refused to an
// owner holding nothing while the budget has room for it. A fraction of 1
// or more, or a share at the limit, is limit: no shares.
func ShareOf(limit int64, fraction float64, largest int64) int64 {
	if fraction >= 1 {
		return limit
	}
	share := int64(math.Ceil(float64(limit)*fraction - 1e-9))
	return min(max(share, largest, 1), limit)
}

// SetShare changes the share of each owner of a budget made by NewShared
// (the gateway's largest request changes with its configuration); the
// bytes held stay counted. On a budget made by New it does nothing.
func (b *Bytes) SetShare(share int64) {
	if b.owners == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if share <= 0 || share >= b.limit {
		share = 0
	}
	b.share, b.borrow = share, b.limit-share
}

// Limit returns the budget's size.
func (b *Bytes) Limit() int64 { return b.limit }

// Share returns the share of each owner, or 0 when the budget has none.
func (b *Bytes) Share() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.share
}

// Used returns the bytes reserved now, for a gauge read at scrape time.
func (b *Bytes) Used() int64 { return b.used.Load() }

// Acquire reserves n bytes (n >= 0) for owner, or reports false when that
// would pass the limit, or pass owner's share while the budget would no
// longer keep a share free. A budget without shares takes no lock.
func (b *Bytes) Acquire(owner string, n int64) bool {
	if n < 0 {
		return false
	}
	if b.owners == nil {
		for {
			cur := b.used.Load()
			if cur+n > b.limit {
				return false
			}
			if b.used.CompareAndSwap(cur, cur+n) {
				return true
			}
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	total := b.used.Load() + n
	if total > b.limit {
		return false
	}
	if b.share > 0 && owner != "" {
		cur, known := b.owners[owner]
		held := cur + n
		if held > b.share && total > b.borrow {
			return false
		}
		if !known && len(b.owners) >= b.sweepAt {
			b.sweep()
		}
		b.owners[owner] = held
	}
	b.used.Add(n)
	return true
}

// Release gives back n bytes an Acquire reserved for owner.
func (b *Bytes) Release(owner string, n int64) {
	if n <= 0 {
		return
	}
	if b.owners == nil {
		b.used.Add(-n)
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.used.Add(-n)
	if held, ok := b.owners[owner]; ok {
		b.owners[owner] = max(held-n, 0)
	}
}

// sweep drops the owners holding nothing and sets the size of the next
// sweep; mu is held.
func (b *Bytes) sweep() {
	for o, held := range b.owners {
		if held == 0 {
			delete(b.owners, o)
		}
	}
	b.sweepAt = max(2*len(b.owners), minSweep)
}

// Held returns the bytes owner holds now (0 on a budget without shares).
func (b *Bytes) Held(owner string) int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.owners[owner]
}
