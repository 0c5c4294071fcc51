package frontdoor

import (
	"container/list"
	"crypto/sha256"
	"errors"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// The replay cache (docs/frontdoor.md, "The replay cache"). A completed
// record is immutable until its replay window ends: idem never completes a
// key twice (fencing), never releases or resolves a completed one
// (already_completed), and keeps it until replay_until. So the answer idem
// gave one request for a key is the answer it gives every later request
// with the same key, operation and fingerprint document until then, and a
// front door may give it itself, without a call. What idem can still
// change meanwhile is the tenant: deleted (its records with it) or
// disabled, a replay becomes 403 tenant_unknown. The cache sees that
// within MaxAge: an entry lives no longer than MaxAge from the claim that
// brought it, and never past the record's replay_until.
//
// What is cached, and only that: the stored response of a replay idem
// answered (never the answer of a run this front door stored itself: what
// idem replays is what is then known to be stored, whole), not one marked
// not replayable, keyed by the tenant, the record key (scope included) and
// the operation, and matched on the SHA-256 of the exact fingerprint
// document sent with the claim: a request whose document differs by a
// byte goes to idem, which answers it (422 fingerprint_mismatch, or a
// replay when its canonical form is the same). A request with Prefer:
// wait=N also goes to idem: idem's answer then carries Preference-Applied,
// which the cache cannot know.
//
// The LRU is a list and a map rather than a library: it bounds bytes as
// well as entries, and client/ (the SDK module) has no dependency at run
// time.

// ReplayCacheOptions configure a front door's replay cache. The zero value
// is the default: on, DefaultReplayCacheEntries entries,
// DefaultReplayCacheBytes bytes, DefaultReplayCacheMaxAge.
type ReplayCacheOptions struct {
	// Off turns the cache off: every replay is a call to idem.
	Off bool
	// MaxEntries bounds the entries (default DefaultReplayCacheEntries).
	MaxEntries int
	// MaxBytes bounds the bytes the entries hold: stored headers, body and
	// key (default DefaultReplayCacheBytes). A response over a 16th of it
	// is not cached.
	MaxBytes int64
	// MaxAge is the longest an entry is served, from the claim that
	// brought it (default DefaultReplayCacheMaxAge, at most
	// MaxReplayCacheMaxAge): how long a tenant deleted or disabled may
	// still see its completed keys replayed by this front door.
	MaxAge time.Duration
}

// The replay cache's defaults and bound.
const (
	DefaultReplayCacheEntries = 4096
	DefaultReplayCacheBytes   = 8 << 20
	DefaultReplayCacheMaxAge  = 2 * time.Second
	MaxReplayCacheMaxAge      = time.Minute
)

// ReplayCache is a bounded LRU of completed answers. Its methods are safe
// for concurrent use; a nil *ReplayCache is a cache that is off.
type ReplayCache struct {
	maxEntries int
	maxBytes   int64
	maxEntry   int64
	maxAge     time.Duration

	mu      sync.Mutex
	order   *list.List // of *cacheEntry, most recently used first
	entries map[cacheKey]*list.Element
	bytes   int64

	hits, misses, stores, evictions atomic.Int64
}

type cacheKey struct{ tenant, key string }

type cacheEntry struct {
	k         cacheKey
	operation string
	doc       [sha256.Size]byte
	resp      Stored
	until     time.Time // this host's monotonic clock
	size      int64
}

// NewReplayCache returns a cache with o's bounds, nil when o.Off.
func NewReplayCache(o ReplayCacheOptions) *ReplayCache {
	if o.Off {
		return nil
	}
	if o.MaxEntries <= 0 {
		o.MaxEntries = DefaultReplayCacheEntries
	}
	if o.MaxBytes <= 0 {
		o.MaxBytes = DefaultReplayCacheBytes
	}
	if o.MaxAge <= 0 {
		o.MaxAge = DefaultReplayCacheMaxAge
	}
	o.MaxAge = min(o.MaxAge, MaxReplayCacheMaxAge)
	return &ReplayCache{maxEntries: o.MaxEntries, maxBytes: o.MaxBytes, maxEntry: max(o.MaxBytes/16, 1), maxAge: o.MaxAge,
		order: list.New(), entries: map[cacheKey]*list.Element{}}
}

// ReplayCacheStats are a cache's counters and its size now.
type ReplayCacheStats struct {
	// Hits are replays answered from the cache; Misses lookups that went
	// to idem (no entry, another document or operation, or expired).
	Hits, Misses int64
	// Stores are replays of idem put in the cache; Evictions entries
	// dropped for room (not for age).
	Stores, Evictions int64
	Entries           int
	Bytes             int64
}

// Stats returns the cache's counters (zero for a nil cache).
func (c *ReplayCache) Stats() ReplayCacheStats {
	if c == nil {
		return ReplayCacheStats{}
	}
	c.mu.Lock()
	n, b := c.order.Len(), c.bytes
	c.mu.Unlock()
	return ReplayCacheStats{Hits: c.hits.Load(), Misses: c.misses.Load(), Stores: c.stores.Load(),
		Evictions: c.evictions.Load(), Entries: n, Bytes: b}
}

// get returns the stored response for exactly this request, if one is
// cached and still valid at now.
func (c *ReplayCache) get(tenant, key, operation string, doc [sha256.Size]byte, now time.Time) (Stored, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.entries[cacheKey{tenant, key}]
	if !ok {
		c.misses.Add(1)
		return Stored{}, false
	}
	e := el.Value.(*cacheEntry)
	if !now.Before(e.until) {
		c.remove(el)
		c.misses.Add(1)
		return Stored{}, false
	}
	if e.operation != operation || e.doc != doc {
		// Another request with the key: idem answers it (a mismatch).
		// The entry stays, valid for its own request.
		c.misses.Add(1)
		return Stored{}, false
	}
	c.order.MoveToFront(el)
	c.hits.Add(1)
	return e.resp, true
}

// put caches resp for the request until until, evicting the least
// recently used entries for room. A response too large for the cache, or
// marked not replayable, is not cached.
func (c *ReplayCache) put(tenant, key, operation string, doc [sha256.Size]byte, resp Stored, until time.Time) {
	if _, ok := resp.Headers[HeaderNotReplayable]; ok {
		return
	}
	size := int64(len(tenant) + len(key) + len(operation) + len(resp.Body) + 128)
	for k, v := range resp.Headers {
		size += int64(len(k) + len(v) + 16)
	}
	if size > c.maxEntry {
		return
	}
	// A copy: the entry outlives the answer it came with.
	kept := Stored{Status: resp.Status, Headers: make(map[string]string, len(resp.Headers)), Body: append([]byte(nil), resp.Body...)}
	for k, v := range resp.Headers {
		kept.Headers[k] = v
	}
	k := cacheKey{tenant, key}
	e := &cacheEntry{k: k, operation: operation, doc: doc, resp: kept, until: until, size: size}
	c.mu.Lock()
	defer c.mu.Unlock()
	if old, ok := c.entries[k]; ok {
		c.remove(old)
	}
	c.entries[k] = c.order.PushFront(e)
	c.bytes += size
	c.stores.Add(1)
	for c.order.Len() > c.maxEntries || c.bytes > c.maxBytes {
		c.remove(c.order.Back())
		c.evictions.Add(1)
	}
}

// dropTenant drops every entry of tenant: idem refused it (tenant_unknown),
// so its replays are refused too from now on.
func (c *ReplayCache) dropTenant(tenant string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, el := range c.entries {
		if k.tenant == tenant {
			c.remove(el)
		}
	}
}

// remove drops el; c.mu is held.
func (c *ReplayCache) remove(el *list.Element) {
	e := c.order.Remove(el).(*cacheEntry)
	delete(c.entries, e.k)
	c.bytes -= e.size
}

// ReplayCacher is a Door with a replay cache: Serve answers a replay from
// it before claiming (serveCached) and fills it from idem's replays
// (cacheReplay). A Door that is not one claims every request.
type ReplayCacher interface {
	// ReplayCache returns the door's cache (nil: off) and the tenant whose
	// records its keys are.
	ReplayCache() (cache *ReplayCache, tenant string)
	// CachedReplay is told of a replay answered from the cache, before it
	// is written (the door's outcome and metrics).
	CachedReplay(r *http.Request)
}

// cacheLookup is the request's place in the door's replay cache: nil when
// the door has none.
type cacheLookup struct {
	c         *ReplayCache
	tenant    string
	key, op   string
	doc       [sha256.Size]byte
	claimedAt time.Time
}

// lookupFor returns the cache lookup of a request of d, nil without a
// cache.
func lookupFor(d Door, key, op string, doc []byte) *cacheLookup {
	rc, ok := d.(ReplayCacher)
	if !ok {
		return nil
	}
	c, tenant := rc.ReplayCache()
	if c == nil {
		return nil
	}
	return &cacheLookup{c: c, tenant: tenant, key: key, op: op, doc: sha256.Sum256(doc)}
}

// serveCached answers r from the cache when it holds the answer of exactly
// this request, and reports whether it did. A request with Prefer: wait=N
// is not: idem's answer to it carries Preference-Applied.
func serveCached(w http.ResponseWriter, r *http.Request, d Door, l *cacheLookup) bool {
	if l == nil {
		return false
	}
	if PreferWait(r.Header.Values("Prefer")) > 0 {
		return false
	}
	s, ok := l.c.get(l.tenant, l.key, l.op, l.doc, time.Now())
	if !ok {
		return false
	}
	d.(ReplayCacher).CachedReplay(r)
	WriteReplay(w, r, s.Status, s.Headers, s.Body)
	return true
}

// startClaim notes the time before the claim: an entry's life is counted
// from it, so it ends no later than the replay window idem saw.
func (l *cacheLookup) startClaim() {
	if l != nil {
		l.claimedAt = time.Now()
	}
}

// cacheReplay keeps idem's replay c for the request: until the replay
// window idem saw ends (c.ReplayLeft from before the claim was sent) and
// no longer than the cache's MaxAge. A replay without ReplayLeft is not
// kept.
func (l *cacheLookup) cacheReplay(c *Claimed) {
	if l == nil || c.Replay == nil || c.ReplayLeft <= 0 {
		return
	}
	l.c.put(l.tenant, l.key, l.op, l.doc, *c.Replay, l.claimedAt.Add(min(c.ReplayLeft, l.c.maxAge)))
}

// refused drops the tenant's entries when idem refused it (tenant_unknown:
// deleted or disabled): its completed keys are not replayed from now on.
func (l *cacheLookup) refused(err error) {
	var e *Error
	if l != nil && errors.As(err, &e) && e.Code == CodeTenantUnknown {
		l.c.dropTenant(l.tenant)
	}
}
