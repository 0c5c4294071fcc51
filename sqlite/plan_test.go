package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem/sqlite/internal/dbsqlc"
)

// errRecorded stops a statement once sqlRecorder has its text.
var errRecorded = errors.New("recorded")

// sqlRecorder is a dbsqlc.DBTX that keeps the text of the statement a
// generated method sends instead of running it (a row read gets an empty
// result), so a test can plan exactly the SQL the store runs.
type sqlRecorder struct {
	db  *sql.DB
	sql string
}

func (r *sqlRecorder) ExecContext(_ context.Context, query string, _ ...any) (sql.Result, error) {
	r.sql = query
	return nil, errRecorded
}

func (r *sqlRecorder) PrepareContext(_ context.Context, query string) (*sql.Stmt, error) {
	r.sql = query
	return nil, errRecorded
}

func (r *sqlRecorder) QueryContext(_ context.Context, query string, _ ...any) (*sql.Rows, error) {
	r.sql = query
	return nil, errRecorded
}

func (r *sqlRecorder) QueryRowContext(ctx context.Context, query string, _ ...any) *sql.Row {
	r.sql = query
	return r.db.QueryRowContext(ctx, "SELECT 1 WHERE 0")
}

// TestQueryPlans mirrors the PostgreSQL store's TestGenericPlans: on a
// ledger with records, every statement that addresses one record by
// (tenant_id, key) finds it through the primary key, and the reaper's batch
// through the purge_after index, never by scanning the table or walking a
// whole index.
func TestQueryPlans(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, err := Open(ctx, filepath.Join(t.TempDir(), "idem.db"), Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	db := s.DB()
	_, err = db.ExecContext(ctx, `INSERT INTO tenants (id, name, replay_window_seconds, reaper_threshold_seconds,
		lease_seconds_default, lease_seconds_max, max_response_bytes, rate_limit_per_second, created_at, updated_at)
		VALUES ('t', 't', 86400, 259200, 30, 3600, 1048576, 0, 0, 0)`)
	require.NoError(t, err)
	// 20,000 completed records and 20 in flight.
	_, err = db.ExecContext(ctx, `WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 20020)
		INSERT INTO idempotency_keys (tenant_id, key, state, operation, fingerprint, fencing_token, attempt,
			lease_expires_at, replay_window_seconds, reaper_threshold_seconds, created_at, updated_at, purge_after)
		SELECT 't', 'k-' || i, CASE WHEN i % 1000 = 0 THEN 'in_flight' ELSE 'completed' END, 'POST /p', 'fp', i, 1,
			CASE WHEN i % 1000 = 0 THEN 1000 END, 86400, 259200, i, i, i + 259200000000
		FROM n`)
	require.NoError(t, err)

	rec := &sqlRecorder{db: db}
	q := dbsqlc.New(rec)
	single := map[string]func(){
		"GetKey":             func() { _, _ = q.GetKey(ctx, dbsqlc.GetKeyParams{}) },
		"TakeoverKey":        func() { _, _ = q.TakeoverKey(ctx, dbsqlc.TakeoverKeyParams{}) },
		"RenewAttemptLease":  func() { _, _ = q.RenewAttemptLease(ctx, dbsqlc.RenewAttemptLeaseParams{}) },
		"CheckpointKey":      func() { _, _ = q.CheckpointKey(ctx, dbsqlc.CheckpointKeyParams{}) },
		"CompleteKey":        func() { _, _ = q.CompleteKey(ctx, dbsqlc.CompleteKeyParams{}) },
		"ReleaseKey":         func() { _, _ = q.ReleaseKey(ctx, dbsqlc.ReleaseKeyParams{}) },
		"ResolveCompleteKey": func() { _, _ = q.ResolveCompleteKey(ctx, dbsqlc.ResolveCompleteKeyParams{}) },
		"ReviewKey":          func() { _, _ = q.ReviewKey(ctx, dbsqlc.ReviewKeyParams{}) },
		"MarkOrphanReported": func() { _ = q.MarkOrphanReported(ctx, dbsqlc.MarkOrphanReportedParams{}) },
	}
	plan := func(name string, call func()) string {
		rec.sql = ""
		call()
		require.NotEmpty(t, rec.sql, name)
		rows, err := db.QueryContext(ctx, "EXPLAIN QUERY PLAN "+rec.sql, make([]any, strings.Count(rec.sql, "?"))...)
		require.NoError(t, err, name)
		defer rows.Close()
		var lines []string
		for rows.Next() {
			var id, parent, unused int
			var detail string
			require.NoError(t, rows.Scan(&id, &parent, &unused, &detail), name)
			lines = append(lines, detail)
		}
		require.NoError(t, rows.Err(), name)
		return strings.Join(lines, "\n")
	}
	for name, call := range single {
		p := plan(name, call)
		assert.Contains(t, p, "USING INDEX sqlite_autoindex_idempotency_keys_1 (tenant_id=? AND key=?)", "%s must reach its row by the primary key; its plan:\n%s", name, p)
		assert.NotContains(t, p, "SCAN ", "%s: plan:\n%s", name, p)
	}
	p := plan("ReapKeys", func() { _, _ = q.ReapKeys(ctx, dbsqlc.ReapKeysParams{}) })
	assert.Contains(t, p, "USING INDEX idempotency_keys_purge_after_idx (purge_after<?)", "ReapKeys: plan:\n%s", p)
	assert.NotContains(t, p, "SCAN ", "ReapKeys: plan:\n%s", p)
}
