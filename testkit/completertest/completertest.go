// Package completertest makes keys that idem's completer holds, for tests
// of what a claim of such a key answers (the front doors' rule 8): a real
// server whose completer runs fast, and a registered resume endpoint that
// never finishes a key. It answers "review" for a key whose name contains
// "review" (the completer gives up on it at once) and "unknown, ask again
// after RetryAfter" for any other (the completer keeps it held).
package completertest

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem/server"
	"github.com/idem-dev/idem/testkit/servertest"
)

// Configure makes the server's completer pick orphans at once and allows
// a resume endpoint on loopback; use it as servertest.Options.Configure.
func Configure(cfg *server.Config) {
	cfg.Webhooks.AllowPrivate = true
	cfg.Completer.Interval = 100 * time.Millisecond
	cfg.Completer.Timeout = 5 * time.Second
	cfg.Completer.BackoffBase = 50 * time.Millisecond
	cfg.Completer.BackoffCap = 200 * time.Millisecond
}

// Endpoint is a registered resume endpoint that never resumes a key.
type Endpoint struct {
	// RetryAfter is the retry_after_seconds of its unknown answers: the
	// completer's next attempt, and the Retry-After a claim gets.
	RetryAfter time.Duration

	srv   *httptest.Server
	mu    sync.Mutex
	calls map[string]int
}

// Register starts the endpoint and registers it as the completer of
// tenant on srv (a server started with Configure).
func Register(t *testing.T, srv *servertest.Server, tenant string, retryAfter time.Duration) *Endpoint {
	t.Helper()
	e := &Endpoint{RetryAfter: retryAfter, calls: map[string]int{}}
	e.srv = httptest.NewServer(http.HandlerFunc(e.serve))
	t.Cleanup(e.srv.Close)
	body, err := json.Marshal(map[string]any{"url": e.srv.URL + "/resume"})
	require.NoError(t, err)
	res := do(t, http.MethodPost, srv.URL()+"/v1/completers", srv.Token(t, tenant, "tenant:admin"), body)
	require.Equal(t, http.StatusCreated, res.status, res.body)
	return e
}

// serve answers a call: it does not check the signature (the SDKs' resume
// handlers are tested elsewhere); the key's name picks the answer.
func (e *Endpoint) serve(w http.ResponseWriter, r *http.Request) {
	var call struct {
		Key string `json:"key"`
	}
	_ = json.NewDecoder(r.Body).Decode(&call)
	e.mu.Lock()
	e.calls[call.Key]++
	e.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	if strings.Contains(call.Key, "review") {
		_, _ = io.WriteString(w, `{"outcome":"review","note":"the payment provider cannot say whether the charge went through"}`)
		return
	}
	_ = json.NewEncoder(w).Encode(map[string]any{"outcome": "unknown", "retry_after_seconds": e.RetryAfter.Seconds()})
}

// Calls is how many times the completer called the endpoint for key.
func (e *Endpoint) Calls(key string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.calls[key]
}

// Record is what the API shows of a key the completer took.
type Record struct {
	State        string `json:"state"`
	Attempt      int    `json:"attempt"`
	FencingToken int64  `json:"fencing_token"`
	Completer    *struct {
		State    string `json:"state"`
		Attempts int    `json:"attempts"`
	} `json:"completer"`
}

// Get reads key's record of tenant through the API.
func Get(t *testing.T, srv *servertest.Server, tenant, key string) Record {
	t.Helper()
	res := do(t, http.MethodGet, srv.URL()+"/v1/keys/"+key, srv.Token(t, tenant, "keys:read"), nil)
	require.Equal(t, http.StatusOK, res.status, res.body)
	var rec Record
	require.NoError(t, json.Unmarshal([]byte(res.body), &rec))
	return rec
}

// WaitHeld waits until the completer holds key in state ("unknown" or
// "review") and returns its record.
func WaitHeld(t *testing.T, srv *servertest.Server, tenant, key, state string) Record {
	t.Helper()
	var rec Record
	require.Eventually(t, func() bool {
		rec = Get(t, srv, tenant, key)
		return rec.Completer != nil && rec.Completer.State == state
	}, 30*time.Second, 20*time.Millisecond, "the completer holds %s in state %s", key, state)
	return rec
}

// Release is a person's resolution of a key in review: released, so the
// next retry runs the request.
func Release(t *testing.T, srv *servertest.Server, tenant, key string) {
	t.Helper()
	rec := Get(t, srv, tenant, key)
	body, err := json.Marshal(map[string]any{"action": "release", "fencing_token": rec.FencingToken, "note": "checked with the payment provider: no charge"})
	require.NoError(t, err)
	res := do(t, http.MethodPost, srv.URL()+"/v1/keys/"+key+"/resolve", srv.Token(t, tenant, "tenant:admin"), body)
	require.Equal(t, http.StatusOK, res.status, res.body)
}

type reply struct {
	status int
	body   string
}

func do(t *testing.T, method, url, token string, body []byte) reply {
	t.Helper()
	req, err := http.NewRequest(method, url, bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return reply{resp.StatusCode, string(b)}
}
