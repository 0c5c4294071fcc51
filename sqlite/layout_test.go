package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	moderncsqlite "modernc.org/sqlite"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/sqlite/internal/dbsqlc"
	"github.com/idem-dev/idem/storetest"
)

// largeKeyColumns are the columns of idempotency_keys whose size the caller
// chooses (up to max_response_bytes or a checkpoint's body): SQLite keeps
// the part of a row past its page in a chain of overflow pages and reaches
// a column only by walking the chain up to it, so these come last and every
// other column is read without touching them (migration 00018).
var largeKeyColumns = []string{"recovery_data", "response_headers", "response_body"}

// TestLargeKeyColumnsLast: in idempotency_keys the large columns come after
// every other column. A column added later with ALTER TABLE ADD COLUMN lands
// after them, and every metadata read of a big record would walk its
// response again: such a migration must rebuild the table as 00018 does.
func TestLargeKeyColumnsLast(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rows, err := b.store.DB().QueryContext(context.Background(), `SELECT name FROM pragma_table_info('idempotency_keys') ORDER BY cid`)
	require.NoError(t, err)
	defer rows.Close()
	var cols []string
	for rows.Next() {
		var name string
		require.NoError(t, rows.Scan(&name))
		cols = append(cols, name)
	}
	require.NoError(t, rows.Err())
	require.Greater(t, len(cols), len(largeKeyColumns))
	require.Equal(t, largeKeyColumns, cols[len(cols)-len(largeKeyColumns):],
		"idempotency_keys columns, in order: %s", strings.Join(cols, ", "))
}

// TestMetadataReadsIgnoreResponseSize: the statements that read records
// without their responses and recovery data (the listings, the orphan
// watch, the completer's pick, the stats) access about as many database
// pages on a ledger of 1 MiB responses and recovery data as on one of a
// few bytes, counted by SQLite itself (sqlite3_db_status: page cache hits
// plus misses on the connection that ran them). With a large column in
// the middle of the row, each big record cost the ~260 overflow pages of
// its response: 100 records of 8 MB made GET /v1/keys read 800 MB and run
// into the store timeout.
func TestMetadataReadsIgnoreResponseSize(t *testing.T) {
	t.Parallel()
	const records = 8
	small := metadataPages(t, records, 16)
	big := metadataPages(t, records, 1<<20)
	for name, n := range small {
		t.Logf("%s: %d pages with 16-byte responses and recovery data, %d with 1 MiB ones", name, n, big[name])
	}
	for name, n := range small {
		// A big record's cell fills up to one leaf page of its own; its
		// overflow chain is never read.
		require.LessOrEqual(t, big[name], n+2*records+4,
			"%s accessed %d pages over %d records of 1 MiB, %d over records of 16 bytes", name, big[name], records, n)
	}
}

// metadataPages fills a ledger with records completed with a response of
// size bytes and orphans holding recovery data of size bytes, and returns
// the pages each metadata statement accesses on them.
func metadataPages(t *testing.T, records, size int) map[string]int {
	t.Helper()
	ctx := context.Background()
	clock := storetest.NewClock()
	s := openStore(t, filepath.Join(t.TempDir(), "idem.db"), clock.Now)
	storetest.CreateTenant(t, s, "acme")
	body := []byte(strings.Repeat("x", size))
	data := []byte(`"` + strings.Repeat("y", size-2) + `"`)
	for i := range records {
		res, err := s.Claim(ctx, storetest.ClaimParams("acme", fmt.Sprintf("done-%d", i)))
		require.NoError(t, err)
		_, err = s.Complete(ctx, idem.CompleteParams{TenantID: "acme", Key: res.Record.Key, FencingToken: res.Record.FencingToken,
			Response: idem.Response{Status: 200, Headers: map[string]string{"Content-Type": "text/plain"}, Body: body, BodyEncoding: idem.BodyEncodingUTF8}})
		require.NoError(t, err)
		res, err = s.Claim(ctx, storetest.ClaimParams("acme", fmt.Sprintf("lost-%d", i)))
		require.NoError(t, err)
		_, err = s.Checkpoint(ctx, idem.CheckpointParams{TenantID: "acme", Key: res.Record.Key, FencingToken: res.Record.FencingToken,
			RecoveryPoint: "charged", Data: data, Lease: time.Minute})
		require.NoError(t, err)
	}
	clock.Advance(time.Hour) // the in-flight records are orphans now
	now := micros(clock.Now())

	conn, err := s.DB().Conn(ctx)
	require.NoError(t, err)
	defer conn.Close()
	q := dbsqlc.New(conn)
	statements := map[string]func() (int, error){
		"ListKeys": func() (int, error) {
			rows, err := q.ListKeys(ctx, dbsqlc.ListKeysParams{TenantID: "acme", AfterTime: cursorNewest, Now: now, RowLimit: 500})
			return len(rows), err
		},
		"ListKeys completed": func() (int, error) {
			rows, err := q.ListKeys(ctx, dbsqlc.ListKeysParams{TenantID: "acme", AfterTime: cursorNewest, StateFilter: "completed", Now: now, RowLimit: 500})
			return len(rows), err
		},
		"ListOrphanKeys": func() (int, error) {
			rows, err := q.ListOrphanKeys(ctx, dbsqlc.ListOrphanKeysParams{Now: now, TenantFilter: "acme", AfterTime: cursorOldest, RowLimit: 500})
			return len(rows), err
		},
		"OrphansToReport": func() (int, error) {
			rows, err := q.OrphansToReport(ctx, dbsqlc.OrphansToReportParams{Now: now, RowLimit: 500})
			return len(rows), err
		},
		"OrphanStats": func() (int, error) {
			rows, err := q.OrphanStats(ctx, now)
			return len(rows), err
		},
		"PickCompletionCandidates": func() (int, error) {
			rows, err := q.PickCompletionCandidates(ctx, dbsqlc.PickCompletionCandidatesParams{Now: now, SkipTenants: "[]", PerTenant: 100, RowLimit: 100})
			return len(rows), err
		},
		"CompletionStats": func() (int, error) {
			rows, err := q.CompletionStats(ctx)
			return len(rows), err
		},
	}
	want := map[string]int{"ListKeys": 2 * records, "ListKeys completed": records, "ListOrphanKeys": records,
		"OrphansToReport": records, "OrphanStats": 1, "PickCompletionCandidates": 0, "CompletionStats": 0}
	pages := make(map[string]int, len(statements))
	for name, run := range statements {
		before := pageAccesses(t, conn)
		n, err := run()
		require.NoError(t, err, name)
		require.Equal(t, want[name], n, "%s: rows", name)
		pages[name] = pageAccesses(t, conn) - before
	}
	return pages
}

// pageAccesses is how many pages the connection has asked its page cache
// for since it opened, found there or read from the file.
func pageAccesses(t *testing.T, conn *sql.Conn) int {
	t.Helper()
	var n int
	require.NoError(t, conn.Raw(func(dc any) error {
		st, ok := dc.(moderncsqlite.DBStatus)
		if !ok {
			return fmt.Errorf("%T has no sqlite3_db_status", dc)
		}
		for _, op := range []moderncsqlite.DBStatusOp{moderncsqlite.DBStatusCacheHit, moderncsqlite.DBStatusCacheMiss} {
			cur, _, err := st.Status(op, false)
			if err != nil {
				return err
			}
			n += cur
		}
		return nil
	}))
	return n
}
