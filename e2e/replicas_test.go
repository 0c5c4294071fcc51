package e2e

import (
	"fmt"
	"net/http"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem/testkit/pgtest"
)

// Three server processes on one PostgreSQL schema: concurrent claims of one
// key spread over all three give exactly one winner.
func TestReplicasOnePostgresOneWinner(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.URL(t)
	env := map[string]string{"IDEM_DATABASE_URL": dbURL, "IDEM_JWT_HS256_SECRET": testSecret, "IDEM_DB_MAX_CONNS": "8"}
	mustCLI(t, env, "migrate")
	mustCLI(t, env, "tenant", "create", "acme")

	servers := []*proc{startServer(t, env), startServer(t, env), startServer(t, env)}
	tok := mintToken(t, env, "acme", "keys:write")
	c := newClient(true)

	const perServer = 30
	for k := range 4 {
		key := fmt.Sprintf("order-%d", k)
		var (
			mu       sync.Mutex
			statuses = map[int]int{}
			codes    = map[string]int{}
			winners  []record
			start    = make(chan struct{})
			wg       sync.WaitGroup
		)
		for _, s := range servers {
			for range perServer {
				wg.Go(func() {
					<-start
					res, err := call(c, http.MethodPost, s.url+"/v1/keys/"+key+"/claim", tok,
						map[string]any{"operation": "POST /v1/payments", "request": map[string]any{"amount": 1000, "n": k}})
					mu.Lock()
					defer mu.Unlock()
					if err != nil {
						t.Errorf("claim %s on %s: %v", key, s.url, err)
						return
					}
					statuses[res.status]++
					switch res.status {
					case http.StatusCreated:
						winners = append(winners, decodeRecord(t, res.body))
					case http.StatusConflict:
						codes[problemCode(res.body)]++
						if res.header.Get("Retry-After") == "" {
							t.Errorf("409 without Retry-After: %s", res.body)
						}
					}
				})
			}
		}
		close(start)
		wg.Wait()

		total := perServer * len(servers)
		require.Equal(t, map[int]int{http.StatusCreated: 1, http.StatusConflict: total - 1}, statuses, "key %s", key)
		require.Equal(t, map[string]int{"request_in_flight": total - 1}, codes, "key %s", key)
		require.Len(t, winners, 1)
		require.Equal(t, 1, winners[0].Attempt)

		// Every replica sees the same single record: attempt 1 with the
		// winner's fencing token.
		for _, s := range servers {
			res := mustCall(t, c, http.MethodGet, s.url+"/v1/keys/"+key, tok, nil)
			require.Equal(t, http.StatusOK, res.status, string(res.body))
			rec := decodeRecord(t, res.body)
			require.Equal(t, "in_flight", rec.State)
			require.Equal(t, 1, rec.Attempt)
			require.Equal(t, winners[0].FencingToken, rec.FencingToken)
		}
	}
}
