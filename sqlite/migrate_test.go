package sqlite

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"

	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem/db/schema"
)

// TestMigrationRaisesReaperThreshold: a tenant stored before the rule
// reaper_threshold_seconds >= lease_seconds_max gets its threshold raised to
// its lease_seconds_max when the store opens; valid tenants are untouched.
func TestMigrationRaisesReaperThreshold(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "idem.db")
	db, err := sql.Open("sqlite", dsn(path))
	require.NoError(t, err)
	provider, err := goose.NewProvider(goose.DialectSQLite3, db, schema.SQLite())
	require.NoError(t, err)
	_, err = provider.UpTo(ctx, 1)
	require.NoError(t, err)
	_, err = db.ExecContext(ctx, `INSERT INTO tenants (id, name, replay_window_seconds, reaper_threshold_seconds,
		lease_seconds_default, lease_seconds_max, max_response_bytes, rate_limit_per_second, created_at, updated_at)
		VALUES ('short', 'short', 2, 3, 30, 60, 1024, 0, 0, 0), ('fine', 'fine', 2, 600, 30, 60, 1024, 0, 0, 0)`)
	require.NoError(t, err)
	require.NoError(t, db.Close())

	s := openStore(t, path, nil)
	short, err := s.GetTenant(ctx, "short")
	require.NoError(t, err)
	require.Equal(t, 60, short.Settings.ReaperThresholdSeconds)
	require.NoError(t, short.Settings.Validate())
	fine, err := s.GetTenant(ctx, "fine")
	require.NoError(t, err)
	require.Equal(t, 600, fine.Settings.ReaperThresholdSeconds)
}
