package sqlite

import (
	"context"
	"database/sql"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/db/schema"
	"github.com/idem-dev/idem/storetest"
)

// TestMigrationRaisesReaperThreshold: a tenant stored before the rule
// reaper_threshold_seconds >= lease_seconds_max gets its threshold raised to
// its lease_seconds_max when the store opens; valid tenants are untouched.
func TestMigrationRaisesReaperThreshold(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "idem.db")
	require.NoError(t, os.WriteFile(path, nil, 0o600)) // dsn never creates the file
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
	short, err := s.GetTenant(ctx, idem.GetTenantParams{ID: "short"})
	require.NoError(t, err)
	require.Equal(t, 60, short.Settings.ReaperThresholdSeconds)
	require.NoError(t, short.Settings.Validate())
	fine, err := s.GetTenant(ctx, idem.GetTenantParams{ID: "fine"})
	require.NoError(t, err)
	require.Equal(t, 600, fine.Settings.ReaperThresholdSeconds)
	require.Equal(t, idem.DefaultMaxWaitSeconds, fine.Settings.MaxWaitSeconds, "tenants stored before max_wait_seconds get the default")
}

// TestMigrationsDownAndUp: every migration can be undone and applied again,
// so an operator can roll a release back.
func TestMigrationsDownAndUp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "idem.db")
	require.NoError(t, os.WriteFile(path, nil, 0o600))
	db, err := sql.Open("sqlite", dsn(path))
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	provider, err := goose.NewProvider(goose.DialectSQLite3, db, schema.SQLite())
	require.NoError(t, err)
	_, err = provider.Up(ctx)
	require.NoError(t, err)
	_, err = provider.DownTo(ctx, 0)
	require.NoError(t, err)
	_, err = provider.Up(ctx)
	require.NoError(t, err)
	version, err := provider.GetDBVersion(ctx)
	require.NoError(t, err)
	sources := provider.ListSources()
	require.Equal(t, sources[len(sources)-1].Version, version)
}

// TestRequireLedgerAndFileIdentity: with RequireLedger, Open refuses a
// missing or empty file and creates nothing; once open, a deleted or
// replaced file makes Ping and writes store_unavailable (reads of the opened
// file still work), and the file put back heals the store.
func TestRequireLedgerAndFileIdentity(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "idem.db")
	_, err := Open(ctx, path, Options{RequireLedger: true})
	require.ErrorIs(t, err, idem.ErrNoLedger)
	_, statErr := os.Stat(path)
	require.ErrorIs(t, statErr, fs.ErrNotExist, "Open created the file while refusing")
	require.NoError(t, os.WriteFile(path, nil, 0o600))
	_, err = Open(ctx, path, Options{RequireLedger: true})
	require.ErrorIs(t, err, idem.ErrNoLedger, "an empty file holds no ledger")

	require.NoError(t, Migrate(ctx, path))
	s, err := Open(ctx, path, Options{RequireLedger: true})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	storetest.CreateTenant(t, s, "acme")
	require.NoError(t, s.Ping(ctx))

	keep := path + ".keep"
	require.NoError(t, os.Link(path, keep))
	require.NoError(t, os.Remove(path))
	requireUnavailable := func(err error) {
		t.Helper()
		require.ErrorIs(t, err, idem.ErrStoreUnavailable)
	}
	requireUnavailable(s.Ping(ctx))
	_, err = s.Claim(ctx, storetest.ClaimParams("acme", "k"))
	requireUnavailable(err)
	_, err = s.Reap(ctx, idem.ReapParams{Limit: 10})
	requireUnavailable(err)
	_, err = s.CreateTenant(ctx, idem.CreateTenantParams{ID: "beta", Name: "beta", Settings: idem.DefaultSettings()})
	requireUnavailable(err)
	_, err = s.GetTenant(ctx, idem.GetTenantParams{ID: "acme"})
	require.NoError(t, err, "reads of the opened file go on")
	_, statErr = os.Stat(path)
	require.ErrorIs(t, statErr, fs.ErrNotExist, "the pool re-created the deleted file")

	require.NoError(t, os.Rename(keep, path))
	require.NoError(t, s.Ping(ctx))
	_, err = s.Claim(ctx, storetest.ClaimParams("acme", "k"))
	require.NoError(t, err)
}

// TestAttemptIDAfterMigrationsDownAndUp: after every migration went down
// and up again, a claim keeps its attempt id.
func TestAttemptIDAfterMigrationsDownAndUp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "idem.db")
	require.NoError(t, Migrate(ctx, path))
	db, err := sql.Open("sqlite", dsn(path))
	require.NoError(t, err)
	defer db.Close()
	provider, err := goose.NewProvider(goose.DialectSQLite3, db, schema.SQLite())
	require.NoError(t, err)
	_, err = provider.DownTo(ctx, 0)
	require.NoError(t, err)
	_, err = provider.Up(ctx)
	require.NoError(t, err)
	s := openStore(t, path, nil)
	storetest.CreateTenant(t, s, "acme")
	p := storetest.ClaimParams("acme", "k")
	p.AttemptID = "att-1"
	res, err := s.Claim(ctx, p)
	require.NoError(t, err)
	require.Equal(t, "att-1", res.Record.AttemptID)
}

// TestMigrationCountsStoredBytes: the records stored before the storage
// quota are counted when the store opens (migration 00012: each record's
// stored_bytes and its tenant's usage, as Record.StoredBytes counts them,
// multi-byte text and response headers included), every tenant gets the
// default quota, and later writes count from there.
func TestMigrationCountsStoredBytes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "idem.db")
	require.NoError(t, os.WriteFile(path, nil, 0o600))
	db, err := sql.Open("sqlite", dsn(path))
	require.NoError(t, err)
	provider, err := goose.NewProvider(goose.DialectSQLite3, db, schema.SQLite())
	require.NoError(t, err)
	_, err = provider.UpTo(ctx, 11)
	require.NoError(t, err)
	_, err = db.ExecContext(ctx, `INSERT INTO tenants (id, name, replay_window_seconds, reaper_threshold_seconds,
		lease_seconds_default, lease_seconds_max, max_response_bytes, rate_limit_per_second, created_at, updated_at)
		VALUES ('acme', 'acme', 86400, 259200, 30, 3600, 1048576, 0, 0, 0), ('empty', 'empty', 86400, 259200, 30, 3600, 1048576, 0, 0, 0)`)
	require.NoError(t, err)
	_, err = db.ExecContext(ctx, `INSERT INTO idempotency_keys (tenant_id, key, state, operation, fingerprint, fencing_token, attempt,
		lease_expires_at, recovery_point, recovery_data, response_status, response_headers, response_body, response_body_encoding,
		replay_window_seconds, reaper_threshold_seconds, created_at, updated_at, completed_at, replay_until, purge_after) VALUES
		('acme', 'flight-é', 'in_flight', 'POST /v1/payments', 'sha256:aa', 1, 1, 9000000000000000, 'charged', CAST('{"id":"ch_é"}' AS BLOB),
			NULL, NULL, NULL, NULL, 86400, 259200, 0, 0, NULL, NULL, 9000000000000000),
		('acme', 'done', 'completed', 'POST /v1/payments', 'sha256:bb', 2, 1, NULL, NULL, NULL,
			201, '{"Content-Type":"application/json","X-Note":"naïve \"q\""}', X'7b226964223a226f72645f31227d', 'utf8',
			86400, 259200, 0, 0, 0, 9000000000000000, 9000000000000000)`)
	require.NoError(t, err)
	require.NoError(t, db.Close())

	s := openStore(t, path, nil)
	storetest.RequireMigratedUsage(t, s)
}
