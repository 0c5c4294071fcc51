package server_test

// The ledger notices that its database went back in time (issue 25, item
// 2): a failover to a standby that was behind, or an older copy put back,
// loses acknowledged writes; the token source then stands below tokens
// already given out. Through real HTTP on both stores.

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"net/http"
	neturl "net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem/server"
	"github.com/idem-dev/idem/testkit/cutproxy"
	"github.com/idem-dev/idem/testkit/pgtest"
	"github.com/idem-dev/idem/testkit/servertest"
)

// rollBackLedger puts the ledger's database back to the moment the token
// source stood at token: the source set back, every record written with a
// later token gone — what a failover to a standby that had replayed up to
// then leaves (PostgreSQL: setval plus the deletes; SQLite: the counter row
// rewritten plus the deletes, as an older copy of the file would be).
func rollBackLedger(t *testing.T, url string, token int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if path, ok := strings.CutPrefix(url, "sqlite:"); ok {
		db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(10000)")
		require.NoError(t, err)
		defer db.Close()
		_, err = db.ExecContext(ctx, `UPDATE fencing_counter SET value = ?`, token)
		require.NoError(t, err)
		_, err = db.ExecContext(ctx, `DELETE FROM idempotency_keys WHERE fencing_token > ?`, token)
		require.NoError(t, err)
		return
	}
	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, `SELECT setval('fencing_tokens', $1)`, token)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `DELETE FROM idempotency_keys WHERE fencing_token > $1`, token)
	require.NoError(t, err)
}

// readyStatus returns the status of GET /readyz.
func readyStatus(t *testing.T, ts *servertest.Server) int {
	t.Helper()
	resp, err := http.Get(ts.URL() + "/readyz")
	require.NoError(t, err)
	resp.Body.Close()
	return resp.StatusCode
}

// TestLedgerRollbackStopsWrites: five keys are claimed and completed
// (tokens 1–5), then the database goes back to token 2. The replica that
// saw tokens up to 5 finds the source at 2 within its check interval:
// /readyz and every key write answer 503 store_unavailable instead of
// running completed keys again with tokens already given to other keys;
// it logs and counts it and records it in the database, so a replica
// started afterwards, which never saw the lost tokens, refuses too. The
// acknowledgement (what `ledger acknowledge-rollback` runs) moves the
// source past token 5: both replicas take writes again and no token is
// issued twice. Before the guard the claim of the lost key got 201 with
// token 3, already given to another key.
func TestLedgerRollbackStopsWrites(t *testing.T) {
	t.Parallel()
	for _, backend := range []string{servertest.BackendSQLite, servertest.BackendPostgres} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			logs := &syncBuffer{}
			fast := func(c *server.Config) { c.LedgerCheckInterval = 20 * time.Millisecond }
			ts := servertest.Start(t, servertest.Options{Backend: backend, Tenants: []string{"acme"}, Configure: fast,
				Logger: slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))})
			c := newAPIClient(t, ts)
			tok := ts.Token(t, "acme", "keys:write")
			claim := `{"operation":"POST /v1/payments","request":{"amount":1000},"lease_seconds":60}`

			issued := map[string]int64{}
			for i := 1; i <= 5; i++ {
				key := fmt.Sprintf("pay-%d", i)
				status, body, _ := c.call(t, http.MethodPost, "/v1/keys/"+key+"/claim", tok, claim)
				require.Equal(t, http.StatusCreated, status, "%v", body)
				issued[key] = int64(body["fencing_token"].(float64))
				status, body, _ = c.call(t, http.MethodPost, "/v1/keys/"+key+"/complete", tok,
					fmt.Sprintf(`{"fencing_token":%d,"response":{"status":201,"body":"{\"id\":\"ord_%d\"}"}}`, issued[key], i))
				require.Equal(t, http.StatusOK, status, "%v", body)
			}
			require.Equal(t, int64(5), issued["pay-5"])
			require.Equal(t, http.StatusOK, readyStatus(t, ts))

			rollBackLedger(t, ts.Config().DatabaseURL, issued["pay-2"])

			require.Eventually(t, func() bool { return readyStatus(t, ts) == http.StatusServiceUnavailable }, 10*time.Second, 10*time.Millisecond,
				"the replica did not notice that the database went back to token %d after issuing %d", issued["pay-2"], issued["pay-5"])
			for _, key := range []string{"pay-5", "new-1"} {
				status, body, hdr := c.call(t, http.MethodPost, "/v1/keys/"+key+"/claim", tok, claim)
				require.Equal(t, http.StatusServiceUnavailable, status, "claim of %s after the rollback: %v", key, body)
				require.Equal(t, "store_unavailable", body["code"])
				require.Contains(t, body["detail"], "went back in time")
				require.NotEmpty(t, hdr.Get("Retry-After"))
			}
			status, body, _ := c.call(t, http.MethodPost, "/v1/keys/pay-1/complete", tok,
				fmt.Sprintf(`{"fencing_token":%d,"response":{"status":201,"body":"{}"}}`, issued["pay-1"]))
			require.Equal(t, http.StatusServiceUnavailable, status, "writes stop too: %v", body)
			require.Equal(t, 1.0, c.metric(t, "idem_ledger_rollback_detected"))
			require.Equal(t, 1.0, c.metric(t, "idem_ledger_rollback_detections_total"))
			require.Contains(t, logs.String(), "LEDGER ROLLBACK DETECTED")
			require.Contains(t, logs.String(), `"seen_token":5`)

			// Recorded in the database: a replica started now refuses too.
			// (The record is written after the detection; wait for it.)
			require.Eventually(t, func() bool { return strings.Contains(logs.String(), "ledger rollback recorded") }, 10*time.Second, 10*time.Millisecond)
			other := servertest.Start(t, servertest.Options{DatabaseURL: ts.Config().DatabaseURL, Configure: fast})
			oc := newAPIClient(t, other)
			require.Equal(t, http.StatusServiceUnavailable, readyStatus(t, other))
			status, body, _ = oc.call(t, http.MethodPost, "/v1/keys/new-2/claim", other.Token(t, "acme", "keys:write"), claim)
			require.Equal(t, http.StatusServiceUnavailable, status, "%v", body)
			require.Equal(t, 1.0, oc.metric(t, "idem_ledger_rollback_detected"))
			require.Equal(t, 0.0, oc.metric(t, "idem_ledger_rollback_detections_total"), "it found nothing itself")

			// The operator acknowledges.
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			store, err := server.OpenStore(ctx, ts.Config())
			require.NoError(t, err)
			acked, source, err := server.AcknowledgeLedgerRollback(ctx, store, "test operator")
			require.NoError(t, store.Close())
			require.NoError(t, err)
			require.Len(t, acked, 1)
			require.Equal(t, issued["pay-5"], acked[0].SeenToken)
			require.Equal(t, issued["pay-2"], acked[0].SourceToken)
			require.GreaterOrEqual(t, source, issued["pay-5"])

			for _, srv := range []*servertest.Server{ts, other} {
				require.Eventually(t, func() bool { return readyStatus(t, srv) == http.StatusOK }, 10*time.Second, 10*time.Millisecond)
			}
			require.Equal(t, 0.0, c.metric(t, "idem_ledger_rollback_detected"))
			require.Contains(t, logs.String(), "ledger rollback acknowledged")
			seen := map[int64]bool{}
			for _, v := range issued {
				seen[v] = true
			}
			for _, key := range []string{"pay-5", "new-1"} {
				status, body, _ := c.call(t, http.MethodPost, "/v1/keys/"+key+"/claim", tok, claim)
				require.Equal(t, http.StatusCreated, status, "%v", body)
				got := int64(body["fencing_token"].(float64))
				require.Greater(t, got, issued["pay-5"], "a token given out before the rollback is given out again")
				require.False(t, seen[got])
				seen[got] = true
			}
		})
	}
}

// TestLedgerRollbackNoFalseAlarm: concurrent claims on one replica return
// their tokens in any order while the check runs every millisecond; it
// never stops a ledger that did not go back in time.
func TestLedgerRollbackNoFalseAlarm(t *testing.T) {
	t.Parallel()
	for _, backend := range []string{servertest.BackendSQLite, servertest.BackendPostgres} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			ts := servertest.Start(t, servertest.Options{Backend: backend, Tenants: []string{"acme"},
				Configure: func(c *server.Config) { c.LedgerCheckInterval = time.Millisecond }})
			c := newAPIClient(t, ts)
			tok := ts.Token(t, "acme", "keys:write")
			errs := make(chan error, 8)
			for w := range 8 {
				go func() {
					for i := range 40 {
						req, _ := http.NewRequest(http.MethodPost, fmt.Sprintf("%s/v1/keys/w%d-%d/claim", ts.URL(), w, i),
							strings.NewReader(`{"operation":"POST /x","lease_seconds":60}`))
						req.Header.Set("Authorization", "Bearer "+tok)
						req.Header.Set("Content-Type", "application/json")
						resp, err := http.DefaultClient.Do(req)
						if err != nil {
							errs <- err
							return
						}
						resp.Body.Close()
						if resp.StatusCode != http.StatusCreated {
							errs <- fmt.Errorf("claim w%d-%d: %d", w, i, resp.StatusCode)
							return
						}
					}
					errs <- nil
				}()
			}
			for range 8 {
				require.NoError(t, <-errs)
			}
			require.Equal(t, http.StatusOK, readyStatus(t, ts))
			require.Equal(t, 0.0, c.metric(t, "idem_ledger_rollback_detections_total"))
		})
	}
}

// TestLedgerRollbackSeenAtReconnect: the failover case. The store goes
// away (PostgreSQL's path cut, SQLite's file moved away), comes back
// rolled back, and the very first claim after it is refused with 503
// store_unavailable: the check runs before the first claim once a call
// found the store unreachable, not only every IDEM_LEDGER_CHECK_INTERVAL
// (an hour here).
func TestLedgerRollbackSeenAtReconnect(t *testing.T) {
	t.Parallel()
	bothBackends(t, func(t *testing.T, backend string) {
		opts := servertest.Options{Backend: backend, Tenants: []string{"acme"},
			Configure: func(c *server.Config) {
				c.LedgerCheckInterval = time.Hour
				c.StoreTimeout = 2 * c.StoreTimeout / 5
			}}
		var cut, rollBackAndRestore func(token int64)
		if backend == servertest.BackendPostgres {
			url, proxy := cutproxy.Postgres(t)
			opts.DatabaseURL = url
			direct, err := neturl.Parse(url)
			require.NoError(t, err)
			base, err := neturl.Parse(pgtest.ServerURL(t))
			require.NoError(t, err)
			direct.Host = base.Host
			cut = func(int64) { proxy.Cut() }
			rollBackAndRestore = func(token int64) { rollBackLedger(t, direct.String(), token); proxy.Restore() }
		}
		ts := servertest.Start(t, opts)
		if backend == servertest.BackendSQLite {
			path := strings.TrimPrefix(ts.Config().DatabaseURL, "sqlite:")
			cut = func(int64) { require.NoError(t, os.Rename(path, path+".away")) }
			// Back in place, then rolled back before the server's next
			// call (its -wal file stays at the path, so the file cannot be
			// written while away).
			rollBackAndRestore = func(token int64) {
				require.NoError(t, os.Rename(path+".away", path))
				rollBackLedger(t, ts.Config().DatabaseURL, token)
			}
		}
		c := newAPIClient(t, ts)
		tok := ts.Token(t, "acme", "keys:write")
		claim := func(key string) (int, map[string]any) {
			status, body, _ := c.call(t, http.MethodPost, "/v1/keys/"+key+"/claim", tok, `{"fingerprint":"fp"}`)
			return status, body
		}
		for i := 1; i <= 5; i++ {
			status, body := claim(fmt.Sprintf("k%d", i))
			require.Equal(t, http.StatusCreated, status, "%v", body)
		}
		cut(0)
		status, _ := claim("during")
		require.Equal(t, http.StatusServiceUnavailable, status)
		rollBackAndRestore(2)

		// The first answer the store gives again is the refusal.
		var body map[string]any
		require.Eventually(t, func() bool {
			status, body = claim("k5")
			return status != http.StatusServiceUnavailable || strings.Contains(fmt.Sprint(body["detail"]), "went back in time")
		}, 20*time.Second, 20*time.Millisecond)
		require.Equal(t, http.StatusServiceUnavailable, status, "the lost key ran again: %v", body)
		require.Contains(t, body["detail"], "went back in time")
		require.Equal(t, http.StatusServiceUnavailable, readyStatus(t, ts))
		require.Equal(t, 1.0, c.metric(t, "idem_ledger_rollback_detections_total"))
	})
}
