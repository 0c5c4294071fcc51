package web_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/getkin/kin-openapi/openapi3"
	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/testkit/browser"
	"github.com/idem-dev/idem/testkit/contract"
	"github.com/idem-dev/idem/testkit/servertest"
	"github.com/idem-dev/idem/web"
)

// examplesDir is where the runnable examples live, relative to this package.
const examplesDir = "docs/examples"

// interpreter returns the path of a tool the examples need, skipping the
// test when the machine lacks it (set IDEM_REQUIRE_EXAMPLES=1 to fail).
func interpreter(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("IDEM_REQUIRE_EXAMPLES") == "1" {
			t.Fatalf("%s not found but IDEM_REQUIRE_EXAMPLES=1", name)
		}
		t.Skipf("%s not found; skipping its example", name)
	}
	return p
}

// runExample runs one example with IDEM_URL, IDEM_TOKEN and IDEM_KEY set and
// returns its combined output; it fails the test when the example exits
// non-zero.
func runExample(t *testing.T, baseURL, token, key string, argv ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), "IDEM_URL="+baseURL, "IDEM_TOKEN="+token, "IDEM_KEY="+key)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	t.Logf("%s:\n%s", strings.Join(argv, " "), out.String())
	require.NoError(t, err, "example %v failed:\n%s", argv, out.String())
	return out.String()
}

// apiClient returns an HTTP client whose every exchange is checked against
// openapi.yaml.
func apiClient(t *testing.T) *http.Client {
	return &http.Client{Transport: contract.Transport(t, http.DefaultTransport), Timeout: 10 * time.Second}
}

// requireCompleted asserts through the API that key is completed with the
// example's 201 response and that a new claim of it is a replay.
func requireCompleted(t *testing.T, c *http.Client, baseURL, token, key string, request any) {
	t.Helper()
	get := func(method, p string, body any) (int, http.Header, map[string]any) {
		var rd io.Reader
		if body != nil {
			b, err := json.Marshal(body)
			require.NoError(t, err)
			rd = bytes.NewReader(b)
		}
		req, err := http.NewRequest(method, baseURL+p, rd)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+token)
		if body != nil {
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err := c.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		var m map[string]any
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&m))
		return resp.StatusCode, resp.Header, m
	}
	keyPath := "/v1/keys/" + url.PathEscape(key)
	status, _, rec := get("GET", keyPath, nil)
	require.Equal(t, http.StatusOK, status, "%v", rec)
	require.Equal(t, "completed", rec["state"])
	resp, ok := rec["response"].(map[string]any)
	require.True(t, ok, "a completed record carries its response: %v", rec)
	require.EqualValues(t, 201, resp["status"])
	require.JSONEq(t, `{"order_id":"4711","status":"confirmed"}`, resp["body"].(string))

	status, h, replay := get("POST", keyPath+"/claim", map[string]any{
		"operation": "POST /orders/4711/confirm", "request": request,
	})
	require.Equal(t, http.StatusOK, status, "a second claim must be a replay: %v", replay)
	require.Equal(t, "true", h.Get("Idempotent-Replayed"))
	require.Equal(t, rec["fencing_token"], replay["fencing_token"], "the replay is the same record")
}

func TestExamplesRunAgainstLiveServer(t *testing.T) {
	t.Parallel()
	srv := servertest.Start(t, servertest.Options{Tenants: []string{"docs"}})
	token := srv.Token(t, "docs", "keys:write")
	c := apiClient(t)
	quickstartRequest := map[string]any{"order_id": "4711", "amount": 1000, "currency": "usd"}
	retryRequest := map[string]any{"order_id": "4711", "amount": 1000}

	quickstarts := []struct {
		name string
		argv func(t *testing.T) []string
	}{
		{"python", func(t *testing.T) []string {
			return []string{interpreter(t, "python3"), filepath.Join(examplesDir, "quickstart.py")}
		}},
		{"node", func(t *testing.T) []string {
			return []string{interpreter(t, "node"), filepath.Join(examplesDir, "quickstart.mjs")}
		}},
		{"curl", func(t *testing.T) []string {
			interpreter(t, "curl")
			return []string{interpreter(t, "bash"), filepath.Join(examplesDir, "quickstart.sh")}
		}},
		{"go", func(t *testing.T) []string {
			return []string{filepath.Join(runtime.GOROOT(), "bin", "go"), "run", "./" + examplesDir + "/go/quickstart"}
		}},
	}
	quickstarts = append(quickstarts, struct {
		name string
		argv func(t *testing.T) []string
	}{"python-sdk", pythonSDK("quickstart_sdk.py")}, struct {
		name string
		argv func(t *testing.T) []string
	}{"node-sdk", nodeSDK("quickstart_sdk.mjs")})
	for _, tc := range quickstarts {
		t.Run("quickstart-"+tc.name, func(t *testing.T) {
			t.Parallel()
			key := "order-confirm-4711-quickstart-" + tc.name
			out := runExample(t, srv.URL(), token, key, tc.argv(t)...)
			require.Contains(t, out, "replayed "+key)
			requireCompleted(t, c, srv.URL(), token, key, quickstartRequest)
		})
	}

	// The retry loops run through a proxy that answers the first claim with
	// 503 and Retry-After: 1, so that they must retry once to succeed.
	for _, tc := range retryLoops {
		t.Run("retry-loop-"+tc.name, func(t *testing.T) {
			t.Parallel()
			key := "order-confirm-4711-retry-" + tc.name
			proxy, claims := flakyProxy(t, srv.URL())
			out := runExample(t, proxy, token, key, tc.argv(t)...)
			require.Contains(t, out, "completed "+key)
			require.Regexp(t, `outcome=retry`, out, "the loop must log the retry")
			require.EqualValues(t, 2, claims.Load(), "one refused claim, one retried claim")
			requireCompleted(t, c, srv.URL(), token, key, retryRequest)
		})
	}
}

// pythonSDK returns the command line of a docs example that uses the
// Python SDK: the virtualenv scripts/install-test-deps makes (.venv at the
// repository root, with httpx) and the SDK's source on PYTHONPATH.
func pythonSDK(example string) func(t *testing.T) []string {
	return func(t *testing.T) []string {
		root, err := filepath.Abs("..")
		require.NoError(t, err)
		py := filepath.Join(root, ".venv", "bin", "python")
		if _, err := os.Stat(py); err != nil {
			if os.Getenv("IDEM_REQUIRE_EXAMPLES") == "1" {
				t.Fatalf("%s not found but IDEM_REQUIRE_EXAMPLES=1: run scripts/install-test-deps", py)
			}
			t.Skipf("%s not found (run scripts/install-test-deps); skipping the Python SDK example", py)
		}
		return []string{interpreter(t, "env"), "PYTHONPATH=" + filepath.Join(root, "clients", "python", "src"), py,
			filepath.Join(examplesDir, example)}
	}
}

// nodeSDK returns the command line of a docs example that uses the Node
// SDK, run as a user who did `npm install ./clients/node` would run it: the
// example is copied into a project folder whose node_modules/@idem-dev/idem
// links to clients/node (its committed dist/; it has no dependencies).
func nodeSDK(example string) func(t *testing.T) []string {
	return func(t *testing.T) []string {
		node := interpreter(t, "node")
		root, err := filepath.Abs("..")
		require.NoError(t, err)
		project := t.TempDir()
		require.NoError(t, os.MkdirAll(filepath.Join(project, "node_modules", "@idem-dev"), 0o755))
		require.NoError(t, os.Symlink(filepath.Join(root, "clients", "node"), filepath.Join(project, "node_modules", "@idem-dev", "idem")))
		src, err := os.ReadFile(filepath.Join(examplesDir, example))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(project, example), src, 0o644))
		return []string{node, filepath.Join(project, example)}
	}
}

// retryLoops are the docs' example retry loops, one per language: the
// command line that runs each.
var retryLoops = []struct {
	name string
	argv func(t *testing.T) []string
}{
	{"python", func(t *testing.T) []string {
		return []string{interpreter(t, "python3"), filepath.Join(examplesDir, "retry_loop.py")}
	}},
	{"node", func(t *testing.T) []string {
		return []string{interpreter(t, "node"), filepath.Join(examplesDir, "retry_loop.mjs")}
	}},
	{"go", func(t *testing.T) []string {
		return []string{filepath.Join(runtime.GOROOT(), "bin", "go"), "run", "./" + examplesDir + "/go/retryloop"}
	}},
}

// TestRetryLoopsWaitOutInFlight runs the retry loops through a proxy that
// answers the first claim with 409 request_in_flight and Retry-After: 1:
// the loop must wait and claim again within its deadline instead of giving
// up (every other 409 is final).
func TestRetryLoopsWaitOutInFlight(t *testing.T) {
	t.Parallel()
	srv := servertest.Start(t, servertest.Options{Tenants: []string{"docs"}})
	token := srv.Token(t, "docs", "keys:write")
	c := apiClient(t)
	for _, tc := range retryLoops {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			key := "order-confirm-4711-in-flight-" + tc.name
			proxy, claims := answeringProxy(t, srv.URL(), http.StatusConflict,
				`{"type":"urn:idem:problem:request_in_flight","title":"Request in flight","status":409,"code":"request_in_flight","retryable":true}`)
			out := runExample(t, proxy, token, key, tc.argv(t)...)
			require.Contains(t, out, "completed "+key)
			require.Contains(t, out, "outcome=wait_in_flight", "the loop must log the wait")
			require.EqualValues(t, 2, claims.Load(), "one claim answered in flight, one after the wait")
			requireCompleted(t, c, srv.URL(), token, key, map[string]any{"order_id": "4711", "amount": 1000})
		})
	}
}

// flakyProxy forwards to target but answers the first claim it sees with a
// store_unavailable 503 carrying Retry-After: 1. It counts the claims.
func flakyProxy(t *testing.T, target string) (string, *atomic.Int64) {
	t.Helper()
	return answeringProxy(t, target, http.StatusServiceUnavailable,
		`{"type":"/docs/errors#store_unavailable","title":"Store unavailable","status":503,"code":"store_unavailable","retryable":true}`)
}

// answeringProxy forwards to target but answers the first claim it sees
// with status, the problem document problem and Retry-After: 1. It counts
// the claims.
func answeringProxy(t *testing.T, target string, status int, problem string) (string, *atomic.Int64) {
	t.Helper()
	u, err := url.Parse(target)
	require.NoError(t, err)
	rp := httputil.NewSingleHostReverseProxy(u)
	var claims atomic.Int64
	ps := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/claim") && claims.Add(1) == 1 {
			w.Header().Set("Content-Type", "application/problem+json")
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(status)
			_, _ = io.WriteString(w, problem)
			return
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(ps.Close)
	return ps.URL, &claims
}

var (
	linkAttr = regexp.MustCompile(`\s(?:href|src|data-src)="([^"]*)"`)
	idAttr   = regexp.MustCompile(`\sid="([^"]+)"`)
)

// page is one HTML file of the docs: its path in the FS and its ids.
type page struct {
	body string
	ids  map[string]bool
}

func loadPages(t *testing.T, docs fs.FS) map[string]page {
	t.Helper()
	pages := map[string]page{}
	require.NoError(t, fs.WalkDir(docs, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || path.Ext(p) != ".html" {
			return err
		}
		b, err := fs.ReadFile(docs, p)
		if err != nil {
			return err
		}
		pg := page{body: string(b), ids: map[string]bool{}}
		for _, m := range idAttr.FindAllStringSubmatch(pg.body, -1) {
			require.False(t, pg.ids[m[1]], "%s: duplicate id %q", p, m[1])
			pg.ids[m[1]] = true
		}
		pages[p] = pg
		return nil
	}))
	return pages
}

// resolve maps a link found in page p to a file of the docs FS ("" when the
// link leaves the docs but stays on the server, like /openapi.yaml).
func resolve(t *testing.T, docs fs.FS, from, link string) (file, fragment string, ok bool) {
	u, err := url.Parse(link)
	if err != nil {
		return "", "", false
	}
	if u.Scheme != "" || u.Host != "" {
		return "", "", false
	}
	var target string
	switch {
	case u.Path == "":
		target = from
	case strings.HasPrefix(u.Path, "/"):
		if u.Path == "/openapi.yaml" {
			return "", "", true
		}
		rest, found := strings.CutPrefix(u.Path, "/docs/")
		if !found && u.Path != "/docs" {
			return "", "", false
		}
		target = rest
	default:
		target = path.Join(path.Dir(from), u.Path)
	}
	target = strings.TrimPrefix(path.Clean("/"+target), "/")
	if target == "" {
		target = "."
	}
	if st, err := fs.Stat(docs, target); err == nil && st.IsDir() {
		target = path.Join(target, "index.html")
	}
	if _, err := fs.Stat(docs, target); err != nil {
		return "", "", false
	}
	return target, u.Fragment, true
}

func TestDocsLinksResolve(t *testing.T) {
	t.Parallel()
	docs := web.Docs()
	pages := loadPages(t, docs)
	for _, want := range []string{"index.html", "quickstart/index.html", "keys/index.html", "retries/index.html",
		"errors/index.html", "api/index.html", "operating/index.html", "gateway/index.html", "frameworks/index.html", "conformance/index.html"} {
		require.Contains(t, pages, want, "the docs must have this page")
	}
	checked := 0
	for p, pg := range pages {
		for _, m := range linkAttr.FindAllStringSubmatch(pg.body, -1) {
			link := m[1]
			file, frag, ok := resolve(t, docs, p, link)
			require.True(t, ok, "%s: link %q does not resolve inside the docs (no external links, no missing files)", p, link)
			checked++
			if frag == "" || file == "" {
				continue
			}
			target, isPage := pages[file]
			require.True(t, isPage, "%s: link %q has a fragment but %s is not a page", p, link, file)
			require.True(t, target.ids[frag], "%s: link %q: %s has no id %q", p, link, file, frag)
		}
	}
	require.Greater(t, checked, 50, "the link check found suspiciously few links")
}

// TestErrorsReferenceCoversEveryCode checks that /docs/errors has an anchor
// for each code of the problem schema in openapi.yaml, which is what the
// problem type URIs (/docs/errors#<code>) point to.
func TestErrorsReferenceCoversEveryCode(t *testing.T) {
	t.Parallel()
	doc, err := openapi3.NewLoader().LoadFromData(idem.OpenAPISpec)
	require.NoError(t, err)
	codes := doc.Components.Schemas["Problem"].Value.Properties["code"].Value.Enum
	require.GreaterOrEqual(t, len(codes), 17)
	pages := loadPages(t, web.Docs())
	errorsPage := pages["errors/index.html"]
	for _, c := range codes {
		code := c.(string)
		require.True(t, errorsPage.ids[code], "errors page has no anchor #%s", code)
		require.Contains(t, errorsPage.body, fmt.Sprintf(`href="#%s"`, code), "errors page does not link its own #%s entry", code)
	}
}

// TestDocsServed checks the docs as the server serves them: the problem
// type URI form /docs/errors redirects to the page, the spec is served, and
// every example file is downloadable.
func TestDocsServed(t *testing.T) {
	t.Parallel()
	srv := servertest.Start(t, servertest.Options{})
	noFollow := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := noFollow.Get(srv.URL() + "/docs/errors")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusMovedPermanently, resp.StatusCode)
	loc, err := resp.Request.URL.Parse(resp.Header.Get("Location"))
	require.NoError(t, err)
	require.Equal(t, "/docs/errors/", loc.Path)

	for _, p := range []string{"/docs/", "/docs/errors/", "/docs/api/", "/openapi.yaml",
		"/docs/examples/quickstart.py", "/docs/examples/retry_loop.mjs", "/docs/vendor/redoc/redoc.standalone.js"} {
		resp, err := http.Get(srv.URL() + p)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode, p)
	}
}

func TestDocsInBrowser(t *testing.T) {
	t.Parallel()
	b := browser.New(t)
	srv := servertest.Start(t, servertest.Options{})
	base := srv.URL()

	b.Do(chromedp.Navigate(base+"/docs/"), chromedp.WaitVisible(chromedp.CSS(`main h1`)))
	title := browser.Run(b, chromedp.Title())
	require.Contains(t, title, "idem")
	b.Screenshot("home")

	b.Do(chromedp.Navigate(base+"/docs/quickstart/"), chromedp.WaitVisible(chromedp.CSS(`pre[data-src] code.loaded`)))
	b.Screenshot("quickstart")

	b.Do(chromedp.Navigate(base+"/docs/frameworks/"), chromedp.WaitVisible(chromedp.CSS(`pre[data-src] code.loaded`)))
	b.Screenshot("frameworks")

	b.Do(chromedp.Navigate(base+"/docs/retries/"), chromedp.WaitVisible(chromedp.CSS(`#timeline`)))
	b.Screenshot("retries")

	b.Do(chromedp.Navigate(base+"/docs/keys/"), chromedp.WaitVisible(chromedp.CSS(`#fencing-tokens`)))
	b.Screenshot("keys")

	// The problem type URI form, with its redirect.
	b.Do(chromedp.Navigate(base+"/docs/errors#fingerprint_mismatch"), chromedp.WaitVisible(chromedp.CSS(`#fingerprint_mismatch`)))
	loc := browser.Run(b, chromedp.Location())
	require.True(t, strings.HasSuffix(loc, "/docs/errors/#fingerprint_mismatch"), loc)
	b.Screenshot("errors")

	b.Do(chromedp.Navigate(base+"/docs/operating/"), chromedp.WaitVisible(chromedp.CSS(`#configuration`)))
	b.Screenshot("operating")

	b.Do(chromedp.Navigate(base+"/docs/gateway/"), chromedp.WaitVisible(chromedp.CSS(`#behaviour`)))
	b.Screenshot("gateway")

	b.Do(chromedp.Navigate(base+"/docs/conformance/"), chromedp.WaitVisible(chromedp.CSS(`#scoreboard`)))
	b.Screenshot("conformance")

	// The API reference: wait until Redoc has rendered the operations.
	b.Do(chromedp.Navigate(base+"/docs/api/"),
		chromedp.WaitVisible(chromedp.CSS(`[data-section-id="tag/Keys/operation/claimKey"]`)))
	n := browser.Run(b, chromedp.Evaluate[int](`document.querySelectorAll('[data-section-id*="/operation/"]').length`))
	require.GreaterOrEqual(t, n, 17, "Redoc must render every operation")
	b.Screenshot("api")

	b.RequireNoConsoleErrors()
	b.RequireLoopbackOnly()
}
