package e2e

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	_ "modernc.org/sqlite"
)

// rollBack puts the ledger's database back to the moment its token source
// stood at token (the source set back, later records gone), as a failover
// to a standby that had replayed up to then leaves it.
func rollBack(t *testing.T, url string, token int64) {
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

// TestCLILedgerAcknowledgeRollback: the real binary, both stores. After the
// database went back from token 4 to token 1, serve answers 503
// store_unavailable on /readyz and claims; `ledger status` shows the
// recorded rollback; `ledger acknowledge-rollback` refuses without --yes,
// and with it writes an audit line, moves the token source past 4 and the
// server takes claims again with tokens never given out before. Before
// the rollback check /readyz stayed 200 and the lost key's claim got 201
// with token 2, already given to another key.
func TestCLILedgerAcknowledgeRollback(t *testing.T) {
	t.Parallel()
	for _, backend := range []string{"sqlite", "postgres"} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			env := backendEnv(t, backend, map[string]string{"IDEM_LEDGER_CHECK_INTERVAL": "20ms"})
			mustCLI(t, env, "tenant", "create", "acme")
			srv := startServer(t, env)
			c := newClient(true)
			tok := mintToken(t, env, "acme", "keys:write")
			for i := 1; i <= 4; i++ {
				claimAndComplete(t, c, srv.url, tok, fmt.Sprintf("order-%d", i), `{"id":"ord"}`)
			}
			rollBack(t, env["IDEM_DATABASE_URL"], 1)

			ready := func() int { return mustCall(t, c, http.MethodGet, srv.url+"/readyz", "", nil).status }
			require.Eventually(t, func() bool { return ready() == http.StatusServiceUnavailable }, 15*time.Second, 20*time.Millisecond,
				"serve did not notice the database went back in time")
			res := mustCall(t, c, http.MethodPost, srv.url+"/v1/keys/order-4/claim", tok, map[string]any{"operation": "POST /v1/orders"})
			require.Equal(t, http.StatusServiceUnavailable, res.status, "the lost key ran again: %s", res.body)
			require.Equal(t, "store_unavailable", problemCode(res.body))
			require.Eventually(t, func() bool { return strings.Contains(srv.stderr.String(), "ledger rollback recorded") }, 15*time.Second, 20*time.Millisecond)
			require.Contains(t, srv.stderr.String(), "LEDGER ROLLBACK DETECTED")

			var st struct {
				Source int64 `json:"source_token"`
				Open   int   `json:"open_rollbacks"`
				Seen   int64 `json:"open_seen_token"`
			}
			require.NoError(t, json.Unmarshal([]byte(mustCLI(t, env, "ledger", "status")), &st))
			require.Equal(t, 1, st.Open)
			require.Equal(t, int64(4), st.Seen)
			require.Less(t, st.Source, int64(4))

			_, errOut, code := runCLI(t, env, "ledger", "acknowledge-rollback")
			require.Equal(t, 2, code, errOut)
			require.Contains(t, errOut, "--yes")
			require.Equal(t, http.StatusServiceUnavailable, ready(), "nothing acknowledged without --yes")

			out, errOut, code := runCLI(t, env, "ledger", "acknowledge-rollback", "--yes", "--by", "alice")
			require.Equal(t, 0, code, errOut)
			require.Contains(t, errOut, `"msg":"ledger rollback acknowledged"`)
			require.Contains(t, errOut, `"by":"alice"`)
			var ack struct {
				Acknowledged []struct {
					Seen int64  `json:"seen_token"`
					By   string `json:"acknowledged_by"`
				} `json:"acknowledged"`
				Source int64 `json:"source_token"`
			}
			require.NoError(t, json.Unmarshal([]byte(out), &ack), out)
			require.Len(t, ack.Acknowledged, 1)
			require.Equal(t, int64(4), ack.Acknowledged[0].Seen)
			require.Equal(t, "alice", ack.Acknowledged[0].By)
			require.GreaterOrEqual(t, ack.Source, int64(4))

			require.Eventually(t, func() bool { return ready() == http.StatusOK }, 15*time.Second, 20*time.Millisecond)
			res = mustCall(t, c, http.MethodPost, srv.url+"/v1/keys/order-5/claim", tok, map[string]any{"operation": "POST /v1/orders"})
			require.Equal(t, http.StatusCreated, res.status, string(res.body))
			require.Greater(t, decodeRecord(t, res.body).FencingToken, int64(4), "a token given out before the rollback was given out again")
		})
	}
}
