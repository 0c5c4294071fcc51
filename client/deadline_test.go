package client_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem/client"
)

// The drip: 300 bytes, one every 200 ms; the whole answer would take a
// minute, far more than any bound below.
const (
	dripBytes    = 300
	dripInterval = 200 * time.Millisecond
)

// dripServer is a loopback HTTP server that answers every request slowly,
// with status (e.g. "201 Created"):
// in "body" mode the status line and headers at once, then the body one
// byte every dripInterval; in "head" mode the status line and headers
// themselves one byte at a time. It counts the connections it accepted,
// those still open (the client has not hung up) and the answers it
// finished.
type dripServer struct {
	url                    string
	accepted, open, served atomic.Int64
	stop                   chan struct{}
	wg                     sync.WaitGroup
}

func newDripServer(t *testing.T, mode, status string) *dripServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	s := &dripServer{url: "http://" + ln.Addr().String(), stop: make(chan struct{})}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			s.accepted.Add(1)
			s.open.Add(1)
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				defer s.open.Add(-1)
				defer conn.Close()
				s.serve(conn, mode, status)
			}()
		}
	}()
	t.Cleanup(func() {
		close(s.stop)
		ln.Close()
		s.wg.Wait()
	})
	return s
}

func (s *dripServer) serve(conn net.Conn, mode, status string) {
	req, err := http.ReadRequest(bufio.NewReader(conn))
	if err != nil {
		return
	}
	if _, err := io.Copy(io.Discard, req.Body); err != nil {
		return
	}
	head := fmt.Sprintf("HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", status, dripBytes)
	drip := strings.Repeat(" ", dripBytes)
	if mode == "body" {
		if _, err := io.WriteString(conn, head); err != nil {
			return
		}
	} else {
		drip = head + drip
	}
	// A closed connection shows as a failed write or as readable EOF; the
	// reader notices a client that hangs up between two bytes.
	gone := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, conn)
		close(gone)
	}()
	for i := 0; i < len(drip); i++ {
		select {
		case <-s.stop:
			return
		case <-gone:
			return
		case <-time.After(dripInterval):
		}
		if _, err := conn.Write([]byte{drip[i]}); err != nil {
			return
		}
	}
	s.served.Add(1)
}

// checkTimedOut asserts what a call bounded by its deadline or attempt
// timeout shows: the documented timeout error (context.DeadlineExceeded
// wrapped), far sooner than the drip (loose: a loaded machine must not
// fail it), no answer finished, and every dripping connection hung up.
func checkTimedOut(t *testing.T, err error, elapsed time.Duration, s *dripServer, infos []client.AttemptInfo) {
	t.Helper()
	require.Error(t, err)
	require.ErrorIs(t, err, context.DeadlineExceeded, "%v", err)
	require.Less(t, elapsed, 30*time.Second, "the call took %s", elapsed)
	require.Zero(t, s.served.Load(), "an answer was dripped to its end")
	require.NotEmpty(t, infos)
	require.Equal(t, int64(len(infos)), s.accepted.Load(), "one connection per attempt")
	require.Eventually(t, func() bool { return s.open.Load() == 0 }, 20*time.Second, 20*time.Millisecond,
		"the client left a dripping connection open")
}

// TestDeadlineBoundsDrippingAnswer: a claim whose context has a 2 s
// deadline ends with it, though the server sends a byte every 200 ms (each
// read succeeds; only a wall-clock bound on the whole attempt stops it).
func TestDeadlineBoundsDrippingAnswer(t *testing.T) {
	for _, mode := range []string{"body", "head"} {
		t.Run(mode, func(t *testing.T) {
			s := newDripServer(t, mode, "201 Created")
			var a attempts
			c, err := client.New(s.url, client.WithToken("t"), client.WithAttemptHook(a.hook))
			require.NoError(t, err)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			start := time.Now()
			_, err = c.Claim(ctx, "deadline-go", client.Request{Operation: "POST /x"})
			checkTimedOut(t, err, time.Since(start), s, a.all())
		})
	}
}

// TestAttemptTimeoutBoundsDrippingAnswer: without a deadline, the policy's
// AttemptTimeout (1 s here) bounds each of the three attempts. The answer
// is a 503, so that an attempt cut off in its body is retried too (a 2xx
// cut short is not: the Go and Node clients retry what its status allows).
func TestAttemptTimeoutBoundsDrippingAnswer(t *testing.T) {
	for _, mode := range []string{"body", "head"} {
		t.Run(mode, func(t *testing.T) {
			s := newDripServer(t, mode, "503 Service Unavailable")
			var a attempts
			c, err := client.New(s.url, client.WithToken("t"), client.WithAttemptHook(a.hook),
				client.WithRetryPolicy(client.RetryPolicy{AttemptTimeout: time.Second, BaseDelay: 50 * time.Millisecond, MaxDelay: 100 * time.Millisecond}))
			require.NoError(t, err)
			start := time.Now()
			_, err = c.Get(context.Background(), "deadline-go-attempts")
			infos := a.all()
			require.Len(t, infos, 3, "attempts: %v", err)
			require.Equal(t, "attempts", infos[2].GiveUp)
			require.Contains(t, err.Error(), "giving up after 3 attempts")
			checkTimedOut(t, err, time.Since(start), s, infos)
		})
	}
}
