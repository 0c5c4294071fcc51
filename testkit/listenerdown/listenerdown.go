// Package listenerdown is a test-side wrapper of a real driver whose
// key-event subscriptions fail while a Switch is down, the store itself
// working: what PostgreSQL's Subscribe does while its one LISTEN
// connection reconnects (it waits for the connection, up to two seconds,
// then answers store_unavailable). SQLite's source never fails that way,
// and PostgreSQL's is hard to hold down on cue without cutting the store
// too, so the tests of a waiting claim whose subscription fails put this
// wrapper around either store (server.WithDriver, servertest's
// Options.WrapDriver). It is for tests only.
package listenerdown

import (
	"context"
	"sync"

	"github.com/idem-dev/idem"
)

// Switch says whether the key-event subscriptions of the drivers wrapped
// with it fail. The zero value is up (subscriptions pass through).
type Switch struct {
	mu      sync.Mutex
	down    chan struct{} // nil while up; closed by Up
	blocked int
}

// Down makes every later Subscribe block until Up (or its context ends),
// then fail with store_unavailable, as PostgreSQL's does when its
// listening connection did not come up in time.
func (s *Switch) Down() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down == nil {
		s.down = make(chan struct{})
	}
}

// Up fails the subscriptions blocked now and lets later ones through.
func (s *Switch) Up() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down != nil {
		close(s.down)
		s.down = nil
	}
}

// Blocked returns how many Subscribe calls are blocked now: tests wait on
// it to know a waiting claim reached its subscription.
func (s *Switch) Blocked() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.blocked
}

// Wrap returns d with its key events held to s.
func Wrap(d idem.Driver, s *Switch) idem.Driver { return driver{Driver: d, sw: s} }

type driver struct {
	idem.Driver
	sw *Switch
}

// KeyEvents returns the driver's source with Subscribe held to the switch
// (nil when the driver has none).
func (d driver) KeyEvents() idem.KeyEvents {
	ev := d.Driver.KeyEvents()
	if ev == nil {
		return nil
	}
	return events{KeyEvents: ev, sw: d.sw}
}

type events struct {
	idem.KeyEvents
	sw *Switch
}

func (e events) Subscribe(ctx context.Context, tenantID, key string) (*idem.Subscription, error) {
	e.sw.mu.Lock()
	down := e.sw.down
	if down == nil {
		e.sw.mu.Unlock()
		return e.KeyEvents.Subscribe(ctx, tenantID, key)
	}
	e.sw.blocked++
	e.sw.mu.Unlock()
	defer func() {
		e.sw.mu.Lock()
		e.sw.blocked--
		e.sw.mu.Unlock()
	}()
	select {
	case <-down:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return nil, idem.StoreUnavailable("the store's listening connection is not up (listenerdown)", nil)
}
