package retrybudget

import (
	"slices"
	"strings"
	"time"
)

// The last hour of a tenant: what the budget counted, per minute, so an
// operator sees amplification build up and fade during a fault (the
// dashboard's "Retry amplification" section, GET
// /v1/admin/retry-amplification). Like the window it is this replica's
// alone: behind a load balancer each replica sees about the same share.
const (
	// HistoryBucket is the span of one bucket of the history.
	HistoryBucket = time.Minute
	// HistoryBuckets is how many buckets the history keeps: an hour.
	HistoryBuckets = 60
)

// Bucket is one minute of a tenant's history.
type Bucket struct {
	// Start is the beginning of the minute.
	Start   time.Time
	First   int64 // first attempts
	Retries int64 // retries admitted
	Refused int64 // retries refused
}

// Amplification is attempts per first attempt in the bucket, as
// Stats.Amplification; 0 for a minute without attempts.
func (b Bucket) Amplification() float64 {
	return Stats{First: b.First, Retries: b.Retries, Refused: b.Refused}.Amplification()
}

// History is one tenant's last hour and current window.
type History struct {
	// Window is the tenant's sliding window now, as Snapshot reads it.
	Window Stats
	// Buckets are the HistoryBuckets minutes ending with the current
	// one (still filling), oldest first; a minute without attempts is a
	// bucket of zeros.
	Buckets []Bucket
}

// minuteOf is the bucket number of t.
func minuteOf(t time.Time) int64 { return t.UnixNano() / int64(HistoryBucket) }

// minute returns the bucket of minute m, emptied when it held an older
// minute (the ring holds the last HistoryBuckets minutes).
func (t *tenant) minute(m int64) *counts {
	c := &t.minutes[m%HistoryBuckets]
	if c.span != m {
		*c = counts{span: m}
	}
	return c
}

// seenSince reports whether the tenant has attempts in the hour ending at
// minute m.
func (t *tenant) seenSince(m int64) bool {
	for i := range t.minutes {
		c := &t.minutes[i]
		if c.span > m-HistoryBuckets && c.span <= m && c.first+c.retries+c.refused > 0 {
			return true
		}
	}
	return false
}

// history reads the tenant's last hour ending at minute m and its window
// ending at span. Called with b.mu held; t may be nil (never seen).
func (t *tenant) history(id string, span, m int64) History {
	h := History{Window: Stats{Tenant: id}, Buckets: make([]Bucket, HistoryBuckets)}
	for i := range h.Buckets {
		at := m - HistoryBuckets + 1 + int64(i)
		h.Buckets[i].Start = time.Unix(0, at*int64(HistoryBucket)).UTC()
		if t == nil {
			continue
		}
		if c := &t.minutes[at%HistoryBuckets]; c.span == at {
			h.Buckets[i].First, h.Buckets[i].Retries, h.Buckets[i].Refused = c.first, c.retries, c.refused
		}
	}
	if t != nil {
		h.Window.First, h.Window.Retries, h.Window.Refused = t.sum(span)
	}
	return h
}

// History returns tenant id's last hour; all zeros for a tenant this
// replica has not seen in the hour.
func (b *Budget) History(id string) History {
	now := b.now()
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.tenants[id].history(id, now.UnixNano()/int64(b.slot), minuteOf(now))
}

// Histories returns the last hour of every tenant with attempts in it,
// ordered by tenant id.
func (b *Budget) Histories() []History {
	now := b.now()
	span, m := now.UnixNano()/int64(b.slot), minuteOf(now)
	b.mu.Lock()
	out := make([]History, 0, len(b.tenants))
	for id, t := range b.tenants {
		if t.seenSince(m) {
			out = append(out, t.history(id, span, m))
		}
	}
	b.mu.Unlock()
	slices.SortFunc(out, func(x, y History) int { return strings.Compare(x.Window.Tenant, y.Window.Tenant) })
	return out
}
