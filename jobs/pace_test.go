package jobs

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem"
)

// batchStore answers Reap with full batches while it has records left,
// then a short one; each call advances the fake clock by the next of took.
type batchStore struct {
	idem.Driver // only Reap is called
	left        int
	took        []time.Duration
	calls       int
	clock       *time.Time
}

func (s *batchStore) Reap(_ context.Context, p idem.ReapParams) ([]idem.Record, error) {
	*s.clock = s.clock.Add(s.took[s.calls])
	s.calls++
	n := min(p.Limit, s.left)
	s.left -= n
	return make([]idem.Record, n), nil
}

// TestReapPausesInProportionToEachBatch: after every full batch the pass
// rests ReapPause times that batch's duration, after the last (short)
// batch not at all; pacing off means no pause; a shutdown during a pause
// ends the pass before another batch.
func TestReapPausesInProportionToEachBatch(t *testing.T) {
	t.Parallel()
	run := func(pause float64, cancelAt int) (*batchStore, []time.Duration, ReapResult, error) {
		clock := time.Unix(1e9, 0)
		st := &batchStore{left: 25, took: []time.Duration{10 * time.Millisecond, 30 * time.Millisecond, 5 * time.Millisecond}, clock: &clock}
		r := New(st, Config{ReapBatchSize: 10, ReapPause: pause}, nil, nil)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		var slept []time.Duration
		r.now = func() time.Time { return clock }
		r.sleep = func(_ context.Context, d time.Duration) {
			slept = append(slept, d)
			if len(slept) == cancelAt {
				cancel()
			}
		}
		res, err := r.ReapOnce(ctx)
		return st, slept, res, err
	}

	st, slept, res, err := run(DefaultReapPause, 0)
	require.NoError(t, err)
	require.Equal(t, 2.0, DefaultReapPause)
	require.Equal(t, []time.Duration{20 * time.Millisecond, 60 * time.Millisecond}, slept, "two full batches, then a short one")
	require.Equal(t, 3, st.calls)
	require.Equal(t, 25, res.Deleted)

	_, slept, res, err = run(0.5, 0)
	require.NoError(t, err)
	require.Equal(t, []time.Duration{5 * time.Millisecond, 15 * time.Millisecond}, slept)
	require.Equal(t, 25, res.Deleted)

	_, slept, res, err = run(0, 0)
	require.NoError(t, err)
	require.Empty(t, slept, "pacing off")
	require.Equal(t, 25, res.Deleted)

	st, _, res, err = run(DefaultReapPause, 1)
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, 1, st.calls, "no batch after the pause the shutdown ended")
	require.Equal(t, 10, res.Deleted)
}
