// Package browser runs Debian's headless Chromium for end-to-end tests
// of the web pages the server ships (the dashboard, the docs).
//
// Usage:
//
//	b := browser.New(t)                   // skips when chromium is missing
//	b.Do(chromedp.Navigate(srv.URL() + "/dashboard/"))
//	text := browser.Run(b, chromedp.Text(chromedp.CSS("#status")))
//	b.Screenshot("dashboard")             // $IDEM_ARTIFACTS_DIR/<Test>-dashboard.png
//	b.RequireNoConsoleErrors()
//
// The browser is /usr/bin/chromium (Debian package "chromium"); it is never
// downloaded. When it is missing the test is skipped, unless
// IDEM_REQUIRE_BROWSER=1, in which case it fails.
//
// Every network request the page makes is recorded. A request to anything
// but loopback (127.0.0.0/8, localhost, [::1]) over http(s), or a URL with
// another scheme than http, https, data or blob, fails the test at cleanup
// (and at RequireLoopbackOnly). Name resolution is also disabled in the
// browser for every host but localhost, 127.0.0.1 and ::1, so such a
// request cannot reach the network even before the test fails. Console errors and uncaught
// exceptions are collected; RequireNoConsoleErrors fails on them.
//
// Screenshots go to $IDEM_ARTIFACTS_DIR, or to artifacts/ at the module
// root (gitignored) when it is unset.
package browser

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
)

// ChromiumPath is where Debian's chromium package installs the browser.
const ChromiumPath = "/usr/bin/chromium"

// EnvRequire names the variable that turns a missing browser into a failure.
const EnvRequire = "IDEM_REQUIRE_BROWSER"

// EnvArtifacts names the variable holding the directory for screenshots.
const EnvArtifacts = "IDEM_ARTIFACTS_DIR"

// DefaultTimeout bounds each Do/Run call. It is generous on purpose: it only
// stops a hung browser, and on a loaded 2-core CI machine Chromium can take
// tens of seconds to parse and render the Redoc bundle.
const DefaultTimeout = 90 * time.Second

// one lets a single Chromium run at a time in a test process: parallel page
// tests on a 2-core machine that is also running the race-enabled Go
// suite made each other miss their waits; one at a time, each gets the
// machine's spare core. A test holds it from New until its cleanup, so a
// test must not start a second browser while it holds one.
var one = make(chan struct{}, 1)

// Browser is one headless Chromium tab with request and console recording.
type Browser struct {
	t   testing.TB
	ctx context.Context

	mu       sync.Mutex
	requests []string
	console  []string
}

// New starts headless Chromium with a temporary profile and returns a tab.
// The browser is closed, and every request checked to stay on loopback,
// when the test ends.
func New(t testing.TB) *Browser {
	t.Helper()
	path := findChromium()
	if path == "" {
		if os.Getenv(EnvRequire) == "1" {
			t.Fatalf("browser: chromium not found at %s but %s=1 (apt-get install -y chromium)", ChromiumPath, EnvRequire)
		}
		t.Skipf("browser: chromium not found at %s; skipping browser test (apt-get install -y chromium)", ChromiumPath)
	}

	one <- struct{}{}
	t.Cleanup(func() { <-one })

	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.Flag("headless", true),
		chromedp.Flag("no-sandbox", true),
		chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("no-first-run", true),
		chromedp.Flag("no-default-browser-check", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.Flag("disable-features", "Translate,OptimizationHints,MediaRouter,InterestFeedContentSuggestions"),
		chromedp.Flag("host-resolver-rules", "MAP * ~NOTFOUND, EXCLUDE localhost, EXCLUDE 127.0.0.1, EXCLUDE [::1]"),
		chromedp.WindowSize(1280, 900),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	b := &Browser{t: t}
	ctx, cancel := chromedp.NewContext(actx,
		chromedp.WithListener(b.onEvent),
		chromedp.WithLogf(func(string, ...any) {}),
	)
	b.ctx = ctx
	t.Cleanup(func() {
		cancel()
		cancelAlloc()
		b.checkRequests(t.Errorf)
	})
	// Start the browser now so a broken install fails here, clearly.
	if err := chromedp.Do(b.timeout(), chromedp.Navigate("about:blank")); err != nil {
		t.Fatalf("browser: start chromium: %v", err)
	}
	return b
}

func findChromium() string {
	if _, err := os.Stat(ChromiumPath); err == nil {
		return ChromiumPath
	}
	if p, err := exec.LookPath("chromium"); err == nil {
		return p
	}
	return ""
}

// Context returns the tab's chromedp context, for actions this package
// does not wrap.
func (b *Browser) Context() context.Context { return b.ctx }

func (b *Browser) timeout() context.Context {
	ctx, cancel := context.WithTimeout(b.ctx, DefaultTimeout)
	b.t.Cleanup(cancel)
	return ctx
}

// Do runs actions in the tab and fails the test on error.
func (b *Browser) Do(actions ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	if err := chromedp.Do(b.timeout(), actions...); err != nil {
		b.t.Fatalf("browser: %v\nconsole: %s", err, strings.Join(b.ConsoleErrors(), "\n"))
	}
}

// Run runs one action that returns a value and fails the test on error.
func Run[T any](b *Browser, action chromedp.Action[T]) T {
	b.t.Helper()
	v, err := chromedp.Run(b.timeout(), action)
	if err != nil {
		b.t.Fatalf("browser: %v\nconsole: %s", err, strings.Join(b.ConsoleErrors(), "\n"))
	}
	return v
}

// ClickNow waits for sel to be visible and clicks the element it names at
// that instant, in the page: a table the page re-renders on its refresh
// replaces its rows, and chromedp.Click, which finds the node first and
// clicks it after, then fails with "Could not find node with given id"
// (seen on the dashboard under two make tests side by side).
func (b *Browser) ClickNow(sel string) {
	b.t.Helper()
	b.Do(chromedp.WaitVisible(chromedp.CSS(sel)))
	js, _ := json.Marshal(sel)
	// Poll evaluates until the element is there and clicked, or times out.
	Run(b, chromedp.Poll[bool](`(() => { const e = document.querySelector(`+string(js)+`); if (!e) return false; e.click(); return true })()`))
}

// Requests returns the URLs of every request the page made so far.
func (b *Browser) Requests() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.requests...)
}

// ConsoleErrors returns console.error calls, uncaught exceptions and
// browser log entries of level error, as text.
func (b *Browser) ConsoleErrors() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.console...)
}

// RequireNoConsoleErrors fails the test if the page logged an error or
// threw an uncaught exception.
func (b *Browser) RequireNoConsoleErrors() {
	b.t.Helper()
	if errs := b.ConsoleErrors(); len(errs) > 0 {
		b.t.Fatalf("browser: console errors:\n%s", strings.Join(errs, "\n"))
	}
}

// RequireLoopbackOnly fails the test if any request so far left loopback
// or used a scheme other than http, https, data or blob. It runs
// automatically at cleanup too.
func (b *Browser) RequireLoopbackOnly() {
	b.t.Helper()
	b.checkRequests(b.t.Fatalf)
}

func (b *Browser) checkRequests(fail func(string, ...any)) {
	var bad []string
	for _, u := range b.Requests() {
		if err := CheckLoopbackURL(u); err != nil {
			bad = append(bad, err.Error())
		}
	}
	if len(bad) > 0 {
		fail("browser: requests left loopback:\n%s", strings.Join(bad, "\n"))
	}
}

// CheckLoopbackURL returns an error unless raw is a data: or blob: URL, or
// an http(s) URL whose host is 127.0.0.0/8, localhost or [::1].
func CheckLoopbackURL(raw string) error {
	if raw == "about:blank" {
		return nil
	}
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("%q: unparsable URL: %w", raw, err)
	}
	switch u.Scheme {
	case "data":
		return nil
	case "blob":
		// blob:http://127.0.0.1:1234/uuid carries its origin.
		return CheckLoopbackURL(u.Opaque)
	case "http", "https":
	default:
		return fmt.Errorf("%q: scheme %q is not http, https, data or blob", raw, u.Scheme)
	}
	host := u.Hostname()
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return nil
	}
	return fmt.Errorf("%q: host %q is not loopback", raw, host)
}

// onEvent runs in the tab's read loop: it must return fast.
func (b *Browser) onEvent(ev any) {
	switch ev := ev.(type) {
	case *network.EventRequestWillBeSent:
		if ev.Request != nil {
			b.mu.Lock()
			b.requests = append(b.requests, ev.Request.URL)
			b.mu.Unlock()
		}
	case *runtime.EventConsoleAPICalled:
		if ev.Type == "error" || ev.Type == "assert" {
			var parts []string
			for _, a := range ev.Args {
				switch {
				case a.Description != "":
					parts = append(parts, a.Description)
				case len(a.Value) > 0:
					parts = append(parts, string(a.Value))
				default:
					parts = append(parts, string(a.Type))
				}
			}
			b.addConsole("console." + string(ev.Type) + ": " + strings.Join(parts, " "))
		}
	case *runtime.EventExceptionThrown:
		if d := ev.ExceptionDetails; d != nil {
			msg := d.Text
			if d.Exception != nil && d.Exception.Description != "" {
				msg += " " + d.Exception.Description
			}
			b.addConsole(fmt.Sprintf("exception: %s (%s:%d)", msg, d.URL, d.LineNumber))
		}
	case *log.EventEntryAdded:
		if e := ev.Entry; e != nil && e.Level == log.EntryLevelError {
			b.addConsole(fmt.Sprintf("log[%s]: %s %s", e.Source, e.Text, e.URL))
		}
	}
}

func (b *Browser) addConsole(s string) {
	b.mu.Lock()
	b.console = append(b.console, s)
	b.mu.Unlock()
}

// Screenshot saves a full-page PNG named "<TestName>-<name>.png" in the
// artifacts directory and returns its path.
func (b *Browser) Screenshot(name string) string {
	b.t.Helper()
	png := Run(b, topScreenshot(screenshotMaxHeight))
	dir := ArtifactsDir(b.t)
	path := filepath.Join(dir, safeName(b.t.Name()+"-"+name)+".png")
	if err := os.WriteFile(path, png, 0o644); err != nil {
		b.t.Fatalf("browser: save screenshot: %v", err)
	}
	b.t.Logf("browser: screenshot saved to %s", path)
	return path
}

// screenshotMaxHeight bounds a screenshot's height in CSS pixels. The API
// reference renders tens of thousands of pixels, and capturing all of them
// lost the connection to the browser on a loaded machine (TestDocsInBrowser,
// "context canceled" at the Redoc page, three times in a day).
const screenshotMaxHeight = 6000

// topScreenshot captures the page's full width and at most maxHeight CSS
// pixels from its top, as a PNG.
func topScreenshot(maxHeight float64) chromedp.Action[[]byte] {
	return func(ctx context.Context, t *chromedp.Target) ([]byte, error) {
		size, err := chromedp.Evaluate[[2]float64](`[document.documentElement.scrollWidth, document.documentElement.scrollHeight]`)(ctx, t)
		if err != nil {
			return nil, err
		}
		beyond := true
		r, err := cdp.Call(ctx, t, page.CaptureScreenshot, page.CaptureScreenshotParams{
			Format:                page.CaptureScreenshotFormatPng,
			Clip:                  &page.Viewport{Width: size[0], Height: min(size[1], maxHeight), Scale: 1},
			FromSurface:           &beyond,
			CaptureBeyondViewport: &beyond,
		})
		if err != nil {
			return nil, err
		}
		return r.Data, nil
	}
}

var unsafeChars = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

func safeName(s string) string { return unsafeChars.ReplaceAllString(s, "_") }

// ArtifactsDir returns (and creates) $IDEM_ARTIFACTS_DIR, or artifacts/ at
// the module root (the nearest parent directory holding go.mod).
func ArtifactsDir(t testing.TB) string {
	t.Helper()
	dir := os.Getenv(EnvArtifacts)
	if dir == "" {
		wd, err := os.Getwd()
		if err != nil {
			t.Fatalf("browser: getwd: %v", err)
		}
		root := wd
		for {
			if _, err := os.Stat(filepath.Join(root, "go.mod")); err == nil {
				break
			}
			parent := filepath.Dir(root)
			if parent == root {
				root = wd
				break
			}
			root = parent
		}
		dir = filepath.Join(root, "artifacts")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatalf("browser: create artifacts dir: %v", err)
	}
	return dir
}
