package idemhttp_test

import (
	"bytes"
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

// cutBody is the 61-byte body of the cut requests: they declare
// Content-Length: 61 and send only a part of it.
var cutBody = `{"amount":1000,"currency":"usd","note":"xxxxxxxxxxxxxxxxxxx"}`

// statusWriter notes the status its request was answered with.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	w.status = code
	w.ResponseWriter.WriteHeader(code)
}

// TestMiddlewareCutRequestBody: a caller sends Content-Length: 61 and 0 or
// 10 bytes of the body, then closes the connection. net/http's body read
// fails (io.ErrUnexpectedEOF): the middleware answers 400 invalid_request
// (to a caller who is gone), claims nothing (the key does not exist in
// idem) and does not run the handler; the whole request with the same key
// then runs once (201). A JSON body and an opaque one. A guard: the
// middleware already refused a body that could not be read (the Python
// WSGI middleware did not: issue 21, a cut request body).
func TestMiddlewareCutRequestBody(t *testing.T) {
	t.Parallel()
	require.Len(t, cutBody, 61)
	forEachBackend(t, func(t *testing.T, _ *servertest.Server, c *client.Client) {
		var runs, done atomic.Int64
		var last atomic.Int64
		mw := idemhttp.Middleware(c, idemhttp.Options{})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b, err := io.ReadAll(r.Body)
			if err != nil {
				http.Error(w, "unreadable body", http.StatusBadRequest)
				return
			}
			runs.Add(1) // the side effect
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			fmt.Fprintf(w, `{"length":%d}`, len(b))
		}))
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			sw := &statusWriter{ResponseWriter: w}
			defer func() {
				last.Store(int64(sw.status))
				done.Add(1)
			}()
			mw.ServeHTTP(sw, r)
		}))
		t.Cleanup(srv.Close)
		addr := strings.TrimPrefix(srv.URL, "http://")

		for _, ctype := range []string{"application/json", "application/octet-stream"} {
			for _, sent := range []int{0, 10} {
				key := fmt.Sprintf("cutbody-%s-%d", strings.TrimPrefix(ctype, "application/"), sent)
				before := done.Load()
				conn, err := net.Dial("tcp", addr)
				require.NoError(t, err)
				_, err = fmt.Fprintf(conn, "POST /pay HTTP/1.1\r\nHost: %s\r\nIdempotency-Key: %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n%s",
					addr, key, ctype, len(cutBody), cutBody[:sent])
				require.NoError(t, err)
				require.NoError(t, conn.Close())
				require.Eventually(t, func() bool { return done.Load() > before }, 30*time.Second, 5*time.Millisecond, "the middleware finished with the cut request")

				require.Equal(t, int64(http.StatusBadRequest), last.Load(), "%s with %d bytes: the middleware's own refusal", ctype, sent)
				_, err = c.Get(t.Context(), key)
				require.ErrorIs(t, err, client.ErrKeyNotFound, "%s with %d bytes: a cut request body claimed the key", ctype, sent)
				require.Zero(t, runs.Load(), "%s with %d bytes: the handler ran on a cut body", ctype, sent)

				req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL+"/pay", bytes.NewReader([]byte(cutBody)))
				require.NoError(t, err)
				req.Header.Set("Idempotency-Key", key)
				req.Header.Set("Content-Type", ctype)
				resp, err := http.DefaultClient.Do(req)
				require.NoError(t, err)
				body, _ := io.ReadAll(resp.Body)
				_ = resp.Body.Close()
				require.Equal(t, http.StatusCreated, resp.StatusCode, string(body))
				require.Empty(t, resp.Header.Get(idemhttp.HeaderReplayed))
				require.Equal(t, int64(1), runs.Load(), "the whole request ran once")
				runs.Store(0)
			}
		}
	})
}
