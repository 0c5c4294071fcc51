package storetest

import (
	"sync"
	"time"
)

// DefaultStart returns the instant a Clock made by NewClock starts at. It is
// a whole second, so every instant the suite reaches by advancing whole
// milliseconds survives the microsecond precision of PostgreSQL.
func DefaultStart() time.Time {
	return time.Date(2026, time.November, 29, 10, 0, 0, 0, time.UTC)
}

// Clock is a fake clock for stores opened with an injected Now. It is safe
// for concurrent use and moves only when told to.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// NewClock returns a Clock set to DefaultStart.
func NewClock() *Clock {
	return &Clock{now: DefaultStart()}
}

// Now returns the clock's current instant.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d (backward when d is negative).
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// Set moves the clock to t.
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
}
