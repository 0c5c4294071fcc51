package frontdoor

import (
	"crypto/sha256"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestReplayCacheBounds: the cache never holds more than MaxEntries
// entries nor MaxBytes bytes, drops the least recently used first, never
// keeps an answer over a 16th of MaxBytes or one marked not replayable,
// and serves an entry only to its own operation and document, before its
// deadline.
func TestReplayCacheBounds(t *testing.T) {
	c := NewReplayCache(ReplayCacheOptions{MaxEntries: 100, MaxBytes: 16384})
	now := time.Now()
	doc := sha256.Sum256([]byte("doc"))
	body := []byte(strings.Repeat("x", 200))
	for i := range 50 {
		c.put("t", fmt.Sprint(i), "POST /x", doc, Stored{Status: 201, Body: body}, now.Add(time.Minute))
		st := c.Stats()
		require.LessOrEqual(t, st.Bytes, int64(16384))
		require.LessOrEqual(t, st.Entries, 100)
	}
	st := c.Stats()
	require.Positive(t, st.Evictions)
	_, ok := c.get("t", "0", "POST /x", doc, now)
	require.False(t, ok, "the oldest was evicted")
	_, ok = c.get("t", "49", "POST /x", doc, now)
	require.True(t, ok, "the newest is kept")

	c.put("t", "big", "POST /x", doc, Stored{Status: 201, Body: make([]byte, 16384/16)}, now.Add(time.Minute))
	_, ok = c.get("t", "big", "POST /x", doc, now)
	require.False(t, ok, "over a 16th of MaxBytes")
	c.put("t", "nr", "POST /x", doc, Stored{Status: 502, Headers: map[string]string{HeaderNotReplayable: "x"}}, now.Add(time.Minute))
	_, ok = c.get("t", "nr", "POST /x", doc, now)
	require.False(t, ok, "not replayable")

	c.put("t", "k", "POST /x", doc, Stored{Status: 201}, now.Add(time.Second))
	_, ok = c.get("t", "k", "POST /y", doc, now)
	require.False(t, ok, "another operation")
	_, ok = c.get("t", "k", "POST /x", sha256.Sum256([]byte("other")), now)
	require.False(t, ok, "another document")
	_, ok = c.get("u", "k", "POST /x", doc, now)
	require.False(t, ok, "another tenant")
	_, ok = c.get("t", "k", "POST /x", doc, now)
	require.True(t, ok, "its own request, before the deadline")
	_, ok = c.get("t", "k", "POST /x", doc, now.Add(time.Second))
	require.False(t, ok, "at the deadline")

	c.put("t", "k", "POST /x", doc, Stored{Status: 201}, now.Add(time.Minute))
	c.dropTenant("t")
	require.Zero(t, c.Stats().Entries)

	require.Nil(t, NewReplayCache(ReplayCacheOptions{Off: true}))
	require.Equal(t, MaxReplayCacheMaxAge, NewReplayCache(ReplayCacheOptions{MaxAge: time.Hour}).maxAge)
}

// TestReplayCacheConcurrent runs puts, gets and drops at once (for -race)
// and checks the byte count is the entries' own at the end.
func TestReplayCacheConcurrent(t *testing.T) {
	c := NewReplayCache(ReplayCacheOptions{MaxEntries: 64, MaxBytes: 1 << 16})
	doc := sha256.Sum256([]byte("doc"))
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 500 {
				k := fmt.Sprint((g*7 + i) % 100)
				c.put("t", k, "POST /x", doc, Stored{Status: 201, Body: make([]byte, i%300)}, time.Now().Add(time.Minute))
				c.get("t", k, "POST /x", doc, time.Now())
				if i%97 == 0 {
					c.dropTenant("t")
				}
			}
		})
	}
	wg.Wait()
	var sum int64
	c.mu.Lock()
	for el := c.order.Front(); el != nil; el = el.Next() {
		sum += el.Value.(*cacheEntry).size
	}
	require.Equal(t, len(c.entries), c.order.Len())
	c.mu.Unlock()
	st := c.Stats()
	require.Equal(t, sum, st.Bytes)
	require.LessOrEqual(t, st.Entries, 64)
}
