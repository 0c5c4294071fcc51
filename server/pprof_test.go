package server_test

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem/server"
	"github.com/idem-dev/idem/testkit/servertest"
)

// TestPprofAddr: with IDEM_PPROF_ADDR the real server serves the runtime
// profiles there and only there (the public and metrics addresses answer
// 404 for /debug/pprof/, the profiling address serves nothing else); without
// it no address serves them.
func TestPprofAddr(t *testing.T) {
	t.Parallel()
	get := func(url string) (int, string) {
		t.Helper()
		resp, err := http.Get(url)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(b)
	}
	srv := servertest.Start(t, servertest.Options{Configure: func(c *server.Config) {
		c.PprofAddr = "127.0.0.1:0"
		c.MetricsAddr = "127.0.0.1:0"
	}})
	pprofURL := srv.Server().PprofURL()
	require.NotEmpty(t, pprofURL)
	require.NotEqual(t, srv.URL(), pprofURL)
	require.NotEqual(t, srv.Server().MetricsURL(), pprofURL)

	st, body := get(pprofURL + "/debug/pprof/")
	require.Equal(t, http.StatusOK, st)
	require.Contains(t, body, "goroutine")
	st, body = get(pprofURL + "/debug/pprof/goroutine?debug=1")
	require.Equal(t, http.StatusOK, st)
	require.True(t, strings.HasPrefix(body, "goroutine profile:"), body[:min(len(body), 80)])
	for _, path := range []string{"/healthz", "/metrics", "/v1/tenant"} {
		st, _ = get(pprofURL + path)
		require.Equal(t, http.StatusNotFound, st, path)
	}
	for _, base := range []string{srv.URL(), srv.Server().MetricsURL()} {
		st, _ = get(base + "/debug/pprof/")
		require.Equal(t, http.StatusNotFound, st, base)
	}

	plain := servertest.Start(t, servertest.Options{})
	require.Empty(t, plain.Server().PprofURL())
	st, _ = get(plain.URL() + "/debug/pprof/")
	require.Equal(t, http.StatusNotFound, st)
}
