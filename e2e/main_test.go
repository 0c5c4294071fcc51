// Package e2e holds process-level end-to-end tests: they build the real
// server binary once, run it as separate processes on loopback ports, and
// check what a deployment relies on — one winner per key across replicas on
// one PostgreSQL, durability of completed responses across kill -9, graceful
// SIGTERM under load, and the operator subcommands.
package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem/testkit/pgtest"
)

// binary is the path of the server binary built by TestMain.
var binary string //nolint:gochecknoglobals // set once by TestMain, read-only afterwards

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "idem-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e: temp dir:", err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "idem")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	build := exec.CommandContext(ctx, "go", "build", "-o", binary, "github.com/idem-dev/idem/cmd/server")
	build.Stdout, build.Stderr = os.Stdout, os.Stderr
	err = build.Run()
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e: build the server binary:", err)
		_ = os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// testSecret is the HS256 secret the processes under test verify with.
const testSecret = "e2e-hs256-secret-0123456789abcdefghij"

// backendEnv is the environment of a server process on backend: "postgres"
// gets an isolated schema from pgtest.URL, anything else a SQLite file in a
// temporary folder; the test secret is set, creating the ledger is allowed
// (IDEM_CREATE_DB=1: the store is fresh), and extra is added.
func backendEnv(t *testing.T, backend string, extra map[string]string) map[string]string {
	t.Helper()
	env := map[string]string{"IDEM_JWT_HS256_SECRET": testSecret, "IDEM_CREATE_DB": "1"}
	maps.Copy(env, extra)
	if backend == "postgres" {
		env["IDEM_DATABASE_URL"] = pgtest.URL(t)
	} else {
		env["IDEM_DATABASE_URL"] = "sqlite:" + filepath.Join(t.TempDir(), "idem.db")
	}
	return env
}

// baseEnv is the process environment without any IDEM_ variable, plus env.
func baseEnv(env map[string]string) []string {
	var out []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "IDEM_") {
			out = append(out, kv)
		}
	}
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	return out
}

// syncBuffer collects a process's output safely.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// proc is a running server process.
type proc struct {
	cmd    *exec.Cmd
	url    string
	stdout *syncBuffer
	stderr *syncBuffer
	done   chan struct{}
	err    error // exit status, valid after done is closed
}

// startServer starts `idem serve` on 127.0.0.1:0 with env and waits until
// its JSON log says where it listens. The process is killed at cleanup if
// it is still running.
func startServer(t *testing.T, env map[string]string, args ...string) *proc {
	t.Helper()
	return startCommand(t, env, "serve", args...)
}

// startCommand starts a long-running subcommand (serve, gateway) with env
// and waits until its JSON log says where it listens ("listening" with an
// addr, or "waiting for the store" while serve waits for its database).
func startCommand(t *testing.T, env map[string]string, command string, args ...string) *proc {
	t.Helper()
	full := map[string]string{"IDEM_ADDR": "127.0.0.1:0", "IDEM_LOG_FORMAT": "json", "IDEM_LOG_LEVEL": "info"}
	for k, v := range env {
		full[k] = v
	}
	cmd := exec.Command(binary, append([]string{command}, args...)...)
	cmd.Env = baseEnv(full)
	p := &proc{cmd: cmd, stdout: &syncBuffer{}, stderr: &syncBuffer{}, done: make(chan struct{})}
	cmd.Stdout = p.stdout
	pr, pw := io.Pipe()
	cmd.Stderr = pw
	require.NoError(t, cmd.Start())
	// done closes once the process has exited and its last stderr line is
	// in p.stderr: Wait returns when the scanner has read every byte, not
	// when it has copied the last lines it holds.
	scanned := make(chan struct{})
	go func() {
		p.err = cmd.Wait()
		_ = pw.Close()
		<-scanned
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("server %s stderr:\n%s", p.url, tail(p.stderr.String(), 4000))
		}
	})

	addr := make(chan string, 1)
	go func() {
		defer close(scanned)
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		found := false
		for sc.Scan() {
			line := sc.Text()
			_, _ = p.stderr.Write([]byte(line + "\n"))
			if found {
				continue
			}
			var rec struct {
				Msg  string `json:"msg"`
				Addr string `json:"addr"`
			}
			// "waiting for the store": serve listens, answering 503 until
			// its store opens (server.Start).
			if json.Unmarshal([]byte(line), &rec) == nil && (rec.Msg == "listening" || rec.Msg == "waiting for the store") && rec.Addr != "" {
				found = true
				addr <- rec.Addr
			}
		}
		_, _ = io.Copy(io.Discard, pr)
	}()
	select {
	case a := <-addr:
		p.url = "http://" + a
	case <-p.done:
		t.Fatalf("server exited before listening (%v):\n%s", p.err, p.stderr.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("server did not report its address within 30s:\n%s", p.stderr.String())
	}
	return p
}

// stop sends sig and waits (bounded) for the process to exit.
func (p *proc) stop(t *testing.T, sig syscall.Signal, within time.Duration) (exitCode int, took time.Duration) {
	t.Helper()
	start := time.Now()
	require.NoError(t, p.cmd.Process.Signal(sig))
	code := p.wait(t, within)
	return code, time.Since(start)
}

// wait waits (bounded) for the process to exit and returns its exit code
// (-1 when a signal killed it).
func (p *proc) wait(t *testing.T, within time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(within):
		t.Fatalf("server did not exit within %s:\n%s", within, tail(p.stderr.String(), 4000))
	}
	return p.cmd.ProcessState.ExitCode()
}

func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

// runCLI runs the binary with args and env and returns stdout, stderr and
// the exit code.
func runCLI(t *testing.T, env map[string]string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, args...)
	cmd.Env = baseEnv(env)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if err != nil {
		if _, ok := err.(*exec.ExitError); !ok {
			t.Fatalf("run %v: %v", args, err)
		}
	}
	return out.String(), errb.String(), cmd.ProcessState.ExitCode()
}

// mustCLI runs the binary and requires exit code 0.
func mustCLI(t *testing.T, env map[string]string, args ...string) string {
	t.Helper()
	out, errOut, code := runCLI(t, env, args...)
	require.Equal(t, 0, code, "%v failed:\nstdout: %s\nstderr: %s", args, out, errOut)
	return out
}

// mintToken mints a token with the `token` subcommand.
func mintToken(t *testing.T, env map[string]string, tenant, scope string) string {
	t.Helper()
	args := []string{"token", "--scope", scope, "--ttl", "1h"}
	if tenant != "" {
		args = append(args, "--tenant", tenant)
	}
	return strings.TrimSpace(mustCLI(t, env, args...))
}

// client is an HTTP client for the tests; every request is bounded.
func newClient(keepAlive bool) *http.Client {
	tr := &http.Transport{
		MaxIdleConns:        200,
		MaxIdleConnsPerHost: 200,
		DisableKeepAlives:   !keepAlive,
	}
	return &http.Client{Transport: tr, Timeout: 60 * time.Second}
}

// result is one answered HTTP call.
type result struct {
	status int
	header http.Header
	body   []byte
}

// call sends a JSON request and reads the whole answer.
func call(c *http.Client, method, url, token string, body any) (result, error) {
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return result{}, err
		}
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, url, r)
	if err != nil {
		return result{}, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.Do(req)
	if err != nil {
		return result{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return result{status: resp.StatusCode}, fmt.Errorf("read body of a %d answer: %w", resp.StatusCode, err)
	}
	return result{status: resp.StatusCode, header: resp.Header, body: b}, nil
}

func mustCall(t *testing.T, c *http.Client, method, url, token string, body any) result {
	t.Helper()
	res, err := call(c, method, url, token, body)
	require.NoError(t, err, "%s %s", method, url)
	return res
}

// problemCode returns the code of a problem+json body.
func problemCode(b []byte) string {
	var p struct {
		Code string `json:"code"`
	}
	_ = json.Unmarshal(b, &p)
	return p.Code
}

// storedResponse is the response object of the API.
type storedResponse struct {
	Status       int               `json:"status"`
	Headers      map[string]string `json:"headers"`
	Body         string            `json:"body"`
	BodyEncoding string            `json:"body_encoding"`
}

// record is the subset of a key record the tests read.
type record struct {
	Key          string          `json:"key"`
	State        string          `json:"state"`
	FencingToken int64           `json:"fencing_token"`
	Attempt      int             `json:"attempt"`
	Response     *storedResponse `json:"response"`
}

func decodeRecord(t *testing.T, b []byte) record {
	t.Helper()
	var r record
	require.NoError(t, json.Unmarshal(b, &r), string(b))
	return r
}
