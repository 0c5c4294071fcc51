package client_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem/client"
)

// failingServer answers every request with status (and Retry-After when
// set) and counts the requests.
func failingServer(t *testing.T, status int, retryAfter string) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		if retryAfter != "" {
			w.Header().Set("Retry-After", retryAfter)
		}
		w.Header().Set("Content-Type", "application/problem+json")
		w.Header().Set("X-Request-Id", "req-1")
		w.WriteHeader(status)
		fmt.Fprintf(w, `{"type":"/docs/errors#x","title":"%s","status":%d,"detail":"injected","code":"store_unavailable","retryable":true}`, http.StatusText(status), status)
	}))
	t.Cleanup(srv.Close)
	return srv, &n
}

func newTestClient(t *testing.T, url string, p client.RetryPolicy, opts ...client.Option) (*client.Client, *fakeClock, *attempts) {
	t.Helper()
	clock := newFakeClock()
	at := &attempts{}
	opts = append([]client.Option{client.WithRetryPolicy(p), client.WithClock(clock), client.WithAttemptHook(at.hook), client.WithToken("t")}, opts...)
	c, err := client.New(url, opts...)
	require.NoError(t, err)
	return c, clock, at
}

func TestRetryAllowlist(t *testing.T) {
	t.Parallel()
	cases := []struct {
		status   int
		retry500 bool
		want     int64
	}{
		{408, false, 3}, {429, false, 3}, {502, false, 3}, {503, false, 3}, {504, false, 3},
		{500, false, 1}, {500, true, 3},
		{400, false, 1}, {401, false, 1}, {403, false, 1}, {404, false, 1}, {409, false, 1}, {413, false, 1}, {422, false, 1}, {501, false, 1},
	}
	for _, tc := range cases {
		t.Run(fmt.Sprintf("%d-retry500=%v", tc.status, tc.retry500), func(t *testing.T) {
			t.Parallel()
			srv, n := failingServer(t, tc.status, "")
			c, _, at := newTestClient(t, srv.URL, client.RetryPolicy{Retry500: tc.retry500})
			_, err := c.Get(context.Background(), "k")
			require.Error(t, err)
			require.Equal(t, tc.want, n.Load())
			var e *client.Error
			require.ErrorAs(t, err, &e)
			require.Equal(t, tc.status, e.Status)
			infos := at.all()
			require.Len(t, infos, int(tc.want))
			for i, info := range infos {
				require.Equal(t, i+1, info.Attempt)
				require.Equal(t, i+1 < int(tc.want), info.Retry)
			}
		})
	}
}

func TestRetryConnectionRefused(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	c, clock, at := newTestClient(t, "http://"+addr, client.RetryPolicy{})
	_, err = c.Get(context.Background(), "k")
	require.Error(t, err)
	require.Len(t, at.all(), 3)
	require.Len(t, clock.Sleeps(), 2)
	require.Equal(t, client.CodeUnknown, client.ErrorCode(err))
}

func TestRetryConnectionReset(t *testing.T) {
	t.Parallel()
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) < 3 {
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				if tc, ok := conn.(*net.TCPConn); ok {
					_ = tc.SetLinger(0) // RST instead of FIN
				}
				_ = conn.Close()
			}
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"key":"k","state":"completed","fencing_token":3,"attempt":1}`)
	}))
	t.Cleanup(srv.Close)
	c, _, at := newTestClient(t, srv.URL, client.RetryPolicy{})
	rec, err := c.Get(context.Background(), "k")
	require.NoError(t, err)
	require.Equal(t, int64(3), rec.FencingToken)
	require.Equal(t, int64(3), n.Load())
	require.Len(t, at.all(), 3)
}

func TestNoRetryOnTokenSourceError(t *testing.T) {
	t.Parallel()
	srv, n := failingServer(t, 503, "")
	boom := errors.New("vault down")
	c, err := client.New(srv.URL, client.WithTokenSource(func(context.Context) (string, error) { return "", boom }), client.WithClock(newFakeClock()))
	require.NoError(t, err)
	_, err = c.Get(context.Background(), "k")
	require.ErrorIs(t, err, boom)
	require.Zero(t, n.Load())
}

func TestRetryAfterSeconds(t *testing.T) {
	t.Parallel()
	srv, n := failingServer(t, 503, "7")
	c, clock, at := newTestClient(t, srv.URL, client.RetryPolicy{})
	_, err := c.Get(context.Background(), "k")
	require.ErrorIs(t, err, client.ErrStoreUnavailable)
	require.Equal(t, int64(3), n.Load())
	sleeps := clock.Sleeps()
	require.Len(t, sleeps, 2)
	for _, s := range sleeps {
		require.GreaterOrEqual(t, s, 7*time.Second)
		require.Less(t, s, 8*time.Second) // + RetryAfterJitter (1 s)
	}
	var e *client.Error
	require.ErrorAs(t, err, &e)
	require.Equal(t, 7*time.Second, e.RetryAfter)
	require.Equal(t, "req-1", e.RequestID)
	require.Equal(t, 2, len(filter(at.all(), func(i client.AttemptInfo) bool { return i.Retry })))
}

func TestRetryAfterHTTPDate(t *testing.T) {
	t.Parallel()
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		w.Header().Set("Retry-After", time.Now().Add(20*time.Second).UTC().Format(http.TimeFormat))
		w.WriteHeader(http.StatusTooManyRequests)
	}))
	t.Cleanup(srv.Close)
	c, clock, _ := newTestClient(t, srv.URL, client.RetryPolicy{MaxAttempts: 2, RetryAfterJitter: -1})
	_, err := c.Get(context.Background(), "k")
	require.Error(t, err)
	require.Equal(t, client.CodeUnknown, client.ErrorCode(err)) // not a problem+json body
	sleeps := clock.Sleeps()
	require.Len(t, sleeps, 1)
	// The HTTP-date has one-second resolution.
	require.InDelta(t, (20 * time.Second).Seconds(), sleeps[0].Seconds(), 1.5)
}

func TestDeadlineStopsLoopEarly(t *testing.T) {
	t.Parallel()
	t.Run("first wait does not fit", func(t *testing.T) {
		t.Parallel()
		srv, n := failingServer(t, 503, "5")
		c, clock, at := newTestClient(t, srv.URL, client.RetryPolicy{})
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		_, err := c.Get(ctx, "k")
		require.ErrorIs(t, err, client.ErrDeadlineTooClose)
		require.ErrorIs(t, err, client.ErrStoreUnavailable)
		require.Equal(t, int64(1), n.Load())
		require.Empty(t, clock.Sleeps())
		infos := at.all()
		require.Len(t, infos, 1)
		require.Equal(t, "deadline", infos[0].GiveUp)
	})
	t.Run("second wait does not fit", func(t *testing.T) {
		t.Parallel()
		srv, n := failingServer(t, 503, "2")
		c, clock, _ := newTestClient(t, srv.URL, client.RetryPolicy{MaxAttempts: 10, RetryAfterJitter: -1})
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
		defer cancel()
		_, err := c.Get(ctx, "k")
		require.ErrorIs(t, err, client.ErrDeadlineTooClose)
		require.Equal(t, int64(2), n.Load())
		require.Equal(t, []time.Duration{2 * time.Second}, clock.Sleeps())
	})
	t.Run("expired context", func(t *testing.T) {
		t.Parallel()
		srv, n := failingServer(t, 503, "")
		c, _, _ := newTestClient(t, srv.URL, client.RetryPolicy{})
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_, err := c.Get(ctx, "k")
		require.ErrorIs(t, err, context.Canceled)
		require.Zero(t, n.Load())
	})
}

func TestAttemptCap(t *testing.T) {
	t.Parallel()
	for _, max := range []int{1, 2, 5} {
		t.Run(fmt.Sprint(max), func(t *testing.T) {
			t.Parallel()
			srv, n := failingServer(t, 502, "")
			c, clock, at := newTestClient(t, srv.URL, client.RetryPolicy{MaxAttempts: max, BudgetCapacity: -1})
			_, err := c.Get(context.Background(), "k")
			require.Error(t, err)
			require.Equal(t, int64(max), n.Load())
			require.Len(t, clock.Sleeps(), max-1)
			infos := at.all()
			require.Equal(t, "attempts", infos[len(infos)-1].GiveUp)
		})
	}
}

func TestBudgetStopsRetriesUnderSustainedFailure(t *testing.T) {
	t.Parallel()
	var failing atomic.Bool
	failing.Store(true)
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		if failing.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		fmt.Fprint(w, `{"key":"k","state":"completed","fencing_token":1,"attempt":1}`)
	}))
	t.Cleanup(srv.Close)
	c, _, at := newTestClient(t, srv.URL, client.RetryPolicy{})
	ctx := context.Background()
	const calls = 20
	budgetErrs := 0
	for range calls {
		_, err := c.Get(ctx, "k")
		require.Error(t, err)
		if errors.Is(err, client.ErrRetryBudgetExhausted) {
			budgetErrs++
		}
	}
	// 20 first attempts + exactly the 10 retries the budget pays for.
	require.Equal(t, int64(calls+10), n.Load())
	require.Equal(t, 15, budgetErrs) // calls 1-5 used 2 retries each
	require.Less(t, c.RetryBudgetLeft(), 1.0)
	require.Equal(t, "budget", at.all()[len(at.all())-1].GiveUp)

	// Successes refill the bucket by 0.1 each.
	failing.Store(false)
	for range 10 {
		_, err := c.Get(ctx, "k")
		require.NoError(t, err)
	}
	require.InDelta(t, 1.0, c.RetryBudgetLeft(), 1e-9)
}

func TestPerAttemptTimeout(t *testing.T) {
	t.Parallel()
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		select {
		case <-r.Context().Done():
		case <-time.After(5 * time.Second):
		}
	}))
	t.Cleanup(srv.Close)
	c, _, at := newTestClient(t, srv.URL, client.RetryPolicy{AttemptTimeout: 300 * time.Millisecond})
	_, err := c.Get(context.Background(), "k")
	require.Error(t, err)
	var ne net.Error
	require.ErrorAs(t, err, &ne)
	require.True(t, ne.Timeout())
	// Under load an attempt may time out before the server sees it, so the
	// attempts are counted on the client side.
	require.LessOrEqual(t, n.Load(), int64(3))
	infos := at.all()
	require.Len(t, infos, 3)
	for _, i := range infos {
		require.Error(t, i.Err)
		require.Zero(t, i.Status)
	}

	// The attempt timeout is cut to the time left before the deadline, and
	// the overall deadline is not reset per attempt.
	c2, _, at2 := newTestClient(t, srv.URL, client.RetryPolicy{AttemptTimeout: time.Hour})
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err = c2.Get(ctx, "k")
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Len(t, at2.all(), 1)
}

func TestErrorDetails(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/problem+json")
		w.Header().Set("Retry-After", "4")
		w.Header().Set("X-Request-Id", "abc")
		w.WriteHeader(http.StatusConflict)
		fmt.Fprint(w, `{"type":"/docs/errors#request_in_flight","title":"Request in flight","status":409,"detail":"key 'k' is being processed","code":"request_in_flight","retryable":true}`)
	}))
	t.Cleanup(srv.Close)
	c, _, at := newTestClient(t, srv.URL, client.RetryPolicy{})
	_, err := c.Claim(context.Background(), "k", client.Request{})
	require.ErrorIs(t, err, client.ErrRequestInFlight)
	require.NotErrorIs(t, err, client.ErrLeaseLost)
	var e *client.Error
	require.ErrorAs(t, err, &e)
	require.Equal(t, client.Error{Status: 409, Code: client.CodeRequestInFlight, Type: "/docs/errors#request_in_flight",
		Title: "Request in flight", Detail: "key 'k' is being processed", Retryable: true, RetryAfter: 4 * time.Second, RequestID: "abc"}, *e)
	require.Len(t, at.all(), 1, "409 is not on the retry allowlist")
	require.Contains(t, err.Error(), "request_in_flight")
}

func TestInvalidKeyIsLocal(t *testing.T) {
	t.Parallel()
	srv, n := failingServer(t, 503, "")
	c, _, _ := newTestClient(t, srv.URL, client.RetryPolicy{})
	_, err := c.Claim(context.Background(), "has space", client.Request{})
	require.ErrorIs(t, err, client.ErrInvalidKey)
	require.Zero(t, n.Load())
}

// TestThunderingHerd sends 500 concurrent calls that all get 503 at once.
// It asserts that the retries are spread over the jitter window rather than
// clustered, and that the number of attempts stays within the budget.
func TestThunderingHerd(t *testing.T) {
	t.Parallel()
	const callers = 500
	herdServer := func(t *testing.T, retryAfter string) (*httptest.Server, *atomic.Int64) {
		var n atomic.Int64
		release := make(chan struct{})
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			i := n.Add(1)
			if i <= callers {
				// The first round: every caller fails together.
				if i == callers {
					close(release)
				}
				<-release
				if retryAfter != "" {
					w.Header().Set("Retry-After", retryAfter)
				}
				w.WriteHeader(http.StatusServiceUnavailable)
				return
			}
			fmt.Fprint(w, `{"key":"k","state":"completed","fencing_token":1,"attempt":1}`)
		}))
		t.Cleanup(srv.Close)
		return srv, &n
	}
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: callers, MaxConnsPerHost: 0}}
	t.Cleanup(hc.CloseIdleConnections)

	run := func(t *testing.T, newClient func(i int) *client.Client) []error {
		errs := make([]error, callers)
		var wg sync.WaitGroup
		for i := range callers {
			c := newClient(i)
			wg.Go(func() { _, errs[i] = c.Get(context.Background(), "k") })
		}
		wg.Wait()
		return errs
	}
	waitsOf := func(at *attempts) []float64 {
		var out []float64
		for _, i := range at.all() {
			if i.Retry {
				out = append(out, i.Wait.Seconds())
			}
		}
		return out
	}

	t.Run("one shared client: one budget", func(t *testing.T) {
		t.Parallel()
		srv, n := herdServer(t, "")
		at := &attempts{}
		c, err := client.New(srv.URL, client.WithHTTPClient(hc), client.WithClock(newFakeClock()), client.WithAttemptHook(at.hook))
		require.NoError(t, err)
		errs := run(t, func(int) *client.Client { return c })
		failed := 0
		for _, err := range errs {
			if err != nil {
				require.ErrorIs(t, err, client.ErrRetryBudgetExhausted)
				failed++
			}
		}
		succeeded := callers - failed
		// Every retry is paid from the budget: its capacity (10) plus the
		// 0.1 refunded by each success. Retries that succeed are the only
		// successes here (every first attempt failed).
		retries := n.Load() - callers
		require.Equal(t, int64(succeeded), retries)
		require.LessOrEqual(t, float64(retries), 10+0.1*float64(succeeded)+1e-9)
		require.GreaterOrEqual(t, retries, int64(10))
		require.LessOrEqual(t, n.Load(), int64(callers+12), "attempts stay within the first attempts plus the budget")
		waits := waitsOf(at)
		require.Len(t, waits, int(retries))
		for _, w := range waits {
			require.GreaterOrEqual(t, w, 0.0)
			require.Less(t, w, 1.0)
		}
	})

	for _, tc := range []struct {
		name       string
		retryAfter string
		lo, hi     float64
	}{
		{"separate clients, backoff", "", 0, 1},
		{"separate clients, Retry-After", "1", 1, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv, n := herdServer(t, tc.retryAfter)
			at := &attempts{}
			clock := newFakeClock()
			errs := run(t, func(int) *client.Client {
				c, err := client.New(srv.URL, client.WithHTTPClient(hc), client.WithClock(clock), client.WithAttemptHook(at.hook))
				require.NoError(t, err)
				return c
			})
			for _, err := range errs {
				require.NoError(t, err)
			}
			// Each caller: one failed attempt, one retry that succeeds.
			require.Equal(t, int64(2*callers), n.Load())
			waits := waitsOf(at)
			require.Len(t, waits, callers)
			assertSpread(t, waits, tc.lo, tc.hi)
		})
	}
}

// assertSpread checks that waits lie in [lo, hi) and are spread over the
// window like a uniform draw: standard deviation near (hi-lo)/√12, a range
// covering most of the window, and no 50 ms slot holding more than a small
// share of the herd.
func assertSpread(t *testing.T, waits []float64, lo, hi float64) {
	t.Helper()
	width := hi - lo
	var sum, minW, maxW = 0.0, math.Inf(1), math.Inf(-1)
	for _, w := range waits {
		require.GreaterOrEqual(t, w, lo)
		require.Less(t, w, hi)
		sum += w
		minW, maxW = math.Min(minW, w), math.Max(maxW, w)
	}
	mean := sum / float64(len(waits))
	var ss float64
	for _, w := range waits {
		ss += (w - mean) * (w - mean)
	}
	std := math.Sqrt(ss / float64(len(waits)))
	require.InDelta(t, width/math.Sqrt(12), std, 0.25*width/math.Sqrt(12), "stddev of retry waits")
	require.Greater(t, maxW-minW, 0.9*width, "range of retry waits")
	slots := map[int]int{}
	for _, w := range waits {
		slots[int((w-lo)/0.05)]++
	}
	for slot, count := range slots {
		require.LessOrEqual(t, count, len(waits)/8, "slot %d is clustered", slot)
	}
}

func filter[T any](xs []T, keep func(T) bool) []T {
	var out []T
	for _, x := range xs {
		if keep(x) {
			out = append(out, x)
		}
	}
	return out
}

// TestHugeRetryAfterNeverWrapsAround: a Retry-After near the largest
// time.Duration (a hostile or broken server or proxy) plus the jitter
// wrapped around to a negative wait: the loop then retried at once instead
// of giving up on the deadline, and Do's wait for a key in flight claimed
// again and again without end (its waited time went negative).
func TestHugeRetryAfterNeverWrapsAround(t *testing.T) {
	t.Parallel()
	const huge = "9223372036" // math.MaxInt64 / time.Second
	t.Run("retry loop", func(t *testing.T) {
		t.Parallel()
		srv, n := failingServer(t, 503, huge)
		c, clock, _ := newTestClient(t, srv.URL, client.RetryPolicy{RetryAfterJitter: time.Hour})
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, err := c.Get(ctx, "k")
		require.ErrorIs(t, err, client.ErrDeadlineTooClose)
		require.Equal(t, int64(1), n.Load(), "no retry that the deadline cannot fit")
		require.Empty(t, clock.Sleeps())
	})
	t.Run("waiting for a key in flight", func(t *testing.T) {
		t.Parallel()
		var n atomic.Int64
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if n.Add(1) > 20 { // end a runaway loop
				w.WriteHeader(http.StatusBadRequest)
				return
			}
			w.Header().Set("Retry-After", huge)
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusConflict)
			fmt.Fprint(w, `{"type":"/docs/errors#request_in_flight","title":"In flight","status":409,"code":"request_in_flight","retryable":true}`)
		}))
		t.Cleanup(srv.Close)
		c, _, _ := newTestClient(t, srv.URL, client.RetryPolicy{RetryAfterJitter: time.Hour})
		_, err := c.Do(context.Background(), "k", client.Request{}, func(context.Context, *client.Claim) (client.Response, error) {
			t.Fatal("must not run")
			return client.Response{}, nil
		})
		require.ErrorIs(t, err, client.ErrRequestInFlight)
		require.Equal(t, int64(1), n.Load(), "the wait does not fit InFlightWait: one claim")
	})
}
