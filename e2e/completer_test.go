package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem/client"
)

// The completer (issue 24) against the real binary on both stores: a
// resume endpoint built with the Go SDK's ResumeHandler, running the same
// function the dead worker ran.

// completerEnv makes the real binary's completer fast for tests.
func completerEnv(t *testing.T, backend string, extra map[string]string) map[string]string {
	env := map[string]string{
		"IDEM_WEBHOOK_ALLOW_PRIVATE":  "1",
		"IDEM_COMPLETER_INTERVAL":     "100ms",
		"IDEM_COMPLETER_TIMEOUT":      "2s",
		"IDEM_COMPLETER_BACKOFF_BASE": "50ms",
		"IDEM_COMPLETER_BACKOFF_CAP":  "200ms",
		"IDEM_STORE_TIMEOUT":          "1s",
		"IDEM_ORPHAN_WATCH_INTERVAL":  "100ms",
		"IDEM_COMPLETER_MAX_ATTEMPTS": "8",
		"IDEM_COMPLETER_DEADLINE":     "1h",
		"IDEM_LEDGER_CHECK_INTERVAL":  "1s",
		"IDEM_TENANT_CACHE_TTL":       "0s",
		"IDEM_REAP_INTERVAL":          "1h",
		"IDEM_WEBHOOK_INTERVAL":       "1s",
	}
	for k, v := range extra {
		env[k] = v
	}
	return backendEnv(t, backend, env)
}

// resumeEndpoint is a loopback resume endpoint whose handler is set once
// the completer is registered (its secret comes with the registration).
type resumeEndpoint struct {
	srv     *httptest.Server
	handler atomic.Pointer[http.Handler]
	calls   atomic.Int64
}

func newResumeEndpoint(t *testing.T) *resumeEndpoint {
	e := &resumeEndpoint{}
	e.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e.calls.Add(1)
		h := e.handler.Load()
		if h == nil {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		(*h).ServeHTTP(w, r)
	}))
	t.Cleanup(e.srv.Close)
	return e
}

// registerCompleter registers the endpoint for the tenant of admin and
// returns the secret.
func registerCompleter(t *testing.T, c *http.Client, url, admin, endpoint string) string {
	t.Helper()
	res := mustCall(t, c, http.MethodPost, url+"/v1/completers", admin, map[string]any{"url": endpoint})
	require.Equal(t, http.StatusCreated, res.status, string(res.body))
	var out struct{ Secret string }
	require.NoError(t, json.Unmarshal(res.body, &out))
	require.True(t, strings.HasPrefix(out.Secret, "whsec_"))
	return out.Secret
}

// orderBook counts the external side effect (a charge) per key.
type orderBook struct {
	mu      sync.Mutex
	charges map[string]int
}

func (b *orderBook) charge(key string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.charges == nil {
		b.charges = map[string]int{}
	}
	b.charges[key]++
}

func (b *orderBook) count(key string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.charges[key]
}

// confirm is the application's work, shared by Do and the resume
// endpoint: charge once (skipped when the recovery point says it is
// done), checkpoint, answer.
func (b *orderBook) confirm(ctx context.Context, claim *client.Claim) (client.Response, error) {
	if claim.RecoveryPoint() != "charged" {
		b.charge(claim.Key())
		if err := claim.Checkpoint(ctx, "charged", map[string]string{"charge": "ch_" + claim.Key()}); err != nil {
			return client.Response{}, err
		}
	}
	return client.Response{Status: 201, Headers: map[string]string{"Content-Type": "application/json"},
		Body: []byte(`{"order":"` + claim.Key() + `","resumed":` + fmt.Sprint(claim.Resumed()) + `}`)}, nil
}

// dieAfterCharge is a worker killed after its first external call and its
// checkpoint: it claims with a 1 s lease, charges, checkpoints and never
// finishes. It returns its fencing token.
func dieAfterCharge(t *testing.T, c *http.Client, url, writer, key string, book *orderBook) int64 {
	t.Helper()
	res := mustCall(t, c, http.MethodPost, url+"/v1/keys/"+key+"/claim", writer,
		map[string]any{"operation": "POST /orders", "fingerprint": "fp-" + key, "lease_seconds": 1})
	require.Equal(t, http.StatusCreated, res.status, string(res.body))
	token := decodeRecord(t, res.body).FencingToken
	book.charge(key)
	res = mustCall(t, c, http.MethodPost, url+"/v1/keys/"+key+"/checkpoint", writer,
		map[string]any{"fencing_token": token, "recovery_point": "charged", "data": map[string]string{"charge": "ch_" + key}, "lease_seconds": 1})
	require.Equal(t, http.StatusOK, res.status, string(res.body))
	return token
}

// keyRecord reads a key's record with its completer member.
type keyRecord struct {
	State     string `json:"state"`
	Attempt   int    `json:"attempt"`
	Completer *struct {
		State    string `json:"state"`
		Attempts int    `json:"attempts"`
	} `json:"completer"`
	Review *struct {
		Note string `json:"note"`
	} `json:"review"`
	Response *storedResponse `json:"response"`
}

func getKey(t *testing.T, c *http.Client, url, tok, key string) keyRecord {
	t.Helper()
	res := mustCall(t, c, http.MethodGet, url+"/v1/keys/"+key, tok, nil)
	require.Equal(t, http.StatusOK, res.status, string(res.body))
	var r keyRecord
	require.NoError(t, json.Unmarshal(res.body, &r))
	return r
}

// auditActions lists a key's audit actions, oldest first.
func auditActions(t *testing.T, c *http.Client, url, tok, key string) []string {
	t.Helper()
	res := mustCall(t, c, http.MethodGet, url+"/v1/keys/"+key+"/audit?limit=100", tok, nil)
	require.Equal(t, http.StatusOK, res.status, string(res.body))
	var page struct {
		Items []struct {
			Action string `json:"action"`
		} `json:"items"`
	}
	require.NoError(t, json.Unmarshal(res.body, &page))
	out := []string{}
	for i := len(page.Items) - 1; i >= 0; i-- {
		out = append(out, page.Items[i].Action)
	}
	return out
}

// A worker that checkpointed after its charge and died is resumed by the
// completer through the SDK's ResumeHandler running the same function, and
// completed exactly once: one charge, the resumed answer replayed to the
// retry, the late worker fenced off with lease_lost.
func TestCompleterResumesDeadWorker(t *testing.T) {
	t.Parallel()
	for _, backend := range []string{"sqlite", "postgres"} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			env := completerEnv(t, backend, nil)
			mustCLI(t, env, "tenant", "create", "acme")
			admin := mintToken(t, env, "acme", "tenant:admin")
			writer := mintToken(t, env, "acme", "keys:write")
			reader := mintToken(t, env, "acme", "keys:read")
			srv := startServer(t, env)
			c := newClient(true)
			book := &orderBook{}

			ep := newResumeEndpoint(t)
			secret := registerCompleter(t, c, srv.url, admin, ep.srv.URL+"/resume")
			sdk, err := client.New(srv.url, client.WithToken(writer))
			require.NoError(t, err)
			var h http.Handler = sdk.ResumeHandler(secret, func(ctx context.Context, call client.ResumeCall, claim *client.Claim) (client.Response, error) {
				require.Equal(t, "POST /orders", call.Operation)
				require.Equal(t, "charged", call.RecoveryPoint)
				return book.confirm(ctx, claim)
			})
			ep.handler.Store(&h)

			stale := dieAfterCharge(t, c, srv.url, writer, "order-1", book)
			require.Eventually(t, func() bool {
				return getKey(t, c, srv.url, reader, "order-1").State == "completed"
			}, 20*time.Second, 50*time.Millisecond, "the completer drives the orphan to completed")

			require.Equal(t, 1, book.count("order-1"), "the charge happened once")
			require.EqualValues(t, 1, ep.calls.Load(), "one resume call")
			rec := getKey(t, c, srv.url, reader, "order-1")
			require.Nil(t, rec.Completer)
			require.Equal(t, 2, rec.Attempt, "taken over like a retry's takeover")
			require.Equal(t, `{"order":"order-1","resumed":true}`, rec.Response.Body)

			res := mustCall(t, c, http.MethodPost, srv.url+"/v1/keys/order-1/complete", writer,
				map[string]any{"fencing_token": stale, "response": map[string]any{"status": 200}})
			require.Equal(t, http.StatusConflict, res.status)
			require.Equal(t, "lease_lost", problemCode(res.body), "the late original worker is fenced off")

			res = mustCall(t, c, http.MethodPost, srv.url+"/v1/keys/order-1/claim", writer,
				map[string]any{"operation": "POST /orders", "fingerprint": "fp-order-1"})
			require.Equal(t, http.StatusOK, res.status, "the retry gets the replay: %s", res.body)
			require.Equal(t, []string{"completer_completed"}, auditActions(t, c, srv.url, admin, "order-1"))
		})
	}
}

// An endpoint that times out, errors and then answers unknown gets
// bounded attempts with the key held throughout (a retry meanwhile gets
// outcome_unknown, the key is listed and counted as unknown), then
// recovers and completes it; an endpoint that never recovers uses up the
// attempts and the key goes to review (outcome_review, listed, counted).
func TestCompleterUnknownBoundedThenReview(t *testing.T) {
	t.Parallel()
	for _, backend := range []string{"sqlite", "postgres"} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			env := completerEnv(t, backend, map[string]string{"IDEM_COMPLETER_TIMEOUT": "1s", "IDEM_COMPLETER_MAX_ATTEMPTS": "4"})
			mustCLI(t, env, "tenant", "create", "acme")
			admin := mintToken(t, env, "acme", "tenant:admin")
			writer := mintToken(t, env, "acme", "keys:write")
			operator := mintToken(t, env, "", "admin")
			srv := startServer(t, env)
			c := newClient(true)
			book := &orderBook{}

			ep := newResumeEndpoint(t)
			secret := registerCompleter(t, c, srv.url, admin, ep.srv.URL+"/resume")
			sdk, err := client.New(srv.url, client.WithToken(writer))
			require.NoError(t, err)
			// Per key, by call: a hang past the timeout, a 500, an unknown,
			// then the real function. The "doomed" key always errors.
			var mu sync.Mutex
			seen := map[string]int{}
			held := make(chan struct{})
			var heldOnce sync.Once
			// Before the endpoint closes (cleanups run last first): a failed
			// assertion must not leave the third call hanging.
			t.Cleanup(func() { heldOnce.Do(func() { close(held) }) })
			resume := sdk.ResumeHandler(secret, func(ctx context.Context, call client.ResumeCall, claim *client.Claim) (client.Response, error) {
				return book.confirm(ctx, claim)
			})
			var h http.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				body, _ := io.ReadAll(r.Body)
				var call struct{ Key string }
				_ = json.Unmarshal(body, &call)
				mu.Lock()
				seen[call.Key]++
				n := seen[call.Key]
				mu.Unlock()
				if call.Key == "doomed" {
					http.Error(w, "boom", http.StatusInternalServerError)
					return
				}
				switch n {
				case 1:
					<-r.Context().Done() // past the completer's timeout
					return
				case 2:
					http.Error(w, "boom", http.StatusInternalServerError)
					return
				case 3:
					<-held // the test has seen the key held
					w.Header().Set("Content-Type", "application/json")
					_, _ = io.WriteString(w, `{"outcome":"unknown","retry_after_seconds":0.1}`)
					return
				}
				r.Body = io.NopCloser(strings.NewReader(string(body)))
				resume.ServeHTTP(w, r)
			})
			ep.handler.Store(&h)

			dieAfterCharge(t, c, srv.url, writer, "slow", book)
			dieAfterCharge(t, c, srv.url, writer, "doomed", book)

			// While the completer holds "slow" (its second attempt failed,
			// the third waits), a retry gets outcome_unknown with a
			// Retry-After, and the key is listed and counted as unknown.
			require.Eventually(t, func() bool {
				mu.Lock()
				defer mu.Unlock()
				return seen["slow"] >= 3
			}, 60*time.Second, 20*time.Millisecond, "the hang and the 500 each wait out their attempt's lease (8 s)")
			res := mustCall(t, c, http.MethodPost, srv.url+"/v1/keys/slow/claim", writer,
				map[string]any{"operation": "POST /orders", "fingerprint": "fp-slow"})
			require.Equal(t, http.StatusConflict, res.status, string(res.body))
			require.Equal(t, "outcome_unknown", problemCode(res.body))
			require.NotEmpty(t, res.header.Get("Retry-After"))
			res = mustCall(t, c, http.MethodGet, srv.url+"/v1/keys?completer=unknown", writer, nil)
			require.Equal(t, http.StatusOK, res.status, string(res.body))
			require.Contains(t, string(res.body), `"key":"slow"`)
			page, err := sdk.List(t.Context(), client.ListOptions{Completer: "unknown"})
			require.NoError(t, err)
			var listed *client.Record
			for i := range page.Items {
				if page.Items[i].Key == "slow" {
					listed = &page.Items[i]
				}
			}
			require.NotNil(t, listed, "the SDK lists it too")
			require.NotNil(t, listed.Completer)
			require.Contains(t, []string{"resuming", "unknown"}, listed.Completer.State)
			require.Equal(t, 3, listed.Completer.Attempts)
			heldOnce.Do(func() { close(held) })

			require.Eventually(t, func() bool {
				return getKey(t, c, srv.url, writer, "slow").State == "completed"
			}, 20*time.Second, 50*time.Millisecond, "the endpoint recovers and the key completes")
			require.Equal(t, 1, book.count("slow"), "one charge whatever the attempts")
			mu.Lock()
			require.Equal(t, 4, seen["slow"], "four attempts: hang, 500, unknown, completed")
			mu.Unlock()
			require.Equal(t, []string{"completer_unknown", "completer_unknown", "completer_unknown", "completer_completed"},
				auditActions(t, c, srv.url, admin, "slow"), "every attempt is in the audit log")

			// "doomed" fails every attempt: review after four, never more.
			require.Eventually(t, func() bool {
				r := getKey(t, c, srv.url, writer, "doomed")
				return r.Completer != nil && r.Completer.State == "review"
			}, 20*time.Second, 50*time.Millisecond)
			rec := getKey(t, c, srv.url, writer, "doomed")
			require.Equal(t, 4, rec.Completer.Attempts)
			require.Contains(t, rec.Review.Note, "gave up after 4 attempts")
			mu.Lock()
			require.Equal(t, 4, seen["doomed"])
			mu.Unlock()
			res = mustCall(t, c, http.MethodPost, srv.url+"/v1/keys/doomed/claim", writer,
				map[string]any{"operation": "POST /orders", "fingerprint": "fp-doomed"})
			require.Equal(t, http.StatusConflict, res.status)
			require.Equal(t, "outcome_review", problemCode(res.body))
			require.Empty(t, res.header.Get("Retry-After"), "not retryable")
			res = mustCall(t, c, http.MethodGet, srv.url+"/v1/admin/orphans?completer=review", operator, nil)
			require.Equal(t, http.StatusOK, res.status, string(res.body))
			require.Contains(t, string(res.body), `"key":"doomed"`)
			require.Eventually(t, func() bool {
				res := mustCall(t, c, http.MethodGet, srv.url+"/metrics", "", nil)
				return strings.Contains(string(res.body), `idem_orphans_by_state{state="review"} 1`)
			}, 10*time.Second, 50*time.Millisecond, "review keys are counted")
			require.Equal(t, 1, book.count("doomed"), "never run again on a guess")
		})
	}
}

// Two replicas on one PostgreSQL share the completer's work on 64
// orphans, and one of them is killed with SIGKILL in the middle of it: every
// orphan is completed, each exactly once (one completer_completed audit
// entry, one charge), and the dead replica's unfinished attempts are taken
// again by the survivor after their lease, with a new fencing token.
func TestCompleterReplicasKill9(t *testing.T) {
	t.Parallel()
	env := completerEnv(t, "postgres", map[string]string{"IDEM_DB_MAX_CONNS": "8"})
	mustCLI(t, env, "tenant", "create", "acme")
	admin := mintToken(t, env, "acme", "tenant:admin")
	writer := mintToken(t, env, "acme", "keys:write")
	a, b := startServer(t, env), startServer(t, env)
	c := newClient(true)
	book := &orderBook{}

	ep := newResumeEndpoint(t)
	secret := registerCompleter(t, c, b.url, admin, ep.srv.URL+"/resume")
	// The endpoint writes through the survivor: its checkpoints must not
	// depend on the replica that called it.
	sdk, err := client.New(b.url, client.WithToken(writer))
	require.NoError(t, err)
	resume := sdk.ResumeHandler(secret, func(ctx context.Context, call client.ResumeCall, claim *client.Claim) (client.Response, error) {
		select { // slow enough that attempts are in flight when a replica dies
		case <-time.After(200 * time.Millisecond):
		case <-ctx.Done():
			return client.Response{}, ctx.Err()
		}
		return book.confirm(ctx, claim)
	})
	var h http.Handler = resume
	ep.handler.Store(&h)

	const n = 64
	keys := make([]string, n)
	for i := range n {
		keys[i] = fmt.Sprintf("order-%02d", i)
		srvURL := a.url
		if i%2 == 1 {
			srvURL = b.url
		}
		// The workers charge once in the resume path only: the dying
		// worker here claims and dies before its charge.
		res := mustCall(t, c, http.MethodPost, srvURL+"/v1/keys/"+keys[i]+"/claim", writer,
			map[string]any{"operation": "POST /orders", "fingerprint": "fp-" + keys[i], "lease_seconds": 1})
		require.Equal(t, http.StatusCreated, res.status, string(res.body))
	}
	require.Eventually(t, func() bool { return ep.calls.Load() >= 12 }, 30*time.Second, 10*time.Millisecond)
	code, _ := a.stop(t, syscall.SIGKILL, 10*time.Second)
	require.Equal(t, -1, code, "the replica must have died from SIGKILL")

	require.Eventually(t, func() bool {
		res := mustCall(t, c, http.MethodGet, b.url+"/v1/keys?state=completed&limit=100", writer, nil)
		var page struct{ Items []json.RawMessage }
		require.NoError(t, json.Unmarshal(res.body, &page))
		return len(page.Items) == n
	}, 60*time.Second, 100*time.Millisecond, "every orphan is completed by the survivor")
	for _, k := range keys {
		require.Equal(t, 1, book.count(k), "%s charged once", k)
		completed := 0
		for _, act := range auditActions(t, c, b.url, admin, k) {
			if act == "completer_completed" {
				completed++
			}
		}
		require.Equal(t, 1, completed, "%s completed once", k)
	}
	t.Logf("%d resume calls for %d orphans (the dead replica's unanswered attempts were made again)", ep.calls.Load(), n)
}
