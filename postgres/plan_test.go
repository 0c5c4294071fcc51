package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem/postgres/internal/dbsqlc"
	"github.com/idem-dev/idem/testkit/pgtest"
)

// errRecorded stops a query once sqlRecorder has its text.
var errRecorded = errors.New("recorded")

// sqlRecorder is a dbsqlc.DBTX that keeps the text of the statement a
// generated method sends instead of running it, so a test can plan exactly
// the SQL the store runs.
type sqlRecorder struct{ sql string }

func (r *sqlRecorder) Exec(_ context.Context, sql string, _ ...any) (pgconn.CommandTag, error) {
	r.sql = sql
	return pgconn.CommandTag{}, errRecorded
}

func (r *sqlRecorder) Query(_ context.Context, sql string, _ ...any) (pgx.Rows, error) {
	r.sql = sql
	return nil, errRecorded
}

func (r *sqlRecorder) QueryRow(_ context.Context, sql string, _ ...any) pgx.Row {
	r.sql = sql
	return recordedRow{}
}

type recordedRow struct{}

func (recordedRow) Scan(...any) error { return errRecorded }

// TestGenericPlans plans the store's statements as the generic plans of
// prepared statements, on a ledger with statistics like a real one (mostly
// completed records, a few in flight). Every statement that addresses one
// record by (tenant_id, key) must reach it through the primary key: before
// migration 00009 the orphan index held tenant_id and key, and complete,
// checkpoint, release and the others were planned as a walk over the whole
// orphan index, so every complete cost O(records in flight and dead
// entries), a quarter of the write rate. The reaper's and the orphan
// watch's batches must change their rows by address: joined back on the
// key, a generic plan (which cannot see the LIMIT) hashed a scan of the
// whole table for every batch.
//
// It plans them twice: with 20 records in flight, and with none, as
// ANALYZE usually finds a busy ledger (a record is in flight for the
// milliseconds of its work): estimated empty, the partial orphan index
// looked the cheapest way to every record in flight, and CompleteKey's
// generic plan walked all of it, the dead entries of every record
// completed since the last vacuum included.
func TestGenericPlans(t *testing.T) {
	t.Parallel()
	for _, every := range []int{1000, 0} {
		name := "InFlight20"
		if every == 0 {
			name = "NoneInFlight"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			testGenericPlans(t, every)
		})
	}
}

// testGenericPlans plans the statements on 20,000 completed records and,
// every > 0, one record in flight in every `every`.
func testGenericPlans(t *testing.T, every int) {
	ctx := context.Background()
	dsn := pgtest.URL(t)
	s, err := Open(ctx, dsn, Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })

	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	_, err = conn.Exec(ctx, `INSERT INTO tenants (id, name, replay_window_seconds, reaper_threshold_seconds,
		lease_seconds_default, lease_seconds_max, max_response_bytes, rate_limit_per_second, created_at, updated_at)
		VALUES ('t', 't', 86400, 259200, 30, 3600, 1048576, 0, now(), now())`)
	require.NoError(t, err)
	// 20,000 completed records and 20 in flight (every = 1000) or none,
	// then the statistics autovacuum would gather.
	inFlight := "false"
	if every > 0 {
		inFlight = fmt.Sprintf("i %% %d = 0", every)
	}
	_, err = conn.Exec(ctx, strings.ReplaceAll(`INSERT INTO idempotency_keys (tenant_id, key, state, operation, fingerprint,
		fencing_token, attempt, lease_expires_at, response_status, response_headers, response_body,
		response_body_encoding, replay_window_seconds, reaper_threshold_seconds, created_at, updated_at,
		completed_at, replay_until, purge_after)
		SELECT 't', 'k-' || i, CASE WHEN IN_FLIGHT THEN 'in_flight' ELSE 'completed' END, 'POST /p', 'fp',
			i, 1, CASE WHEN IN_FLIGHT THEN now() + interval '30 seconds' END,
			CASE WHEN NOT (IN_FLIGHT) THEN 201 END, CASE WHEN NOT (IN_FLIGHT) THEN '{}'::jsonb END,
			CASE WHEN NOT (IN_FLIGHT) THEN '\x7b7d'::bytea END, CASE WHEN NOT (IN_FLIGHT) THEN 'utf8' END,
			86400, 259200, now(), now(), CASE WHEN NOT (IN_FLIGHT) THEN now() END,
			CASE WHEN NOT (IN_FLIGHT) THEN now() + interval '1 day' END, now() + interval '3 days'
		FROM generate_series(1, 20020) i`, "IN_FLIGHT", inFlight))
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "ANALYZE idempotency_keys")
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "SET plan_cache_mode = force_generic_plan")
	require.NoError(t, err)

	rec := &sqlRecorder{}
	q := dbsqlc.New(rec)
	statements := map[string]func(){
		"GetKey":             func() { _, _ = q.GetKey(ctx, dbsqlc.GetKeyParams{}) },
		"ClaimKey":           func() { _, _ = q.ClaimKey(ctx, dbsqlc.ClaimKeyParams{}) },
		"LockKey":            func() { _, _ = q.LockKey(ctx, dbsqlc.LockKeyParams{}) },
		"RenewAttemptLease":  func() { _, _ = q.RenewAttemptLease(ctx, dbsqlc.RenewAttemptLeaseParams{}) },
		"CheckpointKey":      func() { _, _ = q.CheckpointKey(ctx, dbsqlc.CheckpointKeyParams{}) },
		"CompleteKey":        func() { _, _ = q.CompleteKey(ctx, dbsqlc.CompleteKeyParams{}) },
		"ReleaseKey":         func() { _, _ = q.ReleaseKey(ctx, dbsqlc.ReleaseKeyParams{}) },
		"ResolveCompleteKey": func() { _, _ = q.ResolveCompleteKey(ctx, dbsqlc.ResolveCompleteKeyParams{}) },
		"ReviewKey":          func() { _, _ = q.ReviewKey(ctx, dbsqlc.ReviewKeyParams{}) },
		"KeyWaited":          func() { _, _ = q.KeyWaited(ctx, dbsqlc.KeyWaitedParams{}) },
		"MarkKeyWaited":      func() { _, _ = q.MarkKeyWaited(ctx, dbsqlc.MarkKeyWaitedParams{}) },
		"SetCompletionUnknown": func() {
			_, _ = q.SetCompletionUnknown(ctx, dbsqlc.SetCompletionUnknownParams{})
		},
		"SetCompletionReview": func() { _, _ = q.SetCompletionReview(ctx, dbsqlc.SetCompletionReviewParams{}) },
	}
	// What the orphan index is for: the statements that bound the lease
	// find the records in flight through it, never by a scan of the table.
	orphanReaders := map[string]func(){
		"ListOrphanKeys":  func() { _, _ = q.ListOrphanKeys(ctx, dbsqlc.ListOrphanKeysParams{}) },
		"OrphanStats":     func() { _, _ = q.OrphanStats(ctx, pgtype.Timestamptz{}) },
		"MarkOrphans":     func() { _, _ = q.MarkOrphans(ctx, dbsqlc.MarkOrphansParams{}) },
		"PickCompletions": func() { _, _ = q.PickCompletions(ctx, dbsqlc.PickCompletionsParams{}) },
	}
	// The batch statements find their rows through an index and change
	// exactly those by their address, never through a join a generic plan
	// (which cannot see the LIMIT) may make a scan of the whole table.
	batches := map[string]func(){
		"ReapKeys":    func() { _, _ = q.ReapKeys(ctx, dbsqlc.ReapKeysParams{}) },
		"MarkOrphans": func() { _, _ = q.MarkOrphans(ctx, dbsqlc.MarkOrphansParams{}) },
	}
	plan := func(name string, call func()) string {
		rec.sql = ""
		call()
		require.NotEmpty(t, rec.sql, name)
		stmt := "plan_" + strings.ToLower(name)
		sd, err := conn.Prepare(ctx, stmt, rec.sql)
		require.NoError(t, err, name)
		args := strings.TrimSuffix(strings.Repeat("NULL,", len(sd.ParamOIDs)), ",")
		rows, err := conn.Query(ctx, "EXPLAIN EXECUTE "+stmt+"("+args+")", pgx.QueryExecModeSimpleProtocol)
		require.NoError(t, err, name)
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err, name)
		return strings.Join(lines, "\n")
	}
	for name, call := range statements {
		p := plan(name, call)
		assert.Contains(t, p, "using idempotency_keys_pkey on idempotency_keys", "%s must reach its row by the primary key; its generic plan:\n%s", name, p)
		assert.NotContains(t, p, "Seq Scan on idempotency_keys", "%s: generic plan:\n%s", name, p)
		assert.NotContains(t, p, "idempotency_keys_orphans_idx", "%s: generic plan:\n%s", name, p)
	}
	// A write that checks the quota sums the tenant's counter rows once:
	// CheckpointKey's inlined clock summed them for each of its nine uses.
	for name, call := range map[string]func(){
		"CheckpointKey": statements["CheckpointKey"], "CompleteKey": statements["CompleteKey"],
	} {
		p := plan(name, call)
		assert.Equal(t, 1, strings.Count(p, "Aggregate"), "%s must sum the usage once; its generic plan:\n%s", name, p)
	}
	for name, call := range orphanReaders {
		p := plan(name, call)
		assert.Regexp(t, `Index Scan (using|on) idempotency_keys_orphans_idx`, p, "%s must find the records in flight through the orphan index; its generic plan:\n%s", name, p)
		assert.NotContains(t, p, "Seq Scan on idempotency_keys", "%s: generic plan:\n%s", name, p)
	}
	// A listing's cursor bounds its index scan, so a page deep in a large
	// tenant costs what the first does.
	p := plan("ListKeys", func() { _, _ = q.ListKeys(ctx, dbsqlc.ListKeysParams{}) })
	assert.Regexp(t, `Index Cond: .*ROW\(created_at, key\) < ROW`, p, "ListKeys: generic plan:\n%s", p)
	for name, call := range batches {
		p = plan(name, call)
		assert.Contains(t, p, "Tid Scan on idempotency_keys k", "%s must change its batch by address; its generic plan:\n%s", name, p)
		assert.NotContains(t, p, "Seq Scan on idempotency_keys", "%s: generic plan:\n%s", name, p)
	}
}
