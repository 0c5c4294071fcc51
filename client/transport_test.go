package client_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem/client"
)

// countingServer answers GET /v1/keys/{key} with a completed record and
// counts the TCP connections it accepted.
func countingServer(t *testing.T) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	var conns atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"key":"k","state":"completed","fencing_token":1,"attempt":1}`)
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	return srv, &conns
}

// TestDefaultTransportReusesConnections: a Client made without
// WithHTTPClient keeps its connections alive and reuses them, one for
// sequential calls and about one per goroutine for concurrent ones (issue
// 23: on http.DefaultTransport, 2 idle connections per host, 16 goroutines
// opened a connection for most calls). A little slack above the
// concurrency: a dial begun while another connection frees up is kept too.
func TestDefaultTransportReusesConnections(t *testing.T) {
	srv, conns := countingServer(t)
	c, err := client.New(srv.URL, client.WithToken("t"))
	require.NoError(t, err)
	ctx := context.Background()

	for range 200 {
		_, err := c.Get(ctx, "k")
		require.NoError(t, err)
	}
	require.LessOrEqual(t, conns.Load(), int64(2), "connections for 200 sequential calls")

	const goroutines, calls = 16, 50
	before := conns.Load()
	var wg sync.WaitGroup
	errs := make(chan error, goroutines*calls)
	for range goroutines {
		wg.Go(func() {
			for range calls {
				if _, err := c.Get(ctx, "k"); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	opened := conns.Load() - before
	t.Logf("connections: %d for 200 sequential calls, %d more for %d×%d concurrent ones", before, opened, goroutines, calls)
	require.LessOrEqual(t, opened, int64(2*goroutines), "new connections for %d×%d concurrent calls", goroutines, calls)
}

// TestNewTransport: the default transport's limits, and that it is a
// clone, not http.DefaultTransport itself.
func TestNewTransport(t *testing.T) {
	tr := client.NewTransport()
	require.Equal(t, client.DefaultMaxIdleConnsPerHost, tr.MaxIdleConnsPerHost)
	require.GreaterOrEqual(t, tr.MaxIdleConns, client.DefaultMaxIdleConnsPerHost)
	require.NotNil(t, tr.Proxy)
	require.NotSame(t, http.DefaultTransport, tr)
}
