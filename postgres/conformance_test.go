package postgres_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/postgres"
	"github.com/idem-dev/idem/storetest"
	"github.com/idem-dev/idem/testkit/pgtest"
)

// TestConformance runs the Store conformance suite against PostgreSQL, each
// subtest in a schema of its own.
func TestConformance(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(t *testing.T, now func() time.Time) idem.Driver {
		s, err := postgres.Open(t.Context(), pgtest.URL(t), postgres.Options{Now: now})
		require.NoError(t, err, "open postgres store")
		t.Cleanup(func() { require.NoError(t, s.Close()) })
		return s
	})
}
