package web_test

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem/testkit/servertest"
)

// frameworkExamples are the docs' framework pages' apps
// (docs/examples/frameworks, shown by docs/frameworks/ as they are): the
// command line that starts each as its page says.
var frameworkExamples = []struct {
	name string
	argv func(t *testing.T) []string
}{
	{"fastapi", pythonSDK("frameworks/fastapi_app.py")},
	{"flask", pythonSDK("frameworks/flask_app.py")},
	{"django", pythonSDK("frameworks/django_app.py")},
	{"express", nodeApp("frameworks/express_app.mjs", "express")},
}

// nodeApp is nodeSDK for an app that also imports packages of the Node
// SDK's own dev dependencies (express): the project folder links them from
// clients/node/node_modules, as `npm install express` would install them.
func nodeApp(example string, packages ...string) func(t *testing.T) []string {
	return func(t *testing.T) []string {
		node := interpreter(t, "node")
		root, err := filepath.Abs("..")
		require.NoError(t, err)
		project := t.TempDir()
		require.NoError(t, os.MkdirAll(filepath.Join(project, "node_modules", "@idem-dev"), 0o755))
		require.NoError(t, os.Symlink(filepath.Join(root, "clients", "node"), filepath.Join(project, "node_modules", "@idem-dev", "idem")))
		for _, p := range packages {
			require.NoError(t, os.Symlink(filepath.Join(root, "clients", "node", "node_modules", p), filepath.Join(project, "node_modules", p)))
		}
		src, err := os.ReadFile(filepath.Join(examplesDir, example))
		require.NoError(t, err)
		file := filepath.Join(project, filepath.Base(example))
		require.NoError(t, os.WriteFile(file, src, 0o644))
		return []string{node, file}
	}
}

// TestFrameworkExamples runs each framework page's app as its page says,
// against a live idem server, and tries a duplicate as the page does: the
// first request runs the handler (201), the second with the same key is
// the stored answer, byte for byte, with Idempotent-Replayed: true, and
// the handler's side effect happened once.
func TestFrameworkExamples(t *testing.T) {
	t.Parallel()
	srv := servertest.Start(t, servertest.Options{Tenants: []string{"docs"}})
	token := srv.Token(t, "docs", "keys:write")
	for _, tc := range frameworkExamples {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			port := freePort(t)
			out := startApp(t, tc.argv(t), "IDEM_URL="+srv.URL(), "IDEM_TOKEN="+token, "PORT="+strconv.Itoa(port))
			base := "http://127.0.0.1:" + strconv.Itoa(port)
			waitListening(t, port, out)

			post := func() (int, http.Header, string) {
				req, err := http.NewRequest("POST", base+"/charges", strings.NewReader(`{"amount": 1000}`))
				require.NoError(t, err)
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Idempotency-Key", "order-"+tc.name)
				resp, err := http.DefaultClient.Do(req)
				require.NoError(t, err)
				defer resp.Body.Close()
				b, err := io.ReadAll(resp.Body)
				require.NoError(t, err)
				return resp.StatusCode, resp.Header, string(b)
			}
			status, h, body := post()
			require.Equal(t, http.StatusCreated, status, "%s\napp output:\n%s", body, out.String())
			require.Empty(t, h.Get("Idempotent-Replayed"))
			require.JSONEq(t, `{"charge":"ch_1","amount":1000}`, body)

			status2, h2, body2 := post()
			require.Equal(t, http.StatusCreated, status2, body2)
			require.Equal(t, "true", h2.Get("Idempotent-Replayed"))
			require.Equal(t, body, body2, "the replay is the stored answer, byte for byte")
			require.Equal(t, 1, strings.Count(out.String(), "charged 1000"), "one side effect:\n%s", out.String())
			require.Contains(t, out.String(), "charged 1000 (charge 1)")
		})
	}
}

// lockedBuffer is the output of a running app, read while it writes;
// exited is closed when the app has ended.
type lockedBuffer struct {
	mu     sync.Mutex
	b      bytes.Buffer
	exited chan struct{}
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// startApp starts a long-running example with env added and stops it when
// the test ends; its combined output is returned as it grows.
func startApp(t *testing.T, argv []string, env ...string) *lockedBuffer {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), env...)
	out := &lockedBuffer{exited: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = out, out
	require.NoError(t, cmd.Start())
	go func() { _ = cmd.Wait(); close(out.exited) }()
	t.Cleanup(func() {
		cancel()
		<-out.exited
		t.Logf("%s:\n%s", strings.Join(argv, " "), out.String())
	})
	return out
}

// freePort returns a loopback port that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// waitListening waits until the app accepts connections on port: its start
// (an interpreter, a framework import) takes seconds on a loaded machine.
func waitListening(t *testing.T, port int, out *lockedBuffer) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(port), time.Second)
		if err == nil {
			_ = c.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the app did not listen on %d within 2 minutes:\n%s", port, out.String())
		}
		select {
		case <-out.exited:
			t.Fatalf("the app ended before it listened on %d:\n%s", port, out.String())
		case <-time.After(50 * time.Millisecond):
		}
	}
}
