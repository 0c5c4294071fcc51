package server_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/server"
	"github.com/idem-dev/idem/storemw"
	"github.com/idem-dev/idem/testkit/contract"
	"github.com/idem-dev/idem/testkit/servertest"
)

// blockedIn counts the goroutines of this process parked in a select or a
// channel send with fn on their stack (fn as the traceback spells it,
// e.g. "storemw.(*shareStore).acquire"): where the server's requests wait.
func blockedIn(fn string) int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	n := 0
	for _, g := range bytes.Split(buf, []byte("\n\n")) {
		header, _, _ := bytes.Cut(g, []byte("\n"))
		parked := bytes.Contains(header, []byte("[select")) || bytes.Contains(header, []byte("[chan send"))
		if parked && bytes.Contains(g, []byte(fn+"(")) {
			n++
		}
	}
	return n
}

const (
	inShare    = "storemw.(*shareStore).acquire"
	inSQLiteWQ = "sqlite.(*Store).lockWriter"
)

// TestTenantStoreShare: one tenant whose store calls are stuck (its
// completes blocked on a lock) cannot hold every connection of the store;
// its other requests wait for one of its own slots, and another tenant's
// claim → complete goes through while they wait. Once the lock goes, every
// request of the first tenant ends with one outcome: each key completed
// once with its own response.
//
//   - PostgreSQL (IDEM_DB_MAX_CONNS=4, share 2): the test locks tenant a's
//     rows (SELECT … FOR UPDATE), so a's 8 completes block inside the
//     store, each on a pooled connection: 2 within a's share and 1 past it
//     (a was alone), which leaves storemw.ShareReserve (1) connection free.
//     Before the share 4 of them held the whole pool and tenant b's claim
//     waited for a connection until IDEM_STORE_TIMEOUT: 503.
//   - SQLite (4 connections, share 2): the write lock is one for
//     everybody, so the test holding it stops b's writes as much as a's;
//     what a tenant holds there is the writer queue (writes queue in
//     arrival order, without a connection). The share bounds how many of
//     a's writes b's write queues behind: 3 (2 within a's share, 1 past
//     it; the one waiting on the lock and two queued), where before it
//     queued behind all 8 — behind a's whole backlog, however long, so a
//     tenant sending enough writes pushed every other tenant's past its
//     deadline.
//
// Not parallel: it counts the goroutines of the process parked in the
// share and in the SQLite writer queue.
func TestTenantStoreShare(t *testing.T) {
	for _, backend := range []string{servertest.BackendSQLite, servertest.BackendPostgres} {
		t.Run(backend, func(t *testing.T) { testTenantStoreShare(t, backend) })
	}
}

func testTenantStoreShare(t *testing.T, backend string) {
	const (
		pool = 4 // IDEM_DB_MAX_CONNS; SQLite's pool has 4 connections too
		keys = 8 // more of a's requests than the pool has connections
	)
	// The background jobs stay out of the way: on SQLite their writes
	// would queue among the tenants'.
	ts := servertest.Start(t, servertest.Options{Backend: backend, Tenants: []string{"a", "b"},
		ReapInterval: time.Hour, OrphanWatchInterval: time.Hour,
		Configure: func(c *server.Config) { c.DBMaxConns = 4 }})
	c := newAPIClient(t, ts)
	hc := &http.Client{Transport: contract.Transport(t, http.DefaultTransport), Timeout: 30 * time.Second}
	tokA := ts.Token(t, "a", "keys:write", "keys:read")
	tokB := ts.Token(t, "b", "keys:write", "keys:read")
	ctx := t.Context()

	tokens := map[string]int64{}
	for i := range keys {
		key := fmt.Sprintf("k%d", i)
		status, claim, _ := c.call(t, http.MethodPost, "/v1/keys/"+key+"/claim", tokA, `{"fingerprint":"fp","lease_seconds":600}`)
		require.Equal(t, http.StatusCreated, status, "%v", claim)
		tokens[key] = int64(claim["fencing_token"].(float64))
	}
	// b is known to the tenant cache before the store is stuck, as a
	// tenant with traffic would be.
	status, _, _ := c.call(t, http.MethodGet, "/v1/keys/none", tokB, "")
	require.Equal(t, http.StatusNotFound, status)

	// Stick a's completes inside the store.
	var release func()
	var stuck func() int // how many of a's calls are stuck on the lock
	var unshared int     // how many are stuck without the share
	var held int         // how many are stuck with it
	if backend == servertest.BackendPostgres {
		holder, err := pgx.Connect(ctx, ts.Config().DatabaseURL)
		require.NoError(t, err)
		t.Cleanup(func() { _ = holder.Close(context.Background()) })
		tx, err := holder.Begin(ctx)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, `SELECT 1 FROM idempotency_keys WHERE tenant_id = 'a' FOR UPDATE`)
		require.NoError(t, err)
		release = func() { require.NoError(t, tx.Rollback(ctx)) }
		watcher, err := pgx.Connect(ctx, ts.Config().DatabaseURL)
		require.NoError(t, err)
		t.Cleanup(func() { _ = watcher.Close(context.Background()) })
		pid := holder.PgConn().PID()
		unshared = pool // the whole pool
		held = pool - storemw.ShareReserve
		stuck = func() int {
			var n int
			require.NoError(t, watcher.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE $1::int = ANY(pg_blocking_pids(pid))`, pid).Scan(&n))
			return n
		}
	} else {
		h := holdSQLiteWriteLock(t, strings.TrimPrefix(ts.Config().DatabaseURL, "sqlite:"))
		release = h.release
		stuck = func() int { return 1 + blockedIn(inSQLiteWQ) } // one waits on the lock, the rest queue
		unshared = keys                                         // the whole backlog
		held = pool - storemw.ShareReserve
	}

	answers := make(chan reply, keys)
	for key, tok := range tokens {
		go func() {
			answers <- call(ctx, hc, http.MethodPost, ts.URL()+"/v1/keys/"+key+"/complete", tokA, completeBody(tok, `{"key":"`+key+`"}`))
		}()
	}
	// Every one of a's requests is in the server: either stuck in the store
	// (all of them, without the share) or held ones stuck and the rest
	// waiting for a's slots.
	require.Eventually(t, func() bool {
		n := stuck()
		return n == unshared || n == held && blockedIn(inShare) == keys-held
	}, 20*time.Second, 5*time.Millisecond, "a's completes should be stuck in the store")
	queued := blockedIn(inSQLiteWQ)

	// b's claim → complete goes through while a's requests are stuck.
	claimB := make(chan reply, 1)
	go func() {
		claimB <- call(ctx, hc, http.MethodPost, ts.URL()+"/v1/keys/order/claim", tokB, claimBody("order"))
	}()
	if backend == servertest.BackendSQLite {
		// b's claim is queued for the write lock like a's writes; let
		// a's go once it is.
		require.Eventually(t, func() bool { return blockedIn(inSQLiteWQ) == queued+1 }, 20*time.Second, 5*time.Millisecond,
			"b's claim should queue for the writer")
		release()
	}
	r := <-claimB
	require.NoError(t, r.err)
	require.Equal(t, http.StatusCreated, r.status, "b's claim: %s", r)
	tokB1 := int64(r.json(t)["fencing_token"].(float64))
	r = call(ctx, hc, http.MethodPost, ts.URL()+"/v1/keys/order/complete", tokB, completeBody(tokB1, `{"id":"ord_b"}`))
	require.NoError(t, r.err)
	require.Equal(t, http.StatusOK, r.status, "b's complete: %s", r)
	if backend == servertest.BackendPostgres {
		require.Equal(t, held, stuck(), "a's completes are still stuck, all but the reserve of the pool")
		require.Empty(t, answers, "none of a's completes was answered yet")
		release()
	}

	// Every request of a ends with one outcome, every key completed once
	// with its own response.
	for range keys {
		r := <-answers
		require.NoError(t, r.err)
		require.Equal(t, http.StatusOK, r.status, "a's complete: %s", r)
	}
	get := func(tenant, key string) idem.Record {
		rec, err := ts.Store().GetRecord(ctx, idem.GetRecordParams{TenantID: tenant, Key: key})
		require.NoError(t, err)
		require.Equal(t, idem.StateCompleted, rec.State, "%s/%s", tenant, key)
		return rec
	}
	recB := get("b", "order")
	require.Equal(t, `{"id":"ord_b"}`, string(recB.Response.Body))
	aFirst := 0 // a's completes committed before b's claim (SQLite takes the clock under the write lock)
	for key, tok := range tokens {
		rec := get("a", key)
		require.Equal(t, tok, rec.FencingToken, "a/%s", key)
		require.Equal(t, `{"key":"`+key+`"}`, string(rec.Response.Body), "a/%s", key)
		if rec.CompletedAt.Before(recB.CreatedAt) {
			aFirst++
		}
	}
	if backend == servertest.BackendSQLite {
		require.Equal(t, held, aFirst, "b's claim waited behind a's share of writes and one past it, not a's whole backlog")
	}
	require.Equal(t, float64(keys-held), c.metric(t, `idem_tenant_store_share_waits_total{result="ok",tenant="a"}`),
		"idem_tenant_store_share_waits_total counts a's waits")
}
