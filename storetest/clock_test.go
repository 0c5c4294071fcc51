package storetest

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestClock(t *testing.T) {
	t.Parallel()
	c := NewClock()
	require.True(t, DefaultStart().Equal(c.Now()))
	require.Zero(t, c.Now().Nanosecond(), "the start must be a whole second")

	c.Advance(1500 * time.Millisecond)
	require.Equal(t, 1500*time.Millisecond, c.Now().Sub(DefaultStart()))

	at := DefaultStart().Add(time.Hour)
	c.Set(at)
	require.True(t, at.Equal(c.Now()))

	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100 {
				c.Advance(time.Millisecond)
				_ = c.Now()
			}
		})
	}
	wg.Wait()
	require.Equal(t, time.Hour+800*time.Millisecond, c.Now().Sub(DefaultStart()))
}
