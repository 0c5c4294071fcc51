package browser

import (
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"
)

func TestCheckLoopbackURL(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{
		"http://127.0.0.1:8080/dashboard/", "https://localhost/x", "http://[::1]:9/a",
		"http://127.1.2.3/", "data:image/png;base64,AAAA", "blob:http://127.0.0.1:4000/0b1c", "about:blank",
	} {
		require.NoError(t, CheckLoopbackURL(ok), ok)
	}
	for _, bad := range []string{
		"http://example.com/", "https://cdn.jsdelivr.net/x.js", "http://10.0.0.1/", "ws://127.0.0.1/",
		"ftp://127.0.0.1/", "blob:https://example.com/uuid", "chrome-extension://abc/x", "http://localhost.evil.com/",
	} {
		require.Error(t, CheckLoopbackURL(bad), bad)
	}
}

// TestBrowserRecordsRequestsAndConsole loads a page that tries to fetch an
// image from a non-loopback host (which cannot resolve: the browser's
// resolver is disabled) and logs a console error, and checks both are seen.
func TestBrowserRecordsRequestsAndConsole(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		_, _ = io.WriteString(w, `<!doctype html><title>t</title><h1 id="h">hello</h1>
<img src="http://external.invalid/pixel.png">
<script>console.error("boom from page")</script>`)
	}))
	t.Cleanup(srv.Close)

	b := New(t)
	b.Do(chromedp.Navigate(srv.URL + "/"))
	require.Equal(t, "hello", Run(b, chromedp.Text(chromedp.CSS("#h"))))

	reqs := b.Requests()
	require.Contains(t, reqs, srv.URL+"/")
	require.True(t, slices.Contains(reqs, "http://external.invalid/pixel.png"), "requests: %v", reqs)
	var failed []string
	b.checkRequests(func(f string, a ...any) { failed = append(failed, f) })
	require.NotEmpty(t, failed, "a non-loopback request must fail the check")

	require.True(t, slices.ContainsFunc(b.ConsoleErrors(), func(s string) bool {
		return strings.Contains(s, "boom from page")
	}), "console: %v", b.ConsoleErrors())

	path := b.Screenshot("probe")
	st, err := os.Stat(path)
	require.NoError(t, err)
	require.Positive(t, st.Size())
	_ = os.Remove(path)

	// Forget the deliberate violation so cleanup does not fail this test.
	b.mu.Lock()
	b.requests = nil
	b.mu.Unlock()
}
