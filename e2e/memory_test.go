package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// vmHWM returns the peak resident set size of process pid, in bytes, from
// /proc/PID/status.
func vmHWM(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	require.NoError(t, err)
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			require.NoError(t, err, line)
			return kb << 10
		}
	}
	t.Fatalf("no VmHWM in /proc/%d/status", pid)
	return 0
}

// Figures of the in-flight budget test: the budget the server runs with and
// the fixed overhead its peak RSS may add, independent of how many requests
// come: the Go runtime and binary, the garbage collector's headroom, store
// caches, and the buffers of the PostgreSQL pool's connections, which keep
// room for the largest message they carried (up to IDEM_DB_MAX_CONNS × the
// body size; measured peaks 149–251 MiB on PostgreSQL, 176–177 MiB on
// SQLite).
const (
	inflightBudget   = 64 << 20
	inflightOverhead = 256 << 20
	bigBodyBytes     = 8_000_000
	bigCompletes     = 100
)

// TestInflightBudgetBoundsMemory runs the scenario against the real
// binary: 100 concurrent completes of 8 MB each. The server admits what its
// in-flight budget holds and answers the rest 503 server_busy with
// Retry-After before reading their bodies; the clients retry after
// Retry-After. Every complete ends stored whole, none is answered otherwise,
// and the server's peak RSS (VmHWM) stays under the budget plus a fixed
// overhead (issue 9, item 8).
func TestInflightBudgetBoundsMemory(t *testing.T) {
	t.Parallel()
	for _, backend := range []string{"sqlite", "postgres"} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			env := backendEnv(t, backend, map[string]string{"IDEM_MAX_INFLIGHT_BYTES": strconv.Itoa(inflightBudget)})
			p := startServer(t, env)
			c := newClient(true)
			admin := mintToken(t, env, "", "admin")
			res := mustCall(t, c, http.MethodPost, p.url+"/v1/admin/tenants", admin,
				map[string]any{"id": "acme", "settings": map[string]any{"max_response_bytes": 8 << 20}})
			require.Equal(t, http.StatusCreated, res.status, string(res.body))
			tok := mintToken(t, env, "acme", "keys:write keys:read")

			tokens := make([]int64, bigCompletes)
			for i := range bigCompletes {
				res := mustCall(t, c, http.MethodPost, fmt.Sprintf("%s/v1/keys/big-%d/claim", p.url, i), tok,
					map[string]any{"operation": "op", "fingerprint": "fp", "lease_seconds": 600})
				require.Equal(t, http.StatusCreated, res.status, string(res.body))
				tokens[i] = decodeRecord(t, res.body).FencingToken
			}
			base := vmHWM(t, p.cmd.Process.Pid)

			payload := bytes.Repeat([]byte("x"), bigBodyBytes)
			var (
				tried, busy, transport atomic.Int64
				mu                     sync.Mutex
				unexpected             []string
				wg                     sync.WaitGroup
				start                  = make(chan struct{})
			)
			deadline := time.Now().Add(5 * time.Minute)
			for i := range bigCompletes {
				wg.Go(func() {
					// One connection per client, as 100 separate callers. They
					// send Expect: 100-continue, as a client of large bodies
					// should: a refused body is then never sent at all.
					// (TestInflightBudgetRefusesBeforeReading in package server
					// covers callers that send the body regardless.)
					cl := newClient(true)
					cl.Transport.(*http.Transport).ExpectContinueTimeout = 5 * time.Second
					defer cl.CloseIdleConnections()
					prefix := fmt.Appendf(nil, `{"fencing_token":%d,"response":{"status":200,"body":"`, tokens[i])
					suffix := []byte(`"}}`)
					<-start
					for time.Now().Before(deadline) {
						tried.Add(1)
						body := io.MultiReader(bytes.NewReader(prefix), bytes.NewReader(payload), bytes.NewReader(suffix))
						req, err := http.NewRequest(http.MethodPost, fmt.Sprintf("%s/v1/keys/big-%d/complete", p.url, i), body)
						require.NoError(t, err)
						req.ContentLength = int64(len(prefix) + len(payload) + len(suffix))
						req.Header.Set("Authorization", "Bearer "+tok)
						req.Header.Set("Content-Type", "application/json")
						req.Header.Set("Expect", "100-continue")
						resp, err := cl.Do(req)
						if err != nil {
							// The server may close the connection of a refused
							// body before the client finished sending it.
							transport.Add(1)
							time.Sleep(rand.N(2 * time.Second))
							continue
						}
						b, _ := io.ReadAll(resp.Body)
						_ = resp.Body.Close()
						switch {
						case resp.StatusCode == http.StatusOK:
							return
						case resp.StatusCode == http.StatusServiceUnavailable && problemCode(b) == "server_busy" &&
							resp.Header.Get("Content-Type") == "application/problem+json" && resp.Header.Get("Retry-After") != "":
							busy.Add(1)
							// Full jitter around Retry-After, as the client SDK
							// retries: the callers do not come back in lockstep.
							wait, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
							time.Sleep(rand.N(2 * time.Duration(wait) * time.Second))
						default:
							mu.Lock()
							unexpected = append(unexpected, fmt.Sprintf("big-%d: %d %s", i, resp.StatusCode, tail(string(b), 200)))
							mu.Unlock()
							return
						}
					}
					mu.Lock()
					unexpected = append(unexpected, fmt.Sprintf("big-%d: not completed before the deadline", i))
					mu.Unlock()
				})
			}
			began := time.Now()
			close(start)
			wg.Wait()
			took := time.Since(began)
			peak := vmHWM(t, p.cmd.Process.Pid)
			t.Logf("%s: %d completes of %d bytes, %d requests tried, %d answered 503 server_busy, %d transport errors, %d other answers, %s; "+
				"peak RSS %d MiB (before the completes %d MiB), budget %d MiB + overhead %d MiB",
				backend, bigCompletes, bigBodyBytes, tried.Load(), busy.Load(), transport.Load(), len(unexpected), took.Round(time.Millisecond),
				peak>>20, base>>20, inflightBudget>>20, inflightOverhead>>20)
			require.Less(t, peak, int64(inflightBudget+inflightOverhead),
				"peak RSS %d MiB is over the in-flight budget %d MiB plus %d MiB", peak>>20, inflightBudget>>20, inflightOverhead>>20)
			require.Empty(t, unexpected)

			// Nothing lost: every key is completed with its whole response.
			res = mustCall(t, c, http.MethodGet, p.url+"/v1/keys?state=completed&limit=500", tok, nil)
			require.Equal(t, http.StatusOK, res.status, string(res.body))
			var page struct {
				Items []record `json:"items"`
			}
			require.NoError(t, json.Unmarshal(res.body, &page))
			require.Len(t, page.Items, bigCompletes)
			for _, i := range []int{0, bigCompletes / 2, bigCompletes - 1} {
				res := mustCall(t, c, http.MethodGet, fmt.Sprintf("%s/v1/keys/big-%d", p.url, i), tok, nil)
				require.Equal(t, http.StatusOK, res.status)
				r := decodeRecord(t, res.body)
				require.Equal(t, "completed", r.State)
				require.NotNil(t, r.Response)
				require.Len(t, r.Response.Body, bigBodyBytes)
			}
		})
	}
}
