package postgres

import (
	"context"
	"database/sql"
	"testing"

	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" database/sql driver
	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/db/schema"
	"github.com/idem-dev/idem/storetest"
	"github.com/idem-dev/idem/testkit/pgtest"
)

// TestMigrationRaisesReaperThreshold: a tenant stored before the rule
// reaper_threshold_seconds >= lease_seconds_max gets its threshold raised to
// its lease_seconds_max when the store opens; valid tenants are untouched.
func TestMigrationRaisesReaperThreshold(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := pgtest.URL(t)
	db, err := sql.Open("pgx", dsn)
	require.NoError(t, err)
	provider, err := goose.NewProvider(goose.DialectPostgres, db, schema.Postgres(), goose.WithDisableGlobalRegistry(true))
	require.NoError(t, err)
	_, err = provider.UpTo(ctx, 1)
	require.NoError(t, err)
	_, err = db.ExecContext(ctx, `INSERT INTO tenants (id, name, replay_window_seconds, reaper_threshold_seconds,
		lease_seconds_default, lease_seconds_max, max_response_bytes, rate_limit_per_second, created_at, updated_at)
		VALUES ('short', 'short', 2, 3, 30, 60, 1024, 0, now(), now()), ('fine', 'fine', 2, 600, 30, 60, 1024, 0, now(), now())`)
	require.NoError(t, err)
	require.NoError(t, db.Close())

	s, err := Open(ctx, dsn, Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
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
	dsn := pgtest.URL(t)
	db, err := sql.Open("pgx", dsn)
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	provider, err := goose.NewProvider(goose.DialectPostgres, db, schema.Postgres(), goose.WithDisableGlobalRegistry(true))
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

// TestAttemptIDAfterMigrationsDownAndUp: after every migration went down
// and up again, a claim keeps its attempt id.
func TestAttemptIDAfterMigrationsDownAndUp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := pgtest.URL(t)
	require.NoError(t, Migrate(ctx, dsn))
	db, err := sql.Open("pgx", dsn)
	require.NoError(t, err)
	defer db.Close()
	provider, err := goose.NewProvider(goose.DialectPostgres, db, schema.Postgres(), goose.WithDisableGlobalRegistry(true))
	require.NoError(t, err)
	_, err = provider.DownTo(ctx, 0)
	require.NoError(t, err)
	_, err = provider.Up(ctx)
	require.NoError(t, err)
	s, err := Open(ctx, dsn, Options{RequireLedger: true})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
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
	dsn := pgtest.URL(t)
	db, err := sql.Open("pgx", dsn)
	require.NoError(t, err)
	provider, err := goose.NewProvider(goose.DialectPostgres, db, schema.Postgres(), goose.WithDisableGlobalRegistry(true))
	require.NoError(t, err)
	_, err = provider.UpTo(ctx, 11)
	require.NoError(t, err)
	_, err = db.ExecContext(ctx, `INSERT INTO tenants (id, name, replay_window_seconds, reaper_threshold_seconds,
		lease_seconds_default, lease_seconds_max, max_response_bytes, rate_limit_per_second, created_at, updated_at)
		VALUES ('acme', 'acme', 86400, 259200, 30, 3600, 1048576, 0, now(), now()), ('empty', 'empty', 86400, 259200, 30, 3600, 1048576, 0, now(), now())`)
	require.NoError(t, err)
	_, err = db.ExecContext(ctx, `INSERT INTO idempotency_keys (tenant_id, key, state, operation, fingerprint, fencing_token, attempt,
		lease_expires_at, recovery_point, recovery_data, response_status, response_headers, response_body, response_body_encoding,
		replay_window_seconds, reaper_threshold_seconds, created_at, updated_at, completed_at, replay_until, purge_after) VALUES
		('acme', 'flight-é', 'in_flight', 'POST /v1/payments', 'sha256:aa', 1, 1, now() + interval '1 hour', 'charged', '{"id":"ch_é"}',
			NULL, NULL, NULL, NULL, 86400, 259200, now(), now(), NULL, NULL, now() + interval '3 days'),
		('acme', 'done', 'completed', 'POST /v1/payments', 'sha256:bb', 2, 1, NULL, NULL, NULL,
			201, '{"Content-Type":"application/json","X-Note":"naïve \"q\""}', '\x7b226964223a226f72645f31227d', 'utf8',
			86400, 259200, now(), now(), now(), now() + interval '1 day', now() + interval '3 days')`)
	require.NoError(t, err)
	require.NoError(t, db.Close())

	s, err := Open(ctx, dsn, Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	storetest.RequireMigratedUsage(t, s)
}

// TestTenantUsageRowsSpread: a tenant's 64 usage counter rows do not share
// one heap page (migration 00017): every claim and complete of the tenant
// updates one of them and a complete sums them all, and on one page that
// contention was the quota's cost (docs/benchmarks.md). It holds for the
// rows of a tenant made before the migration (rewritten by it) and for a
// tenant made after (the fillfactor), and the tenants' usage is unchanged.
func TestTenantUsageRowsSpread(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := pgtest.URL(t)
	db, err := sql.Open("pgx", dsn)
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	provider, err := goose.NewProvider(goose.DialectPostgres, db, schema.Postgres(), goose.WithDisableGlobalRegistry(true))
	require.NoError(t, err)
	_, err = provider.UpTo(ctx, 16)
	require.NoError(t, err)
	_, err = db.ExecContext(ctx, `INSERT INTO tenants (id, name, replay_window_seconds, reaper_threshold_seconds,
		lease_seconds_default, lease_seconds_max, max_response_bytes, rate_limit_per_second, created_at, updated_at)
		VALUES ('before-a', 'a', 86400, 259200, 30, 3600, 1048576, 0, now(), now()),
			('before-b', 'b', 86400, 259200, 30, 3600, 1048576, 0, now(), now())`)
	require.NoError(t, err)
	// pages holding a tenant's counter rows
	pages := func(tenant string) int {
		var n int
		require.NoError(t, db.QueryRowContext(ctx, `SELECT count(DISTINCT (ctid::text::point)[0]) FROM tenant_usage
			WHERE tenant_id = $1`, tenant).Scan(&n))
		return n
	}
	require.Equal(t, 1, pages("before-a"), "before the migration a tenant's slots share one page")
	_, err = db.ExecContext(ctx, `UPDATE tenant_usage SET stored_bytes = slot + 1 WHERE tenant_id = 'before-a'`)
	require.NoError(t, err)

	_, err = provider.Up(ctx)
	require.NoError(t, err)
	_, err = db.ExecContext(ctx, `INSERT INTO tenants (id, name, replay_window_seconds, reaper_threshold_seconds,
		lease_seconds_default, lease_seconds_max, max_response_bytes, rate_limit_per_second, created_at, updated_at)
		VALUES ('after', 'after', 86400, 259200, 30, 3600, 1048576, 0, now(), now())`)
	require.NoError(t, err)
	for _, tenant := range []string{"before-a", "before-b", "after"} {
		require.GreaterOrEqual(t, pages(tenant), 4, "tenant %s: its 64 slots spread over pages", tenant)
		var slots int
		require.NoError(t, db.QueryRowContext(ctx, `SELECT count(*) FROM tenant_usage WHERE tenant_id = $1`, tenant).Scan(&slots))
		require.Equal(t, 64, slots, tenant)
	}
	var used int64
	require.NoError(t, db.QueryRowContext(ctx, `SELECT sum(stored_bytes) FROM tenant_usage WHERE tenant_id = 'before-a'`).Scan(&used))
	require.Equal(t, int64(64*65/2), used, "the rewrite keeps every counter")
}
