package postgres

import (
	"sync"
	"time"
)

// completedHints are the keys this Store saw completed (its own completes,
// and replays it answered), each with the end of its replay window. A
// completed record does not change before that end, so for such a key a
// claim asks the cheapest question first: a plain read (GetKey) answers a
// replay or a fingerprint mismatch without ClaimKey's INSERT in the plan
// (no ROW EXCLUSIVE lock on the table, no executor set-up for the write;
// docs/benchmarks.md). A hint is never trusted beyond that: the read
// decides, and anything but a replay or a mismatch on the completed record
// goes on to ClaimKey, so a stale or wrong hint costs one read, never an
// answer. Bounded: two generations of at most hintsPerGeneration keys; a
// full generation becomes the old one and the one before is dropped.
type completedHints struct {
	mu       sync.Mutex
	cur, old map[hintKey]time.Time
}

type hintKey struct{ tenant, key string }

// hintsPerGeneration bounds the hints: about 100 bytes each, two
// generations, a few MiB at most.
const hintsPerGeneration = 16384

func newCompletedHints() *completedHints {
	return &completedHints{cur: make(map[hintKey]time.Time), old: make(map[hintKey]time.Time)}
}

// remember notes that key was completed and replays until until.
func (h *completedHints) remember(tenant, key string, until time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.cur) >= hintsPerGeneration {
		h.old, h.cur = h.cur, make(map[hintKey]time.Time, hintsPerGeneration)
	}
	h.cur[hintKey{tenant, key}] = until
}

// completed reports whether key was seen completed with its replay window
// still running at now (the caller's clock: a hint only).
func (h *completedHints) completed(tenant, key string, now time.Time) bool {
	k := hintKey{tenant, key}
	h.mu.Lock()
	until, ok := h.cur[k]
	if !ok {
		until, ok = h.old[k]
	}
	h.mu.Unlock()
	return ok && now.Before(until)
}

// forget drops key's hint: the read found the key not completed.
func (h *completedHints) forget(tenant, key string) {
	k := hintKey{tenant, key}
	h.mu.Lock()
	delete(h.cur, k)
	delete(h.old, k)
	h.mu.Unlock()
}
