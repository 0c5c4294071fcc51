package web_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem/server"
	"github.com/idem-dev/idem/testkit/servertest"
)

// The page "When a worker dies" shows the Go resume endpoint
// (examples/go/resume): run as shown behind the real server and its
// completer, it completes a worker that died after its charge without a
// second charge, and charges once for one that died before it.
func TestPageResumeEndpointExample(t *testing.T) {
	t.Parallel()
	srv := servertest.Start(t, servertest.Options{Tenants: []string{"docs"}, Configure: func(c *server.Config) {
		c.Webhooks.AllowPrivate = true
		c.Completer.Interval = 100 * time.Millisecond
		c.Completer.Timeout = 5 * time.Second
	}})
	admin := srv.Token(t, "docs", "tenant:admin")
	writer := srv.Token(t, "docs", "keys:write")
	c := &http.Client{Timeout: 10 * time.Second}
	do := func(method, path, tok string, body string) (int, map[string]any) {
		req, err := http.NewRequest(method, srv.URL()+path, strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+tok)
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err := c.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var m map[string]any
		_ = json.Unmarshal(b, &m)
		return resp.StatusCode, m
	}

	// A free loopback port for the endpoint, registered before it starts
	// (it needs the secret the registration answers).
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	status, reg := do("POST", "/v1/completers", admin, `{"url":"http://`+addr+`/idem/resume"}`)
	require.Equal(t, http.StatusCreated, status, "%v", reg)

	// Built, then run: `go run` would leave the program running when the
	// test kills it.
	bin := filepath.Join(t.TempDir(), "resume")
	runLinesOf(t, filepath.Join(runtime.GOROOT(), "bin", "go"), "build", "-o", bin, "./"+examplesDir+"/go/resume")
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	cmd := exec.CommandContext(ctx, bin)
	cmd.Env = append(os.Environ(), "IDEM_URL="+srv.URL(), "IDEM_TOKEN="+writer,
		"IDEM_COMPLETER_SECRET="+reg["secret"].(string), "IDEM_LISTEN="+addr)
	cmd.Cancel = func() error { return cmd.Process.Kill() }
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { cancel(); _ = cmd.Wait() })
	var mu sync.Mutex
	var lines []string
	listening := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			mu.Lock()
			lines = append(lines, sc.Text())
			mu.Unlock()
			if strings.HasPrefix(sc.Text(), "listening ") {
				close(listening)
			}
		}
	}()
	select {
	case <-listening:
	case <-time.After(2 * time.Minute):
		t.Fatal("the example did not start")
	}

	// Two workers die: one after its charge and checkpoint, one before.
	for _, key := range []string{"after-charge", "before-charge"} {
		status, rec := do("POST", "/v1/keys/"+key+"/claim", writer, `{"operation":"POST /orders/confirm","fingerprint":"fp","lease_seconds":1}`)
		require.Equal(t, http.StatusCreated, status, "%v", rec)
		if key == "after-charge" {
			status, rec = do("POST", "/v1/keys/"+key+"/checkpoint", writer,
				`{"fencing_token":`+jsonNumber(rec["fencing_token"])+`,"recovery_point":"charged","data":{"charge_id":"ch_1"},"lease_seconds":1}`)
			require.Equal(t, http.StatusOK, status, "%v", rec)
		}
	}
	for _, key := range []string{"after-charge", "before-charge"} {
		require.Eventually(t, func() bool {
			_, rec := do("GET", "/v1/keys/"+key, writer, "")
			return rec["state"] == "completed"
		}, 30*time.Second, 50*time.Millisecond, "%s is resumed and completed", key)
		_, rec := do("GET", "/v1/keys/"+key, writer, "")
		require.Contains(t, rec["response"].(map[string]any)["body"], `"status":"confirmed"`)
	}
	mu.Lock()
	defer mu.Unlock()
	charges := 0
	for _, l := range lines {
		if strings.HasPrefix(l, "charged ") {
			charges++
			require.Equal(t, "charged before-charge", l, "the worker that charged is not charged again")
		}
	}
	require.Equal(t, 1, charges, "output: %v", lines)
}

// jsonNumber prints a JSON number decoded into any.
func jsonNumber(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
