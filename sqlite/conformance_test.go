package sqlite_test

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/sqlite"
	"github.com/idem-dev/idem/storetest"
)

// TestConformance runs the Store conformance suite against SQLite, each
// subtest with a database file of its own. The shared re-check of waiters
// is pushed out of the way, so the key events under test are the store's
// own (TestEventsFallbackSeesAnotherProcess covers the re-check).
func TestConformance(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(t *testing.T, now func() time.Time) idem.Driver {
		s, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "idem.db"), sqlite.Options{Now: now, EventsFallback: time.Hour})
		require.NoError(t, err, "open sqlite store")
		t.Cleanup(func() { require.NoError(t, s.Close()) })
		return s
	})
}

// TestEventsFallbackSeesAnotherProcess: a completion committed by another
// Store on the same file (as another process would) cannot publish to this
// Store's subscriptions; the shared re-check wakes them within
// EventsFallback, and not before the change.
func TestEventsFallbackSeesAnotherProcess(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "idem.db")
	waiting, err := sqlite.Open(t.Context(), path, sqlite.Options{EventsFallback: 200 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, waiting.Close()) })
	other, err := sqlite.Open(t.Context(), path, sqlite.Options{EventsFallback: time.Hour})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, other.Close()) })

	storetest.CreateTenant(t, other, "acme")
	claim, err := other.Claim(t.Context(), storetest.ClaimParams("acme", "k"))
	require.NoError(t, err)
	sub, err := waiting.Subscribe(t.Context(), "acme", "k")
	require.NoError(t, err)
	defer sub.Close()
	_, err = other.Complete(t.Context(), idem.CompleteParams{TenantID: "acme", Key: "k", FencingToken: claim.Record.FencingToken, Response: idem.Response{Status: 200}})
	require.NoError(t, err)
	select {
	case <-sub.C:
	case <-time.After(5 * time.Second):
		require.FailNow(t, "the re-check did not wake the subscription")
	}
}
