package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// outcome is one request of the load, as the client saw it.
type outcome struct {
	kind  string // "claim" or "complete"
	key   string
	res   result
	err   error
	sent  storedResponse // for complete
	token int64          // for a 201 claim
}

// SIGTERM while the server is under load: every request either gets a
// whole answer or never reached the service (and had no effect), granted
// claims are stored in full, completed responses replay, and the process
// exits 0 within its grace period.
func TestSIGTERMUnderLoad(t *testing.T) {
	t.Parallel()
	for _, backend := range []string{"sqlite", "postgres"} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			const grace = 10 * time.Second
			env := backendEnv(t, backend, map[string]string{"IDEM_SHUTDOWN_GRACE": grace.String(), "IDEM_LOG_LEVEL": "info"})
			mustCLI(t, env, "tenant", "create", "acme")
			tok := mintToken(t, env, "acme", "keys:write")
			srv := startServer(t, env)
			c := newClient(false) // a new connection per request: no idle keep-alive races

			var (
				mu       sync.Mutex
				outcomes []outcome
				answered atomic.Int64
			)
			record := func(o outcome) {
				mu.Lock()
				outcomes = append(outcomes, o)
				mu.Unlock()
				if o.err == nil {
					answered.Add(1)
				}
			}

			// A slow request: headers sent before SIGTERM, body finished
			// after it. The server must wait for it and answer it.
			sigSent := make(chan struct{})
			headersOut := make(chan struct{})
			slowDone := make(chan outcome, 1)
			go func() {
				pr, pw := io.Pipe()
				ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
					WroteHeaders: func() { close(headersOut) },
				})
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.url+"/v1/keys/slow-key/claim", pr)
				req.Header.Set("Authorization", "Bearer "+tok)
				req.Header.Set("Content-Type", "application/json")
				go func() {
					_, _ = io.WriteString(pw, `{"operation":"POST /v1/slow",`)
					<-sigSent
					time.Sleep(500 * time.Millisecond)
					_, _ = io.WriteString(pw, `"fingerprint":"slow"}`)
					_ = pw.Close()
				}()
				o := outcome{kind: "claim", key: "slow-key"}
				resp, err := c.Do(req)
				if err == nil {
					body, rerr := io.ReadAll(resp.Body)
					_ = resp.Body.Close()
					o.res, o.err = result{status: resp.StatusCode, header: resp.Header, body: body}, rerr
				} else {
					o.err = err
				}
				slowDone <- o
			}()

			// The load: workers claim fresh keys and complete them until
			// the server refuses connections.
			var wg sync.WaitGroup
			for w := range 12 {
				wg.Go(func() {
					for i := 0; ; i++ {
						key := fmt.Sprintf("w%d-%d", w, i)
						res, err := call(c, http.MethodPost, srv.url+"/v1/keys/"+key+"/claim", tok,
							map[string]any{"operation": "POST /v1/orders", "fingerprint": "fp-" + key})
						o := outcome{kind: "claim", key: key, res: res, err: err}
						if err == nil && res.status == http.StatusCreated {
							o.token = decodeRecord(t, res.body).FencingToken
						}
						record(o)
						if err != nil {
							if refused(err) {
								return
							}
							continue
						}
						if res.status != http.StatusCreated {
							continue
						}
						sent := storedResponse{Status: 201, Headers: map[string]string{"Content-Type": "application/json"},
							Body: fmt.Sprintf(`{"order":%q}`, key), BodyEncoding: "utf8"}
						res, err = call(c, http.MethodPost, srv.url+"/v1/keys/"+key+"/complete", tok,
							map[string]any{"fencing_token": o.token, "response": sent})
						record(outcome{kind: "complete", key: key, res: res, err: err, sent: sent})
						if err != nil && refused(err) {
							return
						}
					}
				})
			}

			// Let the load run, then SIGTERM mid-load.
			select {
			case <-headersOut:
			case <-time.After(10 * time.Second):
				t.Fatal("the slow request never sent its headers")
			}
			deadline := time.Now().Add(20 * time.Second)
			for answered.Load() < 200 && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			require.GreaterOrEqual(t, answered.Load(), int64(200), "the load did not get going")
			sigAt := time.Now()
			require.NoError(t, srv.cmd.Process.Signal(syscall.SIGTERM))
			close(sigSent)
			code := srv.wait(t, grace+5*time.Second)
			took := time.Since(sigAt)
			t.Logf("process exited %d after %s", code, took)

			waitDone := make(chan struct{})
			go func() { wg.Wait(); close(waitDone) }()
			select {
			case <-waitDone:
			case <-time.After(30 * time.Second):
				t.Fatal("load workers did not stop after the server went away")
			}
			slow := <-slowDone
			if slow.err == nil && slow.res.status == http.StatusCreated {
				slow.token = decodeRecord(t, slow.res.body).FencingToken
			}
			outcomes = append(outcomes, slow)

			require.Equal(t, 0, code, "exit code after SIGTERM")
			require.Less(t, took, grace, "the process must exit within its grace period")
			require.Contains(t, srv.stderr.String(), "stopped cleanly")

			require.NoError(t, slow.err, "the request in flight at SIGTERM must be answered")
			require.Equal(t, http.StatusCreated, slow.res.status, string(slow.res.body))

			// Classify what the clients saw.
			var refusedN, unsentN int
			for _, o := range outcomes {
				switch {
				case o.err == nil:
					require.NotZero(t, o.res.status)
					require.NotEmpty(t, o.res.body, "%s %s: empty answer", o.kind, o.key)
				case refused(o.err):
					refusedN++
				case strings.Contains(o.err.Error(), "read body of a"):
					t.Errorf("%s %s: answer cut mid-response: %v", o.kind, o.key, o.err)
				default:
					// Accepted by the kernel but never by the server (the
					// listen backlog at close): checked below to have had no
					// effect.
					unsentN++
					t.Logf("%s %s: dropped before being accepted: %v", o.kind, o.key, o.err)
				}
			}
			t.Logf("%d requests: %d answered, %d refused, %d dropped before being accepted", len(outcomes), answered.Load()+1, refusedN, unsentN)

			// After a restart every granted claim is stored in full and
			// every 200 complete replays.
			srv = startServer(t, env)
			rc := newClient(true)
			completed := map[string]outcome{}
			failedComplete := map[string]bool{}
			for _, o := range outcomes {
				if o.kind == "complete" {
					if o.err == nil {
						require.Equal(t, http.StatusOK, o.res.status, "%s: %s", o.key, o.res.body)
						completed[o.key] = o
					} else {
						failedComplete[o.key] = true
					}
				}
			}
			for _, o := range outcomes {
				if o.kind != "claim" {
					continue
				}
				got := mustCall(t, rc, http.MethodGet, srv.url+"/v1/keys/"+o.key, tok, nil)
				if o.err != nil {
					require.Equal(t, http.StatusNotFound, got.status, "claim %s failed on the wire (%v) but was stored: %s", o.key, o.err, got.body)
					continue
				}
				if o.res.status != http.StatusCreated {
					continue
				}
				require.Equal(t, http.StatusOK, got.status, "granted claim %s is missing: %s", o.key, got.body)
				rec := decodeRecord(t, got.body)
				require.Equal(t, o.token, rec.FencingToken, o.key)
				require.Equal(t, 1, rec.Attempt, o.key)
				if done, ok := completed[o.key]; ok {
					require.Equal(t, "completed", rec.State, o.key)
					rep := mustCall(t, rc, http.MethodPost, srv.url+"/v1/keys/"+o.key+"/claim", tok,
						map[string]any{"operation": "POST /v1/orders", "fingerprint": "fp-" + o.key})
					require.Equal(t, http.StatusOK, rep.status, string(rep.body))
					r := decodeRecord(t, rep.body)
					require.NotNil(t, r.Response)
					require.Equal(t, done.sent, *r.Response, o.key)
				} else {
					require.Equal(t, "in_flight", rec.State, "key %s: no complete was answered, so none may be stored (failed on the wire: %v)", o.key, failedComplete[o.key])
				}
			}
			code, _ = srv.stop(t, syscall.SIGTERM, grace+5*time.Second)
			require.Equal(t, 0, code)
		})
	}
}

// refused reports a connection refused: the request never reached a server.
func refused(err error) bool {
	return errors.Is(err, syscall.ECONNREFUSED)
}
