package sqlite

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/storetest"
)

// TestQueuedWriterHonoursContext holds the writer slot and checks that
// writers waiting for it give up when their context ends, with the same
// errors a context ending inside BeginTx gives (a deadline is
// store_unavailable, a cancellation is the context's error), and that the
// slot serves writers again once it is given back.
func TestQueuedWriterHonoursContext(t *testing.T) {
	t.Parallel()
	b := setup(t)
	storetest.CreateTenant(t, b.store, "acme")
	require.NoError(t, b.store.lockWriter(context.Background()))

	deadline, cancelDeadline := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancelDeadline()
	_, err := b.store.Claim(deadline, storetest.ClaimParams("acme", "k"))
	var ie *idem.Error
	require.True(t, errors.As(err, &ie), "got %v", err)
	require.Equal(t, idem.CodeStoreUnavailable, ie.Code)

	canceled, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := b.store.CreateTenant(canceled, idem.CreateTenantParams{ID: "beta", Name: "beta", Settings: idem.DefaultSettings()})
		done <- err
	}()
	cancel()
	err = <-done
	require.ErrorIs(t, err, context.Canceled)
	_, err = b.store.GetTenant(context.Background(), "beta")
	require.True(t, errors.As(err, &ie) && ie.Code == idem.CodeTenantNotFound, "got %v", err)

	_, err = b.store.Reap(canceled, idem.ReapParams{Limit: 10})
	require.ErrorIs(t, err, context.Canceled)

	b.store.unlockWriter()
	res, err := b.store.Claim(context.Background(), storetest.ClaimParams("acme", "k"))
	require.NoError(t, err)
	require.Equal(t, idem.ActionCreate, res.Action)
}
