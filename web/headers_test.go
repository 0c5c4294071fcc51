package web_test

import (
	"io/fs"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem/testkit/browser"
	"github.com/idem-dev/idem/testkit/servertest"
	"github.com/idem-dev/idem/web"
)

// TestPagesSecurityHeaders: every answer of the dashboard and the docs,
// pages and assets, carries a Content-Security-Policy (the API
// reference's own one), X-Frame-Options: DENY, nosniff and no-referrer,
// as the server serves them. Before, none did: the dashboard, which holds
// an operator token, could be framed and ran whatever script got into it.
func TestPagesSecurityHeaders(t *testing.T) {
	t.Parallel()
	srv := servertest.Start(t, servertest.Options{})
	for path, csp := range map[string]string{
		"/dashboard/":                            web.DashboardCSP,
		"/dashboard/dashboard.js":                web.DashboardCSP,
		"/dashboard/no-such-file":                web.DashboardCSP,
		"/docs/":                                 web.DocsCSP,
		"/docs/errors/":                          web.DocsCSP,
		"/docs/assets/docs.js":                   web.DocsCSP,
		"/docs/api/":                             web.APIReferenceCSP,
		"/docs/api/index.html":                   web.APIReferenceCSP,
		"/docs/vendor/redoc/redoc.standalone.js": web.DocsCSP,
	} {
		resp, err := http.Get(srv.URL() + path)
		require.NoError(t, err)
		resp.Body.Close()
		h := resp.Header
		require.Equal(t, csp, h.Get("Content-Security-Policy"), path)
		require.Contains(t, csp, "frame-ancestors 'none'")
		require.NotContains(t, strings.SplitN(strings.SplitN(csp, "script-src", 2)[1], ";", 2)[0], "unsafe", "no inline or eval'd script, anywhere")
		require.Equal(t, "DENY", h.Get("X-Frame-Options"), path)
		require.Equal(t, "nosniff", h.Get("X-Content-Type-Options"), path)
		require.Equal(t, "no-referrer", h.Get("Referrer-Policy"), path)
	}
}

// TestPagesNeedNoInlineCode: the policies allow no inline script (and,
// but for the API reference's Redoc, no inline style), so no page may
// hold one: every <script> loads a file, no element has an on* handler,
// a style attribute or a javascript: URL, and there is no <style>.
func TestPagesNeedNoInlineCode(t *testing.T) {
	t.Parallel()
	script := regexp.MustCompile(`(?is)<script\b[^>]*>`)
	inline := regexp.MustCompile(`(?is)<style\b|\sstyle\s*=|\son[a-z]+\s*=|javascript:`)
	for name, site := range map[string]fs.FS{"docs": web.Docs(), "dashboard": web.Dashboard()} {
		err := fs.WalkDir(site, ".", func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".html") {
				return err
			}
			b, err := fs.ReadFile(site, path)
			require.NoError(t, err)
			for _, tag := range script.FindAllString(string(b), -1) {
				require.Contains(t, tag, "src=", "%s/%s: an inline script", name, path)
			}
			require.NotRegexp(t, inline, string(b), "%s/%s", name, path)
			return nil
		})
		require.NoError(t, err)
	}
}

// TestCSPIsEnforcedAndReported opens the dashboard in headless Chromium
// and tries what the policy forbids: an inline script (it does not run),
// an inline style attribute, and framing the page from another origin
// (the frame stays empty). Each is refused and reported on the console,
// which is how the dashboard and docs browser tests
// (RequireNoConsoleErrors) would see a page that breaks its own policy.
// Before the headers, the script ran and the frame loaded.
func TestCSPIsEnforcedAndReported(t *testing.T) {
	t.Parallel()
	b := browser.New(t)
	srv := servertest.Start(t, servertest.Options{})
	b.Do(chromedp.Navigate(srv.URL()+"/dashboard/"), chromedp.WaitVisible(chromedp.CSS("#token")))
	require.Empty(t, b.ConsoleErrors(), "the dashboard keeps its own policy")

	ran := browser.Run(b, chromedp.Evaluate[bool](`(() => {
		const s = document.createElement("script");
		s.textContent = "window.__injected = true";
		document.head.append(s);
		document.body.setAttribute("style", "outline: 5px solid red");
		return window.__injected === true;
	})()`))
	require.False(t, ran, "an inline script ran under the dashboard's policy")
	outline := browser.Run(b, chromedp.Evaluate[string](`getComputedStyle(document.body).outlineStyle`))
	require.NotEqual(t, "solid", outline, "an inline style attribute applied")

	// Another origin (another port of loopback) frames the dashboard.
	framer := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		_, _ = w.Write([]byte(`<!doctype html><iframe id="f" src="` + srv.URL() + `/dashboard/"></iframe>`))
	}))
	t.Cleanup(framer.Close)
	b.Do(chromedp.Navigate(framer.URL))
	require.Eventually(t, func() bool { return reported(b, "frame-ancestors") || reported(b, "X-Frame-Options") }, 30*time.Second, 50*time.Millisecond,
		"framing refused and reported: %v", b.ConsoleErrors())

	require.Eventually(t, func() bool { return reported(b, "script-src") }, 30*time.Second, 50*time.Millisecond, "%v", b.ConsoleErrors())
	require.Eventually(t, func() bool { return reported(b, "style-src") }, 30*time.Second, 50*time.Millisecond, "%v", b.ConsoleErrors())
}

// reported reports whether a console error names a Content Security
// Policy violation of directive (or a refusal naming it).
func reported(b *browser.Browser, directive string) bool {
	for _, e := range b.ConsoleErrors() {
		if strings.Contains(e, directive) {
			return true
		}
	}
	return false
}
