package sdk_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"path"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/client"
	"github.com/idem-dev/idem/server"
	"github.com/idem-dev/idem/testkit/servertest"
)

// flakyFront is a reverse proxy in front of the real server that answers
// the first fail requests 503 store_unavailable itself (as a replica whose
// store is away would) and records every Idem-Attempt header it sees;
// the first failComplete completes, whenever they come, so too.
type flakyFront struct {
	mu           sync.Mutex
	fail         int
	failComplete int
	seen         []string
	handler      http.Handler
}

func newFlakyFront(t *testing.T, target string, fail int) (*flakyFront, string) {
	t.Helper()
	u, err := url.Parse(target)
	require.NoError(t, err)
	f := &flakyFront{fail: fail, handler: httputil.NewSingleHostReverseProxy(u)}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.seen = append(f.seen, r.Header.Get(client.HeaderAttempt))
		failing := f.fail > 0
		if failing {
			f.fail--
		} else if path.Base(r.URL.Path) == "complete" && f.failComplete > 0 {
			failing = true
			f.failComplete--
		}
		f.mu.Unlock()
		if failing {
			w.Header().Set("Content-Type", "application/problem+json")
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte(`{"type":"/docs/errors#store_unavailable","title":"Store unavailable","status":503,"detail":"the store does not answer","code":"store_unavailable","retryable":true}`))
			return
		}
		f.handler.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return f, srv.URL
}

func (f *flakyFront) headers() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.seen...)
}

// startBudgetServer starts the real server with a retry budget window of an
// hour (nothing leaves it during the test) and tenant acme at percent.
func startBudgetServer(t *testing.T, backend string, percent int) (*servertest.Server, string) {
	t.Helper()
	srv := servertest.Start(t, servertest.Options{Backend: backend,
		Configure: func(c *server.Config) { c.RetryBudgetWindow = time.Hour }})
	srv.CreateTenant(t, "acme", idem.SettingsPatch{RetryBudgetPercent: &percent})
	return srv, srv.Token(t, "acme", "keys:write", "keys:read")
}

// TestE2EAttemptHeader: every attempt of a call says which it is, and a
// retry why: the proxy fails the first two with 503, the third reaches the
// server and claims.
func TestE2EAttemptHeader(t *testing.T) {
	t.Parallel()
	for _, backend := range backends {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			srv, tok := startBudgetServer(t, backend, 100)
			front, base := newFlakyFront(t, srv.URL(), 2)
			c, err := client.New(base, client.WithToken(tok), client.WithRetryPolicy(fastPolicy))
			require.NoError(t, err)
			cr, err := c.Claim(context.Background(), "order-1", client.Request{Operation: "POST /orders", Payload: map[string]any{"n": 1}})
			require.NoError(t, err)
			require.Equal(t, client.StateInFlight, cr.State)
			require.Equal(t, []string{"1", "2;cause=unavailable", "3;cause=unavailable"}, front.headers())

			// A new logical call starts again at 1.
			_, err = c.Complete(context.Background(), "order-1", cr.FencingToken, confirmed)
			require.NoError(t, err)
			require.Equal(t, "1", front.headers()[3])

			// A front door passes its caller's attempt on: the claim says 4.
			ctx := client.WithAttempt(context.Background(), 4, client.CauseTimeout)
			_, err = c.Claim(ctx, "order-1", client.Request{Operation: "POST /orders", Payload: map[string]any{"n": 1}})
			require.NoError(t, err, "a replay")
			require.Equal(t, "4;cause=timeout", front.headers()[4])
		})
	}
}

// TestE2EFinishingWriteOutsideProcessBudget: with the client's own retry
// budget empty (one token, spent by a claim's retry; its next retry is
// refused with ErrRetryBudgetExhausted), Do's complete whose first attempt
// fails 503 store_unavailable is retried and stored: the record is
// completed, and the next Do replays it without running the work. Before
// the fix the complete was given up on the budget: the work ran
// unrecorded, its key in flight, to run again after the lease.
func TestE2EFinishingWriteOutsideProcessBudget(t *testing.T) {
	t.Parallel()
	for _, backend := range backends {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			srv, tok := startBudgetServer(t, backend, 100) // the fleet budget is no part of this
			front, base := newFlakyFront(t, srv.URL(), 2)
			front.mu.Lock()
			front.failComplete = 1
			front.mu.Unlock()
			p := fastPolicy
			p.BudgetCapacity, p.BudgetRetryCost, p.BudgetSuccessRefund = 1, 1, 0.1
			var mu sync.Mutex
			var completes []client.AttemptInfo
			c, err := client.New(base, client.WithToken(tok), client.WithRetryPolicy(p),
				client.WithAttemptHook(func(info client.AttemptInfo) {
					if info.Call == "complete" {
						mu.Lock()
						completes = append(completes, info)
						mu.Unlock()
					}
				}))
			require.NoError(t, err)
			req := client.Request{Operation: "POST /orders"}
			_, err = c.Claim(context.Background(), "drain", req)
			require.ErrorIs(t, err, client.ErrRetryBudgetExhausted, "the process budget is empty")

			runs := 0
			fn := func(context.Context, *client.Claim) (client.Response, error) { runs++; return confirmed, nil }
			res, err := c.Do(context.Background(), "order-1", req, fn)
			require.NoError(t, err, "the complete was retried")
			require.False(t, res.Replayed)
			mu.Lock()
			require.Len(t, completes, 2)
			require.True(t, completes[0].Retry)
			require.Empty(t, completes[0].GiveUp)
			mu.Unlock()
			rec, err := c.Get(context.Background(), "order-1")
			require.NoError(t, err)
			require.Equal(t, client.StateCompleted, rec.State)
			require.Equal(t, res.FencingToken, rec.FencingToken, "one claim")
			again, err := c.Do(context.Background(), "order-1", req, fn)
			require.NoError(t, err)
			require.True(t, again.Replayed)
			require.Equal(t, 1, runs, "the work ran once")
		})
	}
}

// TestE2EFleetBudgetStopsRetrying: when idem refuses a retry with 429
// retry_budget_exhausted, the client sends no further attempt, and its
// error carries the original cause (the 503 before it); the key is as it
// was, and a later call claims it.
func TestE2EFleetBudgetStopsRetrying(t *testing.T) {
	t.Parallel()
	for _, backend := range backends {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			srv, tok := startBudgetServer(t, backend, 0)
			// Use up the floor: 10 retries reach the server.
			raw, err := client.New(srv.URL(), client.WithToken(tok))
			require.NoError(t, err)
			for i := range 10 {
				hc := &http.Client{Timeout: 10 * time.Second}
				req, _ := http.NewRequest(http.MethodGet, srv.URL()+fmt.Sprintf("/v1/keys/warm-%d", i), nil)
				req.Header.Set("Authorization", "Bearer "+tok)
				req.Header.Set(client.HeaderAttempt, "2;cause=timeout")
				resp, err := hc.Do(req)
				require.NoError(t, err)
				_ = resp.Body.Close()
				require.Equal(t, http.StatusNotFound, resp.StatusCode)
			}

			front, base := newFlakyFront(t, srv.URL(), 1)
			c, err := client.New(base, client.WithToken(tok), client.WithRetryPolicy(client.RetryPolicy{MaxAttempts: 5, BaseDelay: 10 * time.Millisecond, RetryAfterJitter: -1}))
			require.NoError(t, err)
			_, err = c.Claim(context.Background(), "order-1", client.Request{Operation: "POST /orders", Payload: map[string]any{"n": 1}})
			require.Error(t, err)
			require.ErrorIs(t, err, client.ErrFleetBudgetExhausted)
			require.ErrorIs(t, err, client.ErrStoreUnavailable, "the original cause is in the error")
			require.Equal(t, client.CodeStoreUnavailable, client.ErrorCode(err))
			var fb *client.FleetBudgetError
			require.ErrorAs(t, err, &fb)
			require.Equal(t, client.CauseUnavailable, fb.Cause)
			require.Equal(t, 2, fb.Attempts)
			require.Equal(t, client.CodeRetryBudgetExhausted, fb.Refusal.Code)
			require.Positive(t, fb.Refusal.RetryAfter)
			require.Equal(t, []string{"1", "2;cause=unavailable"}, front.headers(), "no attempt after the refusal, though 5 were allowed")

			_, err = raw.Get(context.Background(), "order-1")
			require.ErrorIs(t, err, client.ErrKeyNotFound, "the refused retry stored nothing")
			cr, err := raw.Claim(context.Background(), "order-1", client.Request{Operation: "POST /orders", Payload: map[string]any{"n": 1}})
			require.NoError(t, err, "a later call claims the key")
			require.Equal(t, client.StateInFlight, cr.State)
		})
	}
}

// TestE2EPresets: the presets' numbers, and the interactive preset's
// overall deadline bounds a call whose context has none.
func TestE2EPresets(t *testing.T) {
	t.Parallel()
	in, bg := client.InteractivePolicy(), client.BackgroundPolicy()
	require.Equal(t, 10*time.Second, in.CallDeadline)
	require.Equal(t, 3, in.MaxAttempts)
	require.Equal(t, client.DefaultBudgetCapacity, in.BudgetCapacity)
	require.Equal(t, 10*time.Minute, bg.CallDeadline)
	require.Equal(t, 10, bg.MaxAttempts)
	require.Greater(t, bg.BudgetCapacity, in.BudgetCapacity)

	srv, tok := startBudgetServer(t, servertest.BackendSQLite, 100)
	front, base := newFlakyFront(t, srv.URL(), 1000)
	p := client.InteractivePolicy()
	p.CallDeadline = 300 * time.Millisecond // the preset's 10 s, shortened for the test
	p.MaxAttempts = 1000
	p.BaseDelay, p.MaxDelay, p.RetryAfterJitter = 10*time.Millisecond, 10*time.Millisecond, -1
	c, err := client.New(base, client.WithToken(tok), client.WithRetryPolicy(p))
	require.NoError(t, err)
	_, err = c.Claim(context.Background(), "order-1", client.Request{Operation: "POST /orders"})
	require.Error(t, err)
	require.ErrorIs(t, err, client.ErrStoreUnavailable, "the last attempt's error")
	// Each 503 says Retry-After: 1, longer than the whole call may take:
	// without the call deadline the loop would go on for 1000 attempts.
	require.Len(t, front.headers(), 1, "the call deadline ended the loop, not the attempt cap")
}

// spendFloor sends the floor's 10 retries of tenant acme (at percent 0)
// straight to the server: its fleet budget is spent from then on.
func spendFloor(t *testing.T, srv *servertest.Server, tok string) {
	t.Helper()
	hc := &http.Client{Timeout: 10 * time.Second}
	for i := range 10 {
		req, _ := http.NewRequest(http.MethodGet, srv.URL()+fmt.Sprintf("/v1/keys/warm-%d", i), nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		req.Header.Set(client.HeaderAttempt, "2;cause=timeout")
		resp, err := hc.Do(req)
		require.NoError(t, err)
		_ = resp.Body.Close()
		require.Equal(t, http.StatusNotFound, resp.StatusCode)
	}
}

// TestE2EFleetBudgetSignalStopsWaiting: once the tenant's budget is spent,
// the real server's 409 request_in_flight says so (Idem-Retry-Budget:
// exhausted) and Do sends no claim after it, though its in-flight wait
// would allow several: exactly one attempt reaches idem (counted at the
// proxy), the error is a *FleetBudgetError without a refusal whose
// original cause is the 409, and the holder's claim is untouched. Without
// the signal Do would wait and claim again, to be refused.
func TestE2EFleetBudgetSignalStopsWaiting(t *testing.T) {
	t.Parallel()
	for _, backend := range backends {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			srv, tok := startBudgetServer(t, backend, 0)
			raw, err := client.New(srv.URL(), client.WithToken(tok))
			require.NoError(t, err)
			held, err := raw.Claim(context.Background(), "held", client.Request{Operation: "POST /orders", Payload: map[string]any{"n": 1}})
			require.NoError(t, err)
			spendFloor(t, srv, tok)

			front, base := newFlakyFront(t, srv.URL(), 0)
			c, err := client.New(base, client.WithToken(tok), client.WithRetryPolicy(client.RetryPolicy{
				MaxAttempts: 5, BaseDelay: 10 * time.Millisecond, RetryAfterJitter: -1, InFlightWait: 30 * time.Second}))
			require.NoError(t, err)
			ran := false
			_, err = c.Do(context.Background(), "held", client.Request{Operation: "POST /orders", Payload: map[string]any{"n": 1}, NoWait: false},
				func(context.Context, *client.Claim) (client.Response, error) { ran = true; return confirmed, nil })
			require.Error(t, err)
			require.False(t, ran)
			require.ErrorIs(t, err, client.ErrFleetBudgetExhausted)
			require.ErrorIs(t, err, client.ErrRequestInFlight, "the original cause")
			var fb *client.FleetBudgetError
			require.ErrorAs(t, err, &fb)
			require.Nil(t, fb.Refusal, "stopped before any refusal")
			require.Equal(t, 1, fb.Attempts)
			require.Equal(t, client.CauseInFlight, fb.Cause)
			require.Len(t, front.headers(), 1, "no claim after the signal")

			rec, err := raw.Get(context.Background(), "held")
			require.NoError(t, err)
			require.Equal(t, client.StateInFlight, rec.State)
			_, err = raw.Complete(context.Background(), "held", held.FencingToken, confirmed)
			require.NoError(t, err, "the holder's claim is intact")
		})
	}
}

// TestE2EFleetBudgetSignalStopsRetrying: a 503 that says the budget is
// spent (a replica whose store is away answers it with the header, here
// the proxy) ends the call after that one attempt, though 5 were allowed,
// with the 503 as the original cause.
func TestE2EFleetBudgetSignalStopsRetrying(t *testing.T) {
	t.Parallel()
	srv, tok := startBudgetServer(t, servertest.BackendSQLite, 10)
	u, err := url.Parse(srv.URL())
	require.NoError(t, err)
	proxy := httputil.NewSingleHostReverseProxy(u)
	var mu sync.Mutex
	attempts := 0
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		attempts++
		n := attempts
		mu.Unlock()
		if n == 1 {
			w.Header().Set("Content-Type", "application/problem+json")
			w.Header().Set("Retry-After", "1")
			w.Header().Set(client.HeaderRetryBudget, "exhausted")
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte(`{"type":"/docs/errors#store_unavailable","title":"Store unavailable","status":503,"detail":"the store does not answer","code":"store_unavailable","retryable":true}`))
			return
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(front.Close)
	c, err := client.New(front.URL, client.WithToken(tok), client.WithRetryPolicy(client.RetryPolicy{MaxAttempts: 5, BaseDelay: 10 * time.Millisecond, RetryAfterJitter: -1}))
	require.NoError(t, err)
	_, err = c.Claim(context.Background(), "order-1", client.Request{Operation: "POST /orders"})
	require.ErrorIs(t, err, client.ErrFleetBudgetExhausted)
	require.ErrorIs(t, err, client.ErrStoreUnavailable)
	var fb *client.FleetBudgetError
	require.ErrorAs(t, err, &fb)
	require.Equal(t, client.CauseUnavailable, fb.Cause)
	require.Nil(t, fb.Refusal)
	mu.Lock()
	require.Equal(t, 1, attempts, "no retry after the signal")
	mu.Unlock()
	// The next call is a new one: it goes through.
	_, err = c.Claim(context.Background(), "order-1", client.Request{Operation: "POST /orders"})
	require.NoError(t, err)
}

// oldFront is a reverse proxy in front of the real server that answers the
// finishing writes (checkpoint, complete, release) it is given for their
// first attempts itself, as a server of before the fix did during a storm:
// a 503 store_unavailable that says the fleet budget is spent, and, when
// refuse is set, a 429 retry_budget_exhausted for the retry after it. It
// records the Idem-Attempt of every finishing write it sees, by call.
type oldFront struct {
	mu     sync.Mutex
	refuse bool
	seen   map[string][]string
}

func newOldFront(t *testing.T, target string, refuse bool) (*oldFront, string) {
	t.Helper()
	u, err := url.Parse(target)
	require.NoError(t, err)
	proxy := httputil.NewSingleHostReverseProxy(u)
	f := &oldFront{refuse: refuse, seen: map[string][]string{}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		call := path.Base(r.URL.Path)
		if call != "checkpoint" && call != "complete" && call != "release" {
			proxy.ServeHTTP(w, r)
			return
		}
		f.mu.Lock()
		f.seen[call] = append(f.seen[call], r.Header.Get(client.HeaderAttempt))
		n := len(f.seen[call])
		f.mu.Unlock()
		w.Header().Set("Content-Type", "application/problem+json")
		switch {
		case n == 1:
			w.Header().Set(client.HeaderRetryBudget, "exhausted")
			w.WriteHeader(http.StatusServiceUnavailable) // no Retry-After: the policy's backoff
			_, _ = w.Write([]byte(`{"type":"/docs/errors#store_unavailable","title":"Store unavailable","status":503,"detail":"the store does not answer","code":"store_unavailable","retryable":true}`))
		case n == 2 && f.refuse:
			w.Header().Set(client.HeaderRetryBudget, "exhausted")
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
			_, _ = w.Write([]byte(`{"type":"/docs/errors#retry_budget_exhausted","title":"Retry budget exhausted","status":429,"detail":"stop retrying this call","code":"retry_budget_exhausted","retryable":true}`))
		default:
			proxy.ServeHTTP(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	return f, srv.URL
}

// finishPolicy retries quickly; its call deadline turns a refusal of this
// server (Retry-After: the rest of its hour-long window) into an error, not
// a wait.
var finishPolicy = client.RetryPolicy{MaxAttempts: 5, BaseDelay: 10 * time.Millisecond, RetryAfterJitter: -1, CallDeadline: 30 * time.Second}

func (f *oldFront) attempts(call string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.seen[call]...)
}

// TestE2EFinishingWritesIgnoreFleetBudget: with the tenant's fleet budget
// spent (a claim's retry would be refused), Do's checkpoint and complete
// whose first attempt failed with a retryable 503 saying Idem-Retry-Budget:
// exhausted are retried, not given up, and the real server serves the
// retries: the work ran once, its answer is stored under the one claim,
// and the caller's next Do replays it instead of running the work again
// after the lease. Then the same for a release (fn without side effect):
// the key is free again. Before the fix the client stopped the complete
// with a *FleetBudgetError (the key orphaned, the work run again later),
// and the server refused the retry with 429 retry_budget_exhausted.
func TestE2EFinishingWritesIgnoreFleetBudget(t *testing.T) {
	t.Parallel()
	for _, backend := range backends {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			srv, tok := startBudgetServer(t, backend, 0)
			spendFloor(t, srv, tok)
			front, base := newOldFront(t, srv.URL(), false)
			c, err := client.New(base, client.WithToken(tok), client.WithRetryPolicy(finishPolicy))
			require.NoError(t, err)
			req := client.Request{Operation: "POST /orders", Payload: map[string]any{"n": 1}}
			runs := 0
			fn := func(ctx context.Context, claim *client.Claim) (client.Response, error) {
				runs++
				if err := claim.Checkpoint(ctx, "charged", nil); err != nil {
					return client.Response{}, err
				}
				return confirmed, nil
			}
			res, err := c.Do(context.Background(), "order-1", req, fn)
			require.NoError(t, err, "the finishing writes went on through the signal")
			require.False(t, res.Replayed)
			require.Equal(t, []string{"1", "2;cause=unavailable"}, front.attempts("checkpoint"))
			require.Equal(t, []string{"1", "2;cause=unavailable"}, front.attempts("complete"))

			rec, err := c.Get(context.Background(), "order-1")
			require.NoError(t, err)
			require.Equal(t, client.StateCompleted, rec.State)
			require.Equal(t, res.FencingToken, rec.FencingToken, "one claim")
			again, err := c.Do(context.Background(), "order-1", req, fn)
			require.NoError(t, err)
			require.True(t, again.Replayed, "the recorded answer replays")
			require.Equal(t, confirmed.Body, again.Response.Body)
			require.Equal(t, 1, runs, "the work ran once")

			// A release through the same signal frees the key.
			_, err = c.Do(context.Background(), "order-2", req, func(context.Context, *client.Claim) (client.Response, error) {
				return client.Response{}, fmt.Errorf("declined: %w", client.ErrNoSideEffect)
			})
			require.ErrorIs(t, err, client.ErrNoSideEffect)
			require.NotErrorIs(t, err, client.ErrFleetBudgetExhausted)
			require.Equal(t, []string{"1", "2;cause=unavailable"}, front.attempts("release"))
			_, err = c.Get(context.Background(), "order-2")
			require.ErrorIs(t, err, client.ErrKeyNotFound, "released")
		})
	}
}

// TestE2EFinishingWriteRetriesOldRefusal: an older server refuses a
// complete's retry with 429 retry_budget_exhausted (here the proxy, in
// front of the real server): the client waits its Retry-After and sends
// the complete again, which is stored; the work ran once.
func TestE2EFinishingWriteRetriesOldRefusal(t *testing.T) {
	t.Parallel()
	for _, backend := range backends {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			srv, tok := startBudgetServer(t, backend, 0)
			spendFloor(t, srv, tok)
			front, base := newOldFront(t, srv.URL(), true)
			c, err := client.New(base, client.WithToken(tok), client.WithRetryPolicy(finishPolicy))
			require.NoError(t, err)
			runs := 0
			res, err := c.Do(context.Background(), "order-1", client.Request{Operation: "POST /orders"}, func(context.Context, *client.Claim) (client.Response, error) {
				runs++
				return confirmed, nil
			})
			require.NoError(t, err)
			require.Equal(t, []string{"1", "2;cause=unavailable", "3;cause=throttled"}, front.attempts("complete"))
			rec, err := c.Get(context.Background(), "order-1")
			require.NoError(t, err)
			require.Equal(t, client.StateCompleted, rec.State)
			require.Equal(t, res.FencingToken, rec.FencingToken)
			require.Equal(t, 1, runs)
		})
	}
}
