// Package batch runs one batch of a background job's items all at once:
// the completer's attempts and the webhook deliverer's deliveries each
// claim a batch under a lease and must finish every item of it before the
// next pass, whatever the others do.
package batch

import (
	"context"
	"errors"
	"sync"
)

// Each runs do for every item at once, waits for them all, and returns
// their errors joined (nil when none failed). One item's failure does not
// cancel the others: each holds its own lease and reports its own outcome.
func Each[T any](ctx context.Context, items []T, do func(context.Context, T) error) error {
	var wg sync.WaitGroup
	errs := make([]error, len(items))
	for i, item := range items {
		wg.Go(func() { errs[i] = do(ctx, item) })
	}
	wg.Wait()
	return errors.Join(errs...)
}
