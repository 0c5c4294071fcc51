package sqlite

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
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
	path, db, _ := migratedTo(ctx, t, 1)
	_, err := db.ExecContext(ctx, `INSERT INTO tenants (id, name, replay_window_seconds, reaper_threshold_seconds,
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
	_, _, provider := migratedTo(ctx, t, -1)
	_, err := provider.DownTo(ctx, 0)
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
	path, db, _ := migratedTo(ctx, t, 11)
	_, err := db.ExecContext(ctx, `INSERT INTO tenants (id, name, replay_window_seconds, reaper_threshold_seconds,
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

// TestMigrationPutsLargeKeyColumnsLast: migration 00018 rebuilds
// idempotency_keys with the large columns last, and every record comes
// through byte for byte (every column, a 200 KB binary body over overflow
// pages, an empty body apart from none, multi-byte text), as do the
// tenants' usage, the indexes, the triggers and the foreign key; its Down
// gives back the table of 00017 with the same records; the counting
// triggers count the writes after it.
func TestMigrationPutsLargeKeyColumnsLast(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path, db, provider := migratedTo(ctx, t, 17)
	_, err := db.ExecContext(ctx, `INSERT INTO tenants (id, name, replay_window_seconds, reaper_threshold_seconds,
		lease_seconds_default, lease_seconds_max, max_response_bytes, rate_limit_per_second, created_at, updated_at)
		VALUES ('acme', 'acme', 86400, 259200, 30, 3600, 8388608, 0, 1, 2), ('beta', 'bêta', 60, 3600, 30, 3600, 1024, 5, 3, 4)`)
	require.NoError(t, err)
	body := make([]byte, 200_000)
	for i := range body {
		body[i] = byte(i * 7)
	}
	_, err = db.ExecContext(ctx, `INSERT INTO idempotency_keys (tenant_id, key, state, operation, fingerprint, fencing_token, attempt,
		lease_expires_at, recovery_point, recovery_data, response_status, response_headers, response_body, response_body_encoding,
		replay_window_seconds, reaper_threshold_seconds, created_at, updated_at, completed_at, replay_until, purge_after,
		attempt_id, review_note, review_at, orphan_event_token, stored_bytes,
		completer_state, completer_id, completer_attempts, completer_next_at, completer_deadline) VALUES
		('acme', 'big', 'completed', 'POST /v1/files', 'sha256:aa', 3, 2, NULL, 'uploaded', CAST('{"part":"é"}' AS BLOB),
			201, '{"Content-Type":"application/octet-stream","X-Note":"naïve"}', ?, 'base64',
			86400, 259200, 10, 20, 20, 86400000020, 259200000020, NULL, NULL, NULL, 2, 200100, NULL, NULL, 1, NULL, 5000),
		('acme', 'empty', 'completed', 'DELETE /v1/x', 'sha256:bb', 4, 1, NULL, NULL, NULL,
			204, '{}', X'', 'utf8', 86400, 259200, 11, 21, 21, 86400000021, 259200000021, 'att-1', NULL, NULL, NULL, 30,
			NULL, NULL, 0, NULL, NULL),
		('beta', 'flight-é', 'in_flight', 'POST /v1/payments', 'sha256:cc', 5, 3, 9000000000000000, 'charged', CAST('{"id":"ch_1"}' AS BLOB),
			NULL, NULL, NULL, NULL, 60, 3600, 12, 22, NULL, NULL, 9000000000000000, 'att-2', 'check the ledger ✓', 23, 4,
			60, 'unknown', 'cmp_1', 2, 9000000000000001, 9000000000000002)`, body)
	require.NoError(t, err)

	before := layoutSnapshot(t, db)
	require.Len(t, before.rows, 3*len(before.columns))
	_, err = provider.UpTo(ctx, 18)
	require.NoError(t, err)
	after := layoutSnapshot(t, db)
	require.Equal(t, before.rows, after.rows, "every column of every record, as quote() spells it")
	require.Equal(t, before.usage, after.usage)
	require.Equal(t, before.objects, after.objects, "indexes and triggers")
	require.Equal(t, before.foreignKeys, after.foreignKeys)
	require.ElementsMatch(t, before.columns, after.columns, "the same columns, types, defaults and constraints")
	names := make([]string, len(after.columns))
	for i, c := range after.columns {
		names[i] = strings.Fields(c)[0]
	}
	require.Equal(t, largeKeyColumns, names[len(names)-len(largeKeyColumns):])
	var check string
	require.NoError(t, db.QueryRowContext(ctx, `PRAGMA integrity_check`).Scan(&check))
	require.Equal(t, "ok", check)
	var violations int
	require.NoError(t, db.QueryRowContext(ctx, `SELECT count(*) FROM pragma_foreign_key_check`).Scan(&violations))
	require.Zero(t, violations)

	_, err = provider.DownTo(ctx, 17)
	require.NoError(t, err)
	require.Equal(t, before, layoutSnapshot(t, db), "00018's Down gives back 00017's table and records")
	_, err = provider.Up(ctx)
	require.NoError(t, err)
	require.NoError(t, db.Close())

	// The counting triggers count the writes after the rebuild.
	s := openStore(t, path, nil)
	usage := func(tenant string) int64 {
		ten, err := s.GetTenant(ctx, idem.GetTenantParams{ID: tenant})
		require.NoError(t, err)
		return ten.StoredBytes
	}
	acme, beta := usage("acme"), usage("beta")
	require.Equal(t, int64(200100+30), acme)
	require.Equal(t, int64(60), beta)
	rec, err := s.GetRecord(ctx, idem.GetRecordParams{TenantID: "acme", Key: "big"})
	require.NoError(t, err)
	require.Equal(t, body, rec.Response.Body)
	res, err := s.Claim(ctx, storetest.ClaimParams("acme", "new"))
	require.NoError(t, err)
	claimed := idem.ClaimBytes("new", res.Record.Operation, res.Record.Fingerprint)
	require.Equal(t, acme+claimed, usage("acme"), "insert trigger")
	require.NoError(t, s.Release(ctx, idem.ReleaseParams{TenantID: "acme", Key: "new", FencingToken: res.Record.FencingToken}))
	require.Equal(t, acme, usage("acme"), "delete trigger")
	resp := idem.Response{Status: 200, Body: []byte("ok"), BodyEncoding: idem.BodyEncodingUTF8}
	_, err = s.Complete(ctx, idem.CompleteParams{TenantID: "beta", Key: "flight-é", FencingToken: 5, Response: resp})
	require.NoError(t, err)
	require.Equal(t, beta+int64(resp.Size()), usage("beta"), "update trigger")
}

// layout is what a rebuild of idempotency_keys must keep: its columns
// (name, type, not null, default, primary key position) in order, its
// records column by column, the tenants' usage, its indexes and triggers
// and its foreign key.
type layout struct {
	columns     []string
	rows        map[string]string
	usage       map[string]int64
	objects     map[string]string
	foreignKeys []string
}

func layoutSnapshot(t *testing.T, db *sql.DB) layout {
	t.Helper()
	ctx := context.Background()
	strs := func(query string) []string {
		rows, err := db.QueryContext(ctx, query)
		require.NoError(t, err)
		defer rows.Close()
		var out []string
		for rows.Next() {
			var s string
			require.NoError(t, rows.Scan(&s))
			out = append(out, s)
		}
		require.NoError(t, rows.Err())
		return out
	}
	l := layout{rows: map[string]string{}, usage: map[string]int64{}, objects: map[string]string{}}
	l.columns = strs(`SELECT name || ' ' || type || ' ' || "notnull" || ' ' || coalesce(dflt_value, 'NULL') || ' ' || pk
		FROM pragma_table_info('idempotency_keys') ORDER BY cid`)
	for _, c := range l.columns {
		name := strings.Fields(c)[0]
		for _, v := range strs(`SELECT tenant_id || '/' || key || '=' || quote(` + name + `) FROM idempotency_keys`) {
			id, value, _ := strings.Cut(v, "=")
			if len(value) > 100 { // a readable failure
				value = fmt.Sprintf("%d characters, sha256 %x", len(value), sha256.Sum256([]byte(value)))
			}
			l.rows[id+" "+name] = value
		}
	}
	// The table's own SQL says its CHECK constraints; compared without
	// the column order and spacing, by the constraints it holds.
	var tableSQL string
	require.NoError(t, db.QueryRowContext(ctx, `SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'idempotency_keys'`).Scan(&tableSQL))
	require.Contains(t, tableSQL, "CHECK (state IN ('in_flight', 'completed'))")
	require.Contains(t, tableSQL, "CHECK (completer_state IN ('resuming', 'unknown', 'review'))")
	for _, v := range strs(`SELECT tenant_id || '=' || stored_bytes FROM tenant_usage`) {
		id, n, _ := strings.Cut(v, "=")
		var bytes int64
		_, err := fmt.Sscan(n, &bytes)
		require.NoError(t, err)
		l.usage[id] = bytes
	}
	for _, v := range strs(`SELECT type || ' ' || name || '=' || coalesce(sql, '') FROM sqlite_master
		WHERE tbl_name = 'idempotency_keys' AND type <> 'table'`) {
		id, text, _ := strings.Cut(v, "=")
		l.objects[id] = strings.Join(strings.Fields(text), " ")
	}
	l.foreignKeys = strs(`SELECT "table" || ' ' || "from" || ' ' || coalesce("to", '') || ' ' || on_delete FROM pragma_foreign_key_list('idempotency_keys')`)
	return l
}

// migratedTo makes a new SQLite file (dsn never creates one) migrated up to
// version, or all the way when version is -1, and returns its path, a
// connection to it (closed at the test's end; close it first to open a Store
// on the file) and the goose provider.
func migratedTo(ctx context.Context, t *testing.T, version int64) (string, *sql.DB, *goose.Provider) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "idem.db")
	require.NoError(t, os.WriteFile(path, nil, 0o600))
	db, err := sql.Open("sqlite", dsn(path))
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	provider, err := goose.NewProvider(goose.DialectSQLite3, db, schema.SQLite())
	require.NoError(t, err)
	if version == -1 {
		_, err = provider.Up(ctx)
	} else {
		_, err = provider.UpTo(ctx, version)
	}
	require.NoError(t, err)
	return path, db, provider
}
