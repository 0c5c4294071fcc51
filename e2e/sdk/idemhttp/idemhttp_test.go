package idemhttp_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/client"
	"github.com/idem-dev/idem/client/frontdoor"
	"github.com/idem-dev/idem/client/idemhttp"
	"github.com/idem-dev/idem/server"
	"github.com/idem-dev/idem/testkit/faultproxy"
	"github.com/idem-dev/idem/testkit/servertest"
	"github.com/idem-dev/idem/testvectors"
)

// app is a sample API whose POST /orders has a side effect it counts.
type app struct {
	orders  atomic.Int64
	fail    atomic.Int64 // answer 500 this many times first
	delay   time.Duration
	gate    chan struct{} // when set, the handler waits for it to close
	big     int           // answer a body of this many bytes instead
	entered atomic.Int64  // handler runs that got past the failure injection
	srv     *httptest.Server
}

func newApp(t *testing.T, c *client.Client, opts idemhttp.Options) *app {
	t.Helper()
	a := &app{}
	mw := idemhttp.Middleware(c, opts)
	r := http.NewServeMux()
	r.Handle("POST /orders/{customer}", mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if a.fail.Add(-1) >= 0 {
			http.Error(w, "boom", http.StatusInternalServerError)
			return
		}
		a.entered.Add(1)
		time.Sleep(a.delay)
		if a.gate != nil {
			<-a.gate
		}
		n := a.orders.Add(1)
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", fmt.Sprintf("/orders/%d", n))
		w.Header().Set("Set-Cookie", "session=secret")
		w.WriteHeader(http.StatusCreated)
		if a.big > 0 {
			fmt.Fprint(w, strings.Repeat("x", a.big))
			return
		}
		fmt.Fprintf(w, `{"order":%d,"customer":%q,"echo":%s}`, n, r.PathValue("customer"), body)
	})))
	r.Handle("GET /orders", mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "[]")
	})))
	a.srv = httptest.NewServer(r)
	t.Cleanup(a.srv.Close)
	return a
}

// hold makes the handler wait until release is called (or the test ends,
// so a failed test does not hang on the app's server closing).
func (a *app) hold(t *testing.T) (release func()) {
	a.gate = make(chan struct{})
	release = sync.OnceFunc(func() { close(a.gate) })
	t.Cleanup(release)
	return release
}

type reply struct {
	status int
	header http.Header
	body   string
}

func post(t *testing.T, url, key, body string) reply {
	t.Helper()
	return postWith(t, url, key, body, nil)
}

// postWith is post with extra request headers.
func postWith(t *testing.T, url, key, body string, header http.Header) reply {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	require.NoError(t, err)
	for k, vs := range header {
		req.Header[k] = vs
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set(idemhttp.HeaderKey, key)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return reply{resp.StatusCode, resp.Header, string(b)}
}

func problemCode(t *testing.T, r reply) string {
	t.Helper()
	require.Equal(t, "application/problem+json", r.header.Get("Content-Type"))
	var p struct {
		Code string `json:"code"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.body), &p))
	return p.Code
}

// problemDetail is the detail of a problem answer.
func problemDetail(t *testing.T, r reply) string {
	t.Helper()
	var p struct {
		Detail string `json:"detail"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.body), &p))
	return p.Detail
}

func idemClient(t *testing.T, backend string) (*servertest.Server, *client.Client) {
	t.Helper()
	srv := servertest.Start(t, servertest.Options{Backend: backend, Tenants: []string{"shop"}})
	c, err := client.New(srv.URL(), client.WithToken(srv.Token(t, "shop", "keys:write")),
		client.WithRetryPolicy(client.RetryPolicy{BaseDelay: 20 * time.Millisecond, RetryAfterJitter: 50 * time.Millisecond}))
	require.NoError(t, err)
	return srv, c
}

func forEachBackend(t *testing.T, test func(t *testing.T, srv *servertest.Server, c *client.Client)) {
	for _, b := range []string{servertest.BackendSQLite, servertest.BackendPostgres} {
		t.Run(b, func(t *testing.T) {
			t.Parallel()
			srv, c := idemClient(t, b)
			test(t, srv, c)
		})
	}
}

func TestMiddlewareReplayAndErrors(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, _ *servertest.Server, c *client.Client) {
		a := newApp(t, c, idemhttp.Options{})
		url := a.srv.URL + "/orders/cus_1"

		first := post(t, url, "k-1", `{"sku":"A"}`)
		require.Equal(t, http.StatusCreated, first.status)
		require.Empty(t, first.header.Get(idemhttp.HeaderReplayed))
		require.Equal(t, "session=secret", first.header.Get("Set-Cookie"), "the first answer is the handler's own")

		again := post(t, url, "k-1", `{"sku":"A"}`)
		require.Equal(t, http.StatusCreated, again.status)
		require.Equal(t, "true", again.header.Get(idemhttp.HeaderReplayed))
		require.Equal(t, first.body, again.body)
		require.Equal(t, "/orders/1", again.header.Get("Location"))
		require.Equal(t, "application/json", again.header.Get("Content-Type"))
		require.Empty(t, again.header.Get("Set-Cookie"), "headers outside the allowlist are not stored")
		require.Equal(t, int64(1), a.orders.Load())

		// Same key, another body: 422.
		mismatch := post(t, url, "k-1", `{"sku":"B"}`)
		require.Equal(t, http.StatusUnprocessableEntity, mismatch.status)
		require.Equal(t, "fingerprint_mismatch", problemCode(t, mismatch))
		// Same key and body on another path of the same route pattern: the
		// path is part of the fingerprint document (front-door rule 4), so
		// this is another request: 422, the handler not run.
		before := a.orders.Load()
		other := post(t, a.srv.URL+"/orders/cus_2", "k-1", `{"sku":"A"}`)
		require.Equal(t, http.StatusUnprocessableEntity, other.status)
		require.Equal(t, "fingerprint_mismatch", problemCode(t, other))
		require.Equal(t, before, a.orders.Load())

		// Missing key on POST: 400; malformed key: 400.
		missing := post(t, url, "", `{}`)
		require.Equal(t, http.StatusBadRequest, missing.status)
		require.Equal(t, "idempotency_key_missing", problemCode(t, missing))
		bad := post(t, url, strings.Repeat("x", 300), `{}`)
		require.Equal(t, http.StatusBadRequest, bad.status)
		require.Equal(t, "invalid_key", problemCode(t, bad))

		// GET is never claimed.
		resp, err := http.Get(a.srv.URL + "/orders")
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
		require.Equal(t, int64(1), a.orders.Load())

		// No method required: a request without a key passes through.
		b := newApp(t, c, idemhttp.Options{Methods: frontdoor.Methods{Required: []string{}}})
		require.Equal(t, http.StatusCreated, post(t, b.srv.URL+"/orders/x", "", `{}`).status)
	})
}

func TestMiddlewareStoresServerErrors(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, _ *servertest.Server, c *client.Client) {
		a := newApp(t, c, idemhttp.Options{})
		a.fail.Store(1)
		url := a.srv.URL + "/orders/cus_1"
		require.Equal(t, http.StatusInternalServerError, post(t, url, "k-5xx", `{}`).status)
		again := post(t, url, "k-5xx", `{}`)
		require.Equal(t, http.StatusInternalServerError, again.status, "a 5xx is stored and replayed (Stripe, openapi.yaml)")
		require.Equal(t, "true", again.header.Get(idemhttp.HeaderReplayed))
		require.Zero(t, a.entered.Load(), "the handler did not run again")
	})
}

func TestMiddlewareReleaseServerErrors(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, _ *servertest.Server, c *client.Client) {
		a := newApp(t, c, idemhttp.Options{ReleaseServerErrors: true})
		a.fail.Store(1)
		url := a.srv.URL + "/orders/cus_1"
		require.Equal(t, http.StatusInternalServerError, post(t, url, "k-5xx", `{}`).status)
		ok := post(t, url, "k-5xx", `{}`)
		require.Equal(t, http.StatusCreated, ok.status, "the 5xx was released, the retry ran the handler")
		require.Empty(t, ok.header.Get(idemhttp.HeaderReplayed))
		require.Equal(t, "true", post(t, url, "k-5xx", `{}`).header.Get(idemhttp.HeaderReplayed))
		require.Equal(t, int64(1), a.orders.Load())
	})
}

// TestMiddlewareFrontDoorRules checks the rules shared with the gateway
// that idemhttp used to break: a quoted and a bare key are one key, a JSON
// body is fingerprinted as JSON, an over-large response is stored without
// its body and never run again.
func TestMiddlewareFrontDoorRules(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, _ *servertest.Server, c *client.Client) {
		a := newApp(t, c, idemhttp.Options{MaxStoredBytes: 1000})
		url := a.srv.URL + "/orders/cus_1"
		first := post(t, url, `"k-q"`, `{"sku":"A","qty":1}`)
		require.Equal(t, http.StatusCreated, first.status)
		again := post(t, url, `k-q`, "{ \"qty\": 1.0,\n \"sku\": \"A\" }")
		require.Equal(t, "true", again.header.Get(idemhttp.HeaderReplayed), "bare k-q is the key \"k-q\"; key order, white space and 1.0 do not matter")
		require.Equal(t, first.body, again.body)
		require.Equal(t, int64(1), a.orders.Load())

		dup := post(t, url, `{"sku":"A","sku":"B"}`, `{}`)
		require.Equal(t, http.StatusBadRequest, dup.status, "a quote inside a bare key")
		require.Equal(t, "invalid_key", problemCode(t, dup))
		// A body that is not I-JSON reaches idem verbatim inside the
		// document and idem's 400 is passed on; the handler never runs.
		before := a.orders.Load()
		for i, body := range []string{`{"sku":"A","sku":"B"}`, `{"n":{"x":1,"x":1}}`, `{"t":"\ud800"}`, "{\"t\":\"\xff\"}", `{"n":1e400}`, `{"sku":`} {
			bad := post(t, url, fmt.Sprintf("k-bad-%d", i), body)
			require.Equal(t, http.StatusBadRequest, bad.status, body)
			require.Equal(t, "invalid_request", problemCode(t, bad), body)
		}
		require.Equal(t, before, a.orders.Load())

		small := newApp(t, c, idemhttp.Options{MaxBodyBytes: 16})
		tooLarge := post(t, small.srv.URL+"/orders/cus_1", "k-large", `{"sku":"AAAAAAAAAAAAAAAAAAAA"}`)
		require.Equal(t, http.StatusRequestEntityTooLarge, tooLarge.status)
		require.Equal(t, "payload_too_large", problemCode(t, tooLarge))
		require.Equal(t, int64(0), small.orders.Load())

		a.big = 5000
		big := post(t, url, "k-big", `{}`)
		require.Equal(t, http.StatusCreated, big.status)
		require.Len(t, big.body, 5000, "the first caller gets the whole response")
		replay := post(t, url, "k-big", `{}`)
		require.Equal(t, http.StatusConflict, replay.status)
		require.Equal(t, "response_not_replayable", problemCode(t, replay))
		require.Equal(t, frontdoor.NotReplayableDetail, problemDetail(t, replay))
		require.Equal(t, int64(2), a.orders.Load(), "not run again")
	})
}

func TestMiddlewareInFlight(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, _ *servertest.Server, c *client.Client) {
		a := newApp(t, c, idemhttp.Options{})
		a.delay = 500 * time.Millisecond
		url := a.srv.URL + "/orders/cus_1"
		done := make(chan reply)
		go func() { done <- post(t, url, "k-slow", `{}`) }()
		require.Eventually(t, func() bool { return a.entered.Load() == 1 }, 5*time.Second, 5*time.Millisecond)
		inflight := post(t, url, "k-slow", `{}`)
		require.Equal(t, http.StatusConflict, inflight.status)
		require.Equal(t, "request_in_flight", problemCode(t, inflight))
		require.NotEmpty(t, inflight.header.Get("Retry-After"))
		require.Equal(t, http.StatusCreated, (<-done).status)
		require.Equal(t, int64(1), a.orders.Load())
	})
}

// TestMiddlewarePreferWait: a duplicate with Prefer: wait=N is held by
// the idem server while the first request runs (its lease is 30 s, so
// nothing but the completion can answer it soon) and gets the first one's
// response replayed the moment it completes, with Preference-Applied; a
// wait that runs out is the 409 it would have been, with
// Preference-Applied; MaxWait caps N.
func TestMiddlewarePreferWait(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, srv *servertest.Server, c *client.Client) {
		a := newApp(t, c, idemhttp.Options{Lease: 30 * time.Second, MaxWait: 5 * time.Second})
		release := a.hold(t)
		url := a.srv.URL + "/orders/cus_1"
		first := make(chan reply, 1)
		go func() { first <- post(t, url, "k-held", `{"n":1}`) }()
		require.Eventually(t, func() bool { return a.entered.Load() == 1 }, 5*time.Second, 5*time.Millisecond)

		short := postWith(t, url, "k-held", `{"n":1}`, http.Header{"Prefer": {"wait=1"}})
		require.Equal(t, http.StatusConflict, short.status)
		require.Equal(t, "request_in_flight", problemCode(t, short))
		require.Equal(t, "wait=1", short.header.Get("Preference-Applied"))
		require.NotEmpty(t, short.header.Get("Retry-After"))

		held := make(chan reply, 1)
		go func() {
			held <- postWith(t, url, "k-held", `{"n":1}`, http.Header{"Prefer": {"respond-async, wait=60"}})
		}()
		require.Eventually(t, func() bool { return srv.Server().Waiting() == 1 }, 5*time.Second, 5*time.Millisecond,
			"the duplicate's claim is held by the idem server")
		release()
		r1 := <-first
		require.Equal(t, http.StatusCreated, r1.status)
		select {
		case r2 := <-held:
			require.Equal(t, http.StatusCreated, r2.status)
			require.Equal(t, "true", r2.header.Get(idemhttp.HeaderReplayed))
			require.Equal(t, "wait=5", r2.header.Get("Preference-Applied"), "N capped by MaxWait")
			require.Equal(t, r1.body, r2.body)
		case <-time.After(4 * time.Second):
			require.FailNow(t, "the held duplicate was not answered when the first request completed")
		}
		require.Equal(t, int64(1), a.orders.Load())

		// Without the preference: 409 at once, no Preference-Applied.
		a2 := newApp(t, c, idemhttp.Options{Lease: 30 * time.Second})
		release2 := a2.hold(t)
		done := make(chan reply, 1)
		go func() { done <- post(t, a2.srv.URL+"/orders/cus_2", "k-now", `{}`) }()
		require.Eventually(t, func() bool { return a2.entered.Load() == 1 }, 5*time.Second, 5*time.Millisecond)
		now := post(t, a2.srv.URL+"/orders/cus_2", "k-now", `{}`)
		release2()
		require.Equal(t, http.StatusConflict, now.status)
		require.Empty(t, now.header.Get("Preference-Applied"))
		require.Equal(t, http.StatusCreated, (<-done).status)
	})
}

// TestMiddlewareDuplicatesAndDroppedResponses fires concurrent duplicates
// of one request, some through a proxy that drops the answer, and retries
// every caller until it gets a final answer: the side effect happens once
// and every caller sees the same body.
func TestMiddlewareDuplicatesAndDroppedResponses(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, srv *servertest.Server, c *client.Client) {
		// The middleware's own calls to idem also lose answers now and then.
		var n atomic.Int64
		idemProxy := faultproxy.Start(t, strings.TrimPrefix(srv.URL(), "http://"), func(r *http.Request) bool {
			return strings.HasSuffix(r.URL.Path, "/complete") && n.Add(1)%2 == 1
		})
		flaky, err := client.New(idemProxy.URL(), client.WithToken(srv.Token(t, "shop", "keys:write")),
			client.WithRetryPolicy(client.RetryPolicy{BaseDelay: 20 * time.Millisecond}))
		require.NoError(t, err)
		a := newApp(t, flaky, idemhttp.Options{})
		a.delay = 50 * time.Millisecond
		var dropped atomic.Int64
		appProxy := faultproxy.Start(t, strings.TrimPrefix(a.srv.URL, "http://"), func(r *http.Request) bool {
			return dropped.Add(1) <= 3 // the first three answers never reach their callers
		})

		const callers = 12
		bodies := make([]string, callers)
		var wg sync.WaitGroup
		for i := range callers {
			base := a.srv.URL
			if i%2 == 0 {
				base = appProxy.URL()
			}
			wg.Go(func() {
				for try := 0; try < 100; try++ {
					req, _ := http.NewRequest(http.MethodPost, base+"/orders/cus_9", bytes.NewReader([]byte(`{"sku":"Z"}`)))
					req.Header.Set(idemhttp.HeaderKey, "order-cus_9-1")
					resp, err := (&http.Client{Transport: &http.Transport{}}).Do(req)
					if err != nil {
						time.Sleep(20 * time.Millisecond) // dropped answer: retry with the same key
						continue
					}
					b, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					if resp.StatusCode == http.StatusConflict {
						time.Sleep(50 * time.Millisecond)
						continue
					}
					if resp.StatusCode == http.StatusCreated {
						bodies[i] = string(b)
					}
					return
				}
			})
		}
		wg.Wait()
		require.Equal(t, int64(1), a.orders.Load(), "one side effect")
		for i := range callers {
			require.Equal(t, bodies[0], bodies[i], "caller %d", i)
		}
		require.Contains(t, bodies[0], `"order":1`)
	})
}

func TestMiddlewareFailsClosed(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	c, err := client.New("http://"+addr, client.WithRetryPolicy(client.RetryPolicy{MaxAttempts: 1}))
	require.NoError(t, err)
	a := newApp(t, c, idemhttp.Options{UnavailableRetryAfter: 3 * time.Second})
	r := post(t, a.srv.URL+"/orders/cus_1", "k-down", `{}`)
	require.Equal(t, http.StatusServiceUnavailable, r.status)
	require.Equal(t, "store_unavailable", problemCode(t, r))
	require.Equal(t, "3", r.header.Get("Retry-After"))
	require.Zero(t, a.orders.Load(), "the handler does not run unprotected")
}

// TestMiddlewarePanicLeavesTheClaim: a handler that panics stores nothing;
// the panic propagates and the claim stays in flight, to become an orphan
// that a retry after the lease takes over.
func TestMiddlewarePanicLeavesTheClaim(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, _ *servertest.Server, c *client.Client) {
		var recovered atomic.Value
		h := idemhttp.Middleware(c, idemhttp.Options{})(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
			panic("handler bug")
		}))
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			defer func() {
				recovered.Store(recover())
				http.Error(w, "panic", http.StatusInternalServerError)
			}()
			h.ServeHTTP(w, r)
		}))
		t.Cleanup(srv.Close)
		require.Equal(t, http.StatusInternalServerError, post(t, srv.URL+"/orders", "k-panic", `{}`).status)
		require.Equal(t, "handler bug", recovered.Load(), "the panic propagated")
		rec, err := c.Get(t.Context(), "k-panic")
		require.NoError(t, err)
		require.Equal(t, client.StateInFlight, rec.State, "nothing stored, nothing released")
		require.Nil(t, rec.Response)
	})
}

// TestMiddlewareInformationalStatus: a handler that sends 103 Early Hints
// before its answer is stored, sent and replayed with its final status and
// body. Before, the recorder took the 103 as the status: the caller got a
// 200 it was never sent, and idem stored 103.
func TestMiddlewareInformationalStatus(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, _ *servertest.Server, c *client.Client) {
		var runs atomic.Int64
		h := idemhttp.Middleware(c, idemhttp.Options{})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs.Add(1)
			w.Header().Set("Link", "</style.css>; rel=preload; as=style")
			w.WriteHeader(http.StatusEarlyHints)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			fmt.Fprint(w, `{"id":"ord_1"}`)
		}))
		srv := httptest.NewServer(h)
		t.Cleanup(srv.Close)

		first := post(t, srv.URL+"/orders", "k-early-hints", `{}`)
		require.Equal(t, http.StatusCreated, first.status)
		require.JSONEq(t, `{"id":"ord_1"}`, first.body)
		rec, err := c.Get(t.Context(), "k-early-hints")
		require.NoError(t, err)
		require.Equal(t, client.StateCompleted, rec.State)
		require.Equal(t, http.StatusCreated, rec.Response.Status, "the final status is stored")

		again := post(t, srv.URL+"/orders", "k-early-hints", `{}`)
		require.Equal(t, http.StatusCreated, again.status)
		require.Equal(t, "true", again.header.Get(idemhttp.HeaderReplayed))
		require.Equal(t, first.body, again.body)
		require.Equal(t, int64(1), runs.Load())
	})
}

// TestMiddlewareReplaysHeaderBytes: a stored header whose value is not
// UTF-8 (obs-text, RFC 9110 §5.5: a Latin-1 file name, say) is replayed
// byte for byte as the handler sent it.
func TestMiddlewareReplaysHeaderBytes(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, _ *servertest.Server, c *client.Client) {
		const disposition = "attachment; filename=\"r\xe9sum\xe9.pdf\"" // Latin-1 é
		h := idemhttp.Middleware(c, idemhttp.Options{})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Disposition", disposition)
			w.Header().Set("Content-Type", "application/pdf")
			w.WriteHeader(http.StatusCreated)
			fmt.Fprint(w, "%PDF-1.7")
		}))
		srv := httptest.NewServer(h)
		t.Cleanup(srv.Close)

		first := post(t, srv.URL+"/files", "k-latin1", `{}`)
		require.Equal(t, http.StatusCreated, first.status)
		require.Equal(t, disposition, first.header.Get("Content-Disposition"))
		again := post(t, srv.URL+"/files", "k-latin1", `{}`)
		require.Equal(t, "true", again.header.Get(idemhttp.HeaderReplayed))
		require.Equal(t, disposition, again.header.Get("Content-Disposition"), "the replay sends the bytes the handler sent")
	})
}

// rawApp serves, behind the middleware with default options, a handler
// that answers 201 at every path (no ServeMux pattern, so the route is the
// path), for tests that send request lines byte for byte
// (testvectors.Post); it returns the app's host:port and the count of the
// handler's runs.
func rawApp(t *testing.T, c *client.Client) (addr string, runs *atomic.Int64) {
	t.Helper()
	runs = new(atomic.Int64)
	h := idemhttp.Middleware(c, idemhttp.Options{})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusCreated)
	}))
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://"), runs
}

// TestMiddlewareRawQueryBytesFingerprint: two requests whose raw query
// differs only in bytes that are not UTF-8 are two requests: the second
// under the first one's key is 422, not the first one's replay. Before,
// both bytes became U+FFFD in the fingerprint document.
func TestMiddlewareRawQueryBytesFingerprint(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, _ *servertest.Server, c *client.Client) {
		addr, runs := rawApp(t, c)
		require.Equal(t, http.StatusCreated, testvectors.Post(t, addr, "/orders?name=\xe9", "k-raw-query"))
		require.Equal(t, http.StatusCreated, testvectors.Post(t, addr, "/orders?name=\xe9", "k-raw-query"), "the same request is replayed")
		require.Equal(t, http.StatusUnprocessableEntity, testvectors.Post(t, addr, "/orders?name=\xe8", "k-raw-query"), "another request under the key")
		require.Equal(t, int64(1), runs.Load())
	})
}

// TestMiddlewareTenantLimitBelowMaxStoredBytes: a tenant whose
// max_response_bytes is under the middleware's MaxStoredBytes refuses the
// whole response (413); the middleware then stores it without its body, as
// for a response over MaxStoredBytes, so the retry is 409
// response_not_replayable. Before, nothing was stored: the key stayed in
// flight, and the retry after the lease ran the handler a second time.
func TestMiddlewareTenantLimitBelowMaxStoredBytes(t *testing.T) {
	t.Parallel()
	for _, backend := range []string{servertest.BackendSQLite, servertest.BackendPostgres} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			srv := servertest.Start(t, servertest.Options{Backend: backend})
			limit := 1024
			srv.CreateTenant(t, "small", idem.SettingsPatch{MaxResponseBytes: &limit})
			c, err := client.New(srv.URL(), client.WithToken(srv.Token(t, "small", "keys:write")),
				client.WithRetryPolicy(client.RetryPolicy{BaseDelay: 20 * time.Millisecond, RetryAfterJitter: 50 * time.Millisecond}))
			require.NoError(t, err)
			var runs atomic.Int64
			body := strings.Repeat("x", 4096)
			h := idemhttp.Middleware(c, idemhttp.Options{Lease: time.Second})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				runs.Add(1)
				w.Header().Set("Content-Type", "text/plain")
				w.WriteHeader(http.StatusCreated)
				fmt.Fprint(w, body)
			}))
			app := httptest.NewServer(h)
			t.Cleanup(app.Close)

			first := post(t, app.URL+"/reports", "k-tenant-limit", `{}`)
			require.Equal(t, http.StatusCreated, first.status)
			require.Equal(t, body, first.body, "the answer is sent whole")
			rec, err := c.Get(t.Context(), "k-tenant-limit")
			require.NoError(t, err)
			require.Equal(t, client.StateCompleted, rec.State, "the outcome is recorded, without its body")

			time.Sleep(1100 * time.Millisecond) // past the claim's lease: an in-flight key would be taken over now
			again := post(t, app.URL+"/reports", "k-tenant-limit", `{}`)
			require.Equal(t, http.StatusConflict, again.status)
			require.Equal(t, string(frontdoor.CodeResponseNotReplayable), problemCode(t, again))
			require.Equal(t, frontdoor.NotReplayableDetail, problemDetail(t, again))
			require.Equal(t, int64(1), runs.Load(), "the handler ran once")
		})
	}
}

// TestMiddlewareBodyOverTheServersLimit: idem's request limit
// (IDEM_MAX_BODY_BYTES, 64 KiB here) is under the middleware's
// MaxBodyBytes, so idem refuses the claim's document (413): the caller gets
// 413 payload_too_large and the handler does not run. Before, it got 503
// store_unavailable with Retry-After: a retry that can never succeed.
func TestMiddlewareBodyOverTheServersLimit(t *testing.T) {
	t.Parallel()
	for _, backend := range []string{servertest.BackendSQLite, servertest.BackendPostgres} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			srv := servertest.Start(t, servertest.Options{Backend: backend, Tenants: []string{"shop"},
				Configure: func(cfg *server.Config) { cfg.MaxBodyBytes = 64 << 10; cfg.MaxInflightBytes = 4 << 20 }})
			c, err := client.New(srv.URL(), client.WithToken(srv.Token(t, "shop", "keys:write")))
			require.NoError(t, err)
			var runs atomic.Int64
			app := httptest.NewServer(idemhttp.Middleware(c, idemhttp.Options{})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				runs.Add(1)
				w.WriteHeader(http.StatusCreated)
			})))
			t.Cleanup(app.Close)
			got := post(t, app.URL+"/uploads", "k-too-big", `{"pad":"`+strings.Repeat("x", 100<<10)+`"}`)
			require.Equal(t, http.StatusRequestEntityTooLarge, got.status)
			require.Equal(t, string(frontdoor.CodePayloadTooLarge), problemCode(t, got))
			require.Zero(t, runs.Load())
		})
	}
}

// TestMiddlewareUnstorableStatus: net/http lets a handler answer any
// status from 100 to 999, idem's complete stores 100–599. An answer
// outside that range is sent as it is and stored as not replayable, so
// the retry, even after the claim's lease, is 409 response_not_replayable
// and the handler runs once — with ReleaseServerErrors too (the handler
// ran; its status says nothing about side effects). Before, complete was
// refused (400), the key stayed in flight and the retry after the lease
// took it over and ran the handler a second time.
func TestMiddlewareUnstorableStatus(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, _ *servertest.Server, c *client.Client) {
		for _, release := range []bool{false, true} {
			var runs atomic.Int64
			h := idemhttp.Middleware(c, idemhttp.Options{Lease: time.Second, ReleaseServerErrors: release})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				runs.Add(1)
				w.Header().Set("Content-Type", "text/plain")
				w.WriteHeader(799)
				fmt.Fprint(w, "odd")
			}))
			app := httptest.NewServer(h)
			t.Cleanup(app.Close)
			key := fmt.Sprintf("k-status-799-%v", release)

			first := post(t, app.URL+"/orders", key, `{}`)
			require.Equal(t, 799, first.status, "the handler's answer is sent as it is")
			require.Equal(t, "odd", first.body)
			rec, err := c.Get(t.Context(), key)
			require.NoError(t, err)
			require.Equal(t, client.StateCompleted, rec.State, "the outcome is recorded, as not replayable")
			require.NotNil(t, rec.Response)
			require.Equal(t, frontdoor.UnstorableStatus, rec.Response.Status)
			require.Equal(t, "response of status 799 not stored (outside 100-599)", rec.Response.Headers[frontdoor.HeaderNotReplayable])

			time.Sleep(1100 * time.Millisecond) // past the claim's lease: an in-flight key would be taken over now
			again := post(t, app.URL+"/orders", key, `{}`)
			require.Equal(t, http.StatusConflict, again.status)
			require.Equal(t, string(frontdoor.CodeResponseNotReplayable), problemCode(t, again))
			require.Equal(t, frontdoor.NotReplayableDetail, problemDetail(t, again), "not 'too large' of a 799")
			require.Equal(t, int64(1), runs.Load(), "the handler ran once")
		}
	})
}

// TestMiddlewareTargetVectors: each request line of
// testvectors/frontdoor/targets.json, sent byte for byte, gives the record
// the fingerprint the vector expects — the one the Python and Node front
// doors give the same bytes. Before, the path was r.URL.EscapedPath(): a
// raw byte outside ASCII or a raw '{', '|', '"'... came out escaped (and
// with it every character Go escapes), so the same request had another
// fingerprint than in the other SDKs.
func TestMiddlewareTargetVectors(t *testing.T) {
	t.Parallel()
	vectors := testvectors.Targets(t)
	forEachBackend(t, func(t *testing.T, _ *servertest.Server, c *client.Client) {
		addr, _ := rawApp(t, c)
		for i, v := range vectors {
			key := fmt.Sprintf("k-target-%d", i)
			require.Equal(t, http.StatusCreated, testvectors.Post(t, addr, v.Target, key), v.Name)
			rec, err := c.Get(t.Context(), key)
			require.NoError(t, err)
			assert.Equal(t, v.Expect.Fingerprint, rec.Fingerprint, v.Name)
		}
	})
}

// TestMiddlewareInvalidClaimAnswers: an idem URL that answers claims with
// something the client cannot interpret (each "invalid" claim answer of
// testvectors/sdk/replay.json, from a loopback fake: a real idem cannot
// send them) gets the caller 503 store_unavailable; the handler never runs
// and nothing invented is replayed. Before, a 201 without a fencing token
// ran the handler and a 200 without a response replayed an empty 200.
func TestMiddlewareInvalidClaimAnswers(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../../../testvectors/sdk/replay.json")
	require.NoError(t, err)
	var file struct {
		ClaimAnswers []struct {
			Name    string            `json:"name"`
			Status  int               `json:"status"`
			Headers map[string]string `json:"headers"`
			Body    string            `json:"body"`
			Expect  string            `json:"expect"`
		} `json:"claim_answers"`
	}
	require.NoError(t, json.Unmarshal(b, &file))
	n := 0
	for _, v := range file.ClaimAnswers {
		if v.Expect != "invalid" {
			continue
		}
		n++
		fake := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			for k, val := range v.Headers {
				w.Header().Set(k, val)
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(v.Status)
			_, _ = io.WriteString(w, v.Body)
		}))
		c, err := client.New(fake.URL)
		require.NoError(t, err)
		var runs atomic.Int64
		app := httptest.NewServer(idemhttp.Middleware(c, idemhttp.Options{})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs.Add(1)
			w.WriteHeader(http.StatusCreated)
		})))
		got := post(t, app.URL+"/orders", "k-invalid", `{}`)
		app.Close()
		fake.Close()
		assert.Equal(t, http.StatusServiceUnavailable, got.status, v.Name)
		assert.Equal(t, "store_unavailable", problemCode(t, got), v.Name)
		assert.Zero(t, runs.Load(), "%s: the handler must not run", v.Name)
	}
	require.NotZero(t, n)
}

// TestMiddlewareStorageQuotaExceeded: a tenant whose records fill its
// storage_quota_bytes gets 507 storage_quota_exceeded from idem on the
// claim of a new key; the middleware answers 507 storage_quota_exceeded,
// not retryable, without Retry-After, the handler not run and nothing
// stored, while a completed key still replays. Before, the refusal fell
// into the default branch: 503 store_unavailable, retryable, telling the
// caller to retry what cannot succeed until the tenant's usage falls.
func TestMiddlewareStorageQuotaExceeded(t *testing.T) {
	t.Parallel()
	for _, backend := range []string{servertest.BackendSQLite, servertest.BackendPostgres} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			// No tenant cache: every claim checks the quota in its statement.
			srv := servertest.Start(t, servertest.Options{Backend: backend,
				Configure: func(cfg *server.Config) { cfg.TenantCacheTTL = 0 }})
			limit, quota := 2000, int64(4000)
			srv.CreateTenant(t, "full", idem.SettingsPatch{MaxResponseBytes: &limit, StorageQuotaBytes: &quota})
			c, err := client.New(srv.URL(), client.WithToken(srv.Token(t, "full", "keys:write")),
				client.WithRetryPolicy(client.RetryPolicy{BaseDelay: 20 * time.Millisecond, RetryAfterJitter: 50 * time.Millisecond}))
			require.NoError(t, err)
			var runs atomic.Int64
			body := strings.Repeat("x", 900)
			app := httptest.NewServer(idemhttp.Middleware(c, idemhttp.Options{})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				runs.Add(1)
				w.WriteHeader(http.StatusCreated)
				fmt.Fprint(w, body)
			})))
			t.Cleanup(app.Close)

			var refused reply
			var key string
			filled := 0
			for i := range 10 {
				key = fmt.Sprintf("k-fill-%d", i)
				got := post(t, app.URL+"/orders", key, `{}`)
				if got.status != http.StatusCreated {
					refused = got
					break
				}
				filled++
			}
			require.NotZero(t, refused.status, "the tenant filled its quota and kept claiming new keys")
			require.EqualValues(t, filled, runs.Load(), "the handler ran for the stored keys only")
			require.Equal(t, http.StatusInsufficientStorage, refused.status, "%s", refused.body)
			var p frontdoor.Problem
			require.Equal(t, "application/problem+json", refused.header.Get("Content-Type"))
			require.NoError(t, json.Unmarshal([]byte(refused.body), &p))
			require.Equal(t, frontdoor.CodeStorageQuotaExceeded, p.Code)
			require.False(t, p.Retryable)
			require.Equal(t, frontdoor.StorageQuotaDetail, p.Detail)
			require.Empty(t, refused.header.Get("Retry-After"))
			_, err = c.Get(t.Context(), key)
			require.ErrorIs(t, err, client.ErrKeyNotFound, "the refused key is not stored")

			// The refusal is final: the same key again is refused again.
			again := post(t, app.URL+"/orders", key, `{}`)
			require.Equal(t, http.StatusInsufficientStorage, again.status)
			require.EqualValues(t, filled, runs.Load())

			// A completed key still replays.
			replay := post(t, app.URL+"/orders", "k-fill-0", `{}`)
			require.Equal(t, http.StatusCreated, replay.status)
			require.Equal(t, "true", replay.header.Get(idemhttp.HeaderReplayed))
			require.Equal(t, body, replay.body)
			require.EqualValues(t, filled, runs.Load())
		})
	}
}

// TestMiddlewareOperationVectors: each request line of
// testvectors/frontdoor/operations.json, sent byte for byte to a handler no
// ServeMux pattern names, is served and claimed with the operation the
// vector expects — the one the gateway, the Python and the Node front doors
// give the same bytes. Before, a path that decodes to a control character
// (/pay%00x, /pay%0A, /pay%7F, /pay%C2%85) made a label idem refuses (400),
// answered as a retryable 503 store_unavailable no retry could get past, and
// one that decodes to bytes that are not UTF-8 (/pay%FF) was sent as U+FFFD.
func TestMiddlewareOperationVectors(t *testing.T) {
	t.Parallel()
	vectors := testvectors.Operations(t)
	forEachBackend(t, func(t *testing.T, _ *servertest.Server, c *client.Client) {
		addr, runs := rawApp(t, c)
		for i, v := range vectors {
			key := fmt.Sprintf("k-operation-%d", i)
			before := runs.Load()
			require.Equal(t, http.StatusCreated, testvectors.Post(t, addr, v.Target, key), v.Name)
			require.Equal(t, before+1, runs.Load(), "%s: the handler ran once", v.Name)
			rec, err := c.Get(t.Context(), key)
			require.NoError(t, err)
			assert.Equal(t, client.StateCompleted, rec.State, v.Name)
			assert.Equal(t, v.Expect.Operation, rec.Operation, v.Name)
			// The retry matches its claim: the stored answer, not a second run.
			require.Equal(t, http.StatusCreated, testvectors.Post(t, addr, v.Target, key), v.Name)
			require.Equal(t, before+1, runs.Load(), "%s: the retry is a replay", v.Name)
		}
	})
}

// TestMiddlewareClaimRefusedAsInvalid: an operation idem refuses (here from
// an Options.Route that names a control character) answers the caller 400
// invalid_request, not retryable, naming idem's field, without running the
// handler or claiming anything. Before, it was 503 store_unavailable with
// Retry-After: a retry that could never succeed.
func TestMiddlewareClaimRefusedAsInvalid(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, _ *servertest.Server, c *client.Client) {
		var runs atomic.Int64
		h := idemhttp.Middleware(c, idemhttp.Options{Route: func(*http.Request) string { return "/orders/\x01" }})(
			http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				runs.Add(1)
				w.WriteHeader(http.StatusCreated)
			}))
		srv := httptest.NewServer(h)
		t.Cleanup(srv.Close)
		got := post(t, srv.URL+"/orders", "k-refused", `{}`)
		require.Equal(t, http.StatusBadRequest, got.status, got.body)
		require.Equal(t, string(frontdoor.CodeInvalidRequest), problemCode(t, got))
		var p frontdoor.Problem
		require.NoError(t, json.Unmarshal([]byte(got.body), &p))
		assert.False(t, p.Retryable)
		assert.Empty(t, got.header.Get("Retry-After"))
		require.NotEmpty(t, p.Errors)
		assert.Equal(t, "operation", p.Errors[0].Field)
		assert.Zero(t, runs.Load(), "the handler must not run")
		_, err := c.Get(t.Context(), "k-refused")
		require.ErrorIs(t, err, client.ErrKeyNotFound)
	})
}
