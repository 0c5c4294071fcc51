package idemhttp_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem/client"
	"github.com/idem-dev/idem/client/idemhttp"
	"github.com/idem-dev/idem/testkit/servertest"
)

// streamChunks is how many chunks the streaming handler writes, one per
// streamDelay.
const (
	streamChunks = 10
	streamDelay  = 50 * time.Millisecond
)

// streamApp is an API whose POST /stream writes its answer in chunks, as a
// streaming handler does: it stops writing when its request's context is
// done (the caller hung up), and its first run may break off part way.
type streamApp struct {
	runs     atomic.Int64  // handler runs (the side effect)
	finished atomic.Int64  // runs that wrote every chunk
	first    chan struct{} // closed when the first run has written its first chunk
	done     chan struct{} // closed when the first run returned
	addr     string
}

// fullStream is the whole answer of a run that wrote every chunk.
func fullStream() string {
	var b strings.Builder
	for i := range streamChunks {
		fmt.Fprintf(&b, "chunk%d;", i)
	}
	return b.String()
}

// newStreamApp starts the app; abortAfter > 0 makes its first run break
// off its answer (panic(http.ErrAbortHandler), net/http's way) after that
// many chunks.
func newStreamApp(t *testing.T, c *client.Client, opts idemhttp.Options, abortAfter int) *streamApp {
	t.Helper()
	s := &streamApp{first: make(chan struct{}), done: make(chan struct{})}
	h := idemhttp.Middleware(c, opts)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		run := s.runs.Add(1)
		if run == 1 {
			defer close(s.done)
		}
		w.Header().Set("Content-Type", "text/plain")
		for i := range streamChunks {
			if run == 1 && abortAfter > 0 && i == abortAfter {
				panic(http.ErrAbortHandler)
			}
			fmt.Fprintf(w, "chunk%d;", i)
			if run == 1 && i == 0 {
				close(s.first)
			}
			select {
			case <-r.Context().Done():
				return // the caller went away: stop writing, as streaming handlers do
			case <-time.After(streamDelay):
			}
		}
		s.finished.Add(1)
	}))
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	s.addr = strings.TrimPrefix(srv.URL, "http://")
	return s
}

// rawPost sends POST /stream with key on a connection of its own and
// returns it, for the test to close (the caller hanging up) or read.
func rawPost(t *testing.T, addr, key string) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	_, err = fmt.Fprintf(conn, "POST /stream HTTP/1.1\r\nHost: %s\r\nIdempotency-Key: %s\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}", addr, key)
	require.NoError(t, err)
	return conn
}

func waitFor(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(60 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
}

// TestMiddlewareCallerHangsUpMidAnswer: the caller hangs up after the
// handler wrote its first chunk. The handler is not cancelled: it writes
// all its chunks, that whole answer is stored, and the retry gets it
// replayed; the handler ran once. Before, the handler's context was
// cancelled by the disconnect, it stopped after a chunk or two, and the
// retry got those chunks replayed as a complete 200.
func TestMiddlewareCallerHangsUpMidAnswer(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, _ *servertest.Server, c *client.Client) {
		s := newStreamApp(t, c, idemhttp.Options{}, 0)
		conn := rawPost(t, s.addr, "k-cut")
		waitFor(t, s.first, "the first chunk")
		require.NoError(t, conn.Close())
		waitFor(t, s.done, "the handler to return")
		require.Eventually(t, func() bool {
			rec, err := c.Get(t.Context(), "k-cut")
			return err == nil && rec.State != client.StateInFlight
		}, 30*time.Second, 20*time.Millisecond, "the key completed")

		r := post(t, "http://"+s.addr+"/stream", "k-cut", `{}`)
		require.Equal(t, http.StatusOK, r.status)
		require.Equal(t, "true", r.header.Get(idemhttp.HeaderReplayed))
		require.Equal(t, fullStream(), r.body, "the whole answer, never the part written before the hang-up")
		require.Equal(t, int64(1), s.runs.Load(), "one side effect")
		require.Equal(t, int64(1), s.finished.Load(), "the handler ran to its end")
	})
}

// TestMiddlewareHandlerBreaksOffItsAnswer: a handler that breaks off its
// answer after three chunks (panic(http.ErrAbortHandler)) stores nothing,
// as any panic: the caller's connection is closed without an answer, the
// claim is left in flight, and the retry gets 409 request_in_flight until
// the lease runs out, then takes the orphan over and runs the handler
// again; never the three chunks as a replayed 200.
func TestMiddlewareHandlerBreaksOffItsAnswer(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, _ *servertest.Server, c *client.Client) {
		s := newStreamApp(t, c, idemhttp.Options{Lease: time.Second}, 3)
		conn := rawPost(t, s.addr, "k-abort")
		waitFor(t, s.done, "the handler to return")
		got, _ := io.ReadAll(conn)
		require.Empty(t, string(got), "nothing of the broken-off answer is sent")
		rec, err := c.Get(t.Context(), "k-abort")
		require.NoError(t, err)
		require.Equal(t, client.StateInFlight, rec.State, "nothing stored, nothing released")
		require.Nil(t, rec.Response)

		var r reply
		for try := 0; ; try++ {
			require.Less(t, try, 600, "the orphan was never taken over")
			r = post(t, "http://"+s.addr+"/stream", "k-abort", `{}`)
			if r.status != http.StatusConflict {
				break
			}
			require.Equal(t, "request_in_flight", problemCode(t, r))
			time.Sleep(100 * time.Millisecond)
		}
		require.Equal(t, http.StatusOK, r.status)
		require.Empty(t, r.header.Get(idemhttp.HeaderReplayed), "a takeover runs the handler, no replay")
		require.Equal(t, fullStream(), r.body)
		require.Equal(t, int64(2), s.runs.Load(), "the broken-off run and the takeover")

		r = post(t, "http://"+s.addr+"/stream", "k-abort", `{}`)
		require.Equal(t, "true", r.header.Get(idemhttp.HeaderReplayed))
		require.Equal(t, fullStream(), r.body)
		require.Equal(t, int64(2), s.runs.Load())
	})
}

// holdClaimAnswer is the transport of the middleware's idem client: it
// passes every call on, but holds idem's answer to the first claim, read
// whole, until the call's context is done (the caller went away), and then
// hands it over as if it had just arrived: the claim succeeded, and the
// caller is gone before the handler starts.
type holdClaimAnswer struct {
	answered chan struct{} // closed when idem has answered the first claim
	held     atomic.Bool
}

func (h *holdClaimAnswer) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err != nil || !strings.HasSuffix(req.URL.Path, "/claim") || resp.StatusCode != http.StatusCreated || h.held.Swap(true) {
		return resp, err
	}
	body, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil {
		return nil, err
	}
	close(h.answered)
	select {
	case <-req.Context().Done():
	case <-time.After(30 * time.Second):
		return nil, errors.New("the caller never went away")
	}
	resp.Body = io.NopCloser(bytes.NewReader(body))
	return resp, nil
}

// TestMiddlewareCallerGoneBeforeTheHandlerStarts: the claim succeeds, and
// the caller is gone before the handler starts: the handler does not run
// and the key is released, so the caller's retry runs it (once).
func TestMiddlewareCallerGoneBeforeTheHandlerStarts(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, srv *servertest.Server, _ *client.Client) {
		hold := &holdClaimAnswer{answered: make(chan struct{})}
		c, err := client.New(srv.URL(), client.WithToken(srv.Token(t, "shop", "keys:write")),
			client.WithHTTPClient(&http.Client{Transport: hold}))
		require.NoError(t, err)
		s := newStreamApp(t, c, idemhttp.Options{}, 0)
		conn := rawPost(t, s.addr, "k-gone")
		waitFor(t, hold.answered, "idem's answer to the claim")
		require.NoError(t, conn.Close())
		require.Eventually(t, func() bool {
			_, err := c.Get(t.Context(), "k-gone")
			return errors.Is(err, client.ErrKeyNotFound)
		}, 30*time.Second, 20*time.Millisecond, "the key released")
		require.Zero(t, s.runs.Load(), "the handler did not start")

		r := post(t, "http://"+s.addr+"/stream", "k-gone", `{}`)
		require.Equal(t, http.StatusOK, r.status)
		require.Empty(t, r.header.Get(idemhttp.HeaderReplayed))
		require.Equal(t, fullStream(), r.body)
		require.Equal(t, int64(1), s.runs.Load())
	})
}
