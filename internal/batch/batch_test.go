package batch

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestEachRunsEveryItemAndJoinsErrors: one item's failure neither stops
// nor hides the others; every failure is in the joined error.
func TestEachRunsEveryItemAndJoinsErrors(t *testing.T) {
	t.Parallel()
	errOdd := errors.New("odd")
	var ran atomic.Int64
	err := Each(t.Context(), []int{1, 2, 3, 4, 5}, func(_ context.Context, n int) error {
		ran.Add(int64(n))
		if n%2 == 1 {
			return errOdd
		}
		return nil
	})
	require.Equal(t, int64(15), ran.Load(), "every item ran")
	require.ErrorIs(t, err, errOdd)
	require.Len(t, err.(interface{ Unwrap() []error }).Unwrap(), 3)

	require.NoError(t, Each(t.Context(), []int{}, func(context.Context, int) error { return errOdd }))
}
