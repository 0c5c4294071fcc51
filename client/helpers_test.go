package client_test

import (
	"context"
	"sync"
	"time"

	"github.com/idem-dev/idem/client"
)

// fakeClock is a Clock whose Sleep returns at once and advances Now.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	sleeps []time.Duration
}

func newFakeClock() *fakeClock { return &fakeClock{now: time.Now()} }

func (f *fakeClock) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

func (f *fakeClock) Sleep(ctx context.Context, d time.Duration) error {
	f.mu.Lock()
	f.sleeps = append(f.sleeps, d)
	f.now = f.now.Add(d)
	f.mu.Unlock()
	return ctx.Err()
}

func (f *fakeClock) Sleeps() []time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]time.Duration(nil), f.sleeps...)
}

// attempts collects AttemptInfo from the hook.
type attempts struct {
	mu    sync.Mutex
	infos []client.AttemptInfo
}

func (a *attempts) hook(i client.AttemptInfo) {
	a.mu.Lock()
	a.infos = append(a.infos, i)
	a.mu.Unlock()
}

func (a *attempts) all() []client.AttemptInfo {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]client.AttemptInfo(nil), a.infos...)
}
