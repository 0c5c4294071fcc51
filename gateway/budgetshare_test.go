package gateway_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem/gateway"
)

// fromAddr returns a client whose connections leave from the loopback
// address ip (127.0.0.2, 127.0.0.3, …): to the gateway, another caller.
func fromAddr(ip string) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return d.DialContext(ctx, network, addr)
		},
	}}
}

// Issue 21, hole 3, through the gateway: the gateway serves one tenant and
// needs no token, so one anonymous client announcing large bodies and
// sending one byte of each took the whole in-flight budget, and every other
// caller was 503 server_busy until the body read timeout. Now each caller
// (the route's scope, else the client's address) holds at most its share
// while the budget keeps no share free for the others: the hog at
// 127.0.0.2 holds one largest body, its second is refused, and a caller at
// 127.0.0.3 gets every request through; on a route scoped by a header,
// the same from one address with X-Account-Id hog and quiet (both stores).
func TestInflightShareKeepsOtherCallers(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, scope, hogIP, quietIP, hogScope, quietScope string
	}{
		{"address", "", "127.0.0.2", "127.0.0.3", "", ""},
		{"scope", "  scope_header: X-Account-Id\n", "127.0.0.1", "127.0.0.1", "hog", "quiet"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			testInflightShareKeepsOtherCallers(t, c.scope, c.hogIP, c.quietIP, c.hogScope, c.quietScope)
		})
	}
}

func testInflightShareKeepsOtherCallers(t *testing.T, scope, hogIP, quietIP, hogScope, quietScope string) {
	forEachBackend(t, func(t *testing.T, backend string) {
		const maxBody, maxStored = 1 << 20, 64 << 10
		r := newRig(t, backend, fmt.Sprintf("defaults:\n  max_body_bytes: %d\n  max_stored_bytes: %d\n%s", maxBody, maxStored, scope), func(o *gateway.Options) {
			o.MaxInflightBytes = 8 << 20
			o.BodyReadTimeout = 2 * time.Minute
		})
		inFlight := func() int64 { return int64(r.gauge(t, "idem_gateway_request_body_bytes_in_flight")) }
		addr := strings.TrimPrefix(r.url, "http://")

		// hold announces a body of n bytes from hogIP and sends one
		// byte: true once the gateway holds it, false when it answers.
		hold := func(key string, n int64) (bool, int) {
			t.Helper()
			before := inFlight()
			d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(hogIP)}, Timeout: 5 * time.Second}
			conn, err := d.Dial("tcp", addr)
			require.NoError(t, err)
			t.Cleanup(func() { _ = conn.Close() })
			require.NoError(t, conn.SetDeadline(time.Now().Add(2*time.Minute)))
			scoped := ""
			if hogScope != "" {
				scoped = "X-Account-Id: " + hogScope + "\r\n"
			}
			_, err = fmt.Fprintf(conn, "POST /orders HTTP/1.1\r\nHost: gw\r\nIdempotency-Key: %s\r\n%sContent-Type: application/json\r\nContent-Length: %d\r\n\r\n{", key, scoped, n)
			require.NoError(t, err)
			answer := make(chan int, 1)
			go func() {
				resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
				if err != nil {
					answer <- -1
					return
				}
				_ = resp.Body.Close()
				answer <- resp.StatusCode
			}()
			deadline := time.Now().Add(20 * time.Second)
			for time.Now().Before(deadline) {
				select {
				case code := <-answer:
					return false, code
				case <-time.After(10 * time.Millisecond):
				}
				if inFlight() >= before+n*gateway.BodyMemoryFactor {
					return true, 0
				}
			}
			t.Fatalf("the hog's body of %d bytes was neither held nor answered", n)
			return false, 0
		}
		held, code := hold("hog-1", maxBody)
		require.True(t, held, "the hog's first body (its share) is held; answered %d", code)
		rest := (8<<20-inFlight())/gateway.BodyMemoryFactor - 1
		held, code = hold("hog-2", rest)

		// Every request of the other caller goes through (before the
		// share, the first was 503 server_busy).
		quiet := fromAddr(quietIP)
		for i := range 20 {
			req, err := http.NewRequest(http.MethodPost, r.url+"/orders", strings.NewReader(`{"amount":1}`))
			require.NoError(t, err)
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Idempotency-Key", fmt.Sprintf("quiet-%d", i))
			if quietScope != "" {
				req.Header.Set("X-Account-Id", quietScope)
			}
			resp, err := quiet.Do(req)
			require.NoError(t, err)
			body, _ := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			require.Equal(t, http.StatusCreated, resp.StatusCode, "quiet-%d: %s", i, body)
		}
		require.False(t, held, "a body past the hog's share, leaving no share free, is refused")
		require.Equal(t, http.StatusServiceUnavailable, code)
		require.GreaterOrEqual(t, inFlight(), int64(maxBody*gateway.BodyMemoryFactor), "the hog still holds its share")
		require.Equal(t, int64(20), r.upstream.Count(), "each quiet request ran upstream once; the hog's none")
	})
}
