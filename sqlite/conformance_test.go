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
// subtest with a database file of its own.
func TestConformance(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(t *testing.T, now func() time.Time) idem.Store {
		s, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "idem.db"), sqlite.Options{Now: now})
		require.NoError(t, err, "open sqlite store")
		t.Cleanup(func() { require.NoError(t, s.Close()) })
		return s
	})
}
