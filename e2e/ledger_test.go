package e2e

// The real binary never starts an empty ledger in place of a lost one, and a
// running SQLite server notices that its file was deleted or replaced
// (issue 9, item 3).

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// serveRefuses runs `serve` with env and requires it to exit with code 1 on
// its own (a server that starts instead is killed after 15 s and fails the
// test); it returns what it wrote to stderr.
func serveRefuses(t *testing.T, env map[string]string, args ...string) string {
	t.Helper()
	full := map[string]string{"IDEM_ADDR": "127.0.0.1:0"}
	for k, v := range env {
		full[k] = v
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, append([]string{"serve"}, args...)...)
	cmd.Env = baseEnv(full)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	_ = cmd.Run()
	require.NoError(t, ctx.Err(), "serve started on a missing ledger instead of refusing:\n%s", tail(stderr.String(), 2000))
	require.Equal(t, 1, cmd.ProcessState.ExitCode(), "stderr:\n%s", stderr.String())
	return stderr.String()
}

// claimAndComplete claims key and completes it with body, requiring 201 and 200.
func claimAndComplete(t *testing.T, c *http.Client, url, tok, key, body string) {
	t.Helper()
	res := mustCall(t, c, http.MethodPost, url+"/v1/keys/"+key+"/claim", tok, map[string]any{"operation": "POST /v1/orders"})
	require.Equal(t, http.StatusCreated, res.status, string(res.body))
	rec := decodeRecord(t, res.body)
	res = mustCall(t, c, http.MethodPost, url+"/v1/keys/"+key+"/complete", tok,
		map[string]any{"fencing_token": rec.FencingToken, "response": map[string]any{"status": 201, "body": body}})
	require.Equal(t, http.StatusOK, res.status, string(res.body))
}

// requireReplay requires that claiming key replays body.
func requireReplay(t *testing.T, c *http.Client, url, tok, key, body string) {
	t.Helper()
	res := mustCall(t, c, http.MethodPost, url+"/v1/keys/"+key+"/claim", tok, map[string]any{"operation": "POST /v1/orders"})
	require.Equal(t, http.StatusOK, res.status, "%s ran again: %s", key, res.body)
	rec := decodeRecord(t, res.body)
	require.NotNil(t, rec.Response)
	require.Equal(t, body, rec.Response.Body)
}

// TestMissingLedgerIsNotRecreated: serve refuses to start on a missing
// SQLite file or an empty PostgreSQL schema, before and after a ledger
// existed there, and creates nothing; `migrate` and --create-db create it on
// purpose. Before the fix serve started an empty ledger and the completed
// key ran again (201).
func TestMissingLedgerIsNotRecreated(t *testing.T) {
	t.Parallel()
	for _, backend := range []string{"sqlite", "postgres"} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			env := backendEnv(t, backend, map[string]string{"IDEM_CREATE_DB": ""})
			url := env["IDEM_DATABASE_URL"]
			path := strings.TrimPrefix(url, "sqlite:")
			exists := func() bool {
				if backend == "sqlite" {
					_, err := os.Stat(path)
					return err == nil
				}
				return pgTableExists(t, url, "idempotency_keys")
			}

			// A database that never held a ledger.
			msg := serveRefuses(t, env)
			require.Contains(t, msg, "no idem ledger")
			require.Contains(t, msg, "IDEM_CREATE_DB=1")
			require.False(t, exists(), "serve created the ledger while refusing")
			_, errOut, code := runCLI(t, env, "tenant", "list")
			require.Equal(t, 1, code, "the tenant command must refuse too")
			require.Contains(t, errOut, "no idem ledger")
			require.False(t, exists())

			// Created on purpose, used, then lost.
			mustCLI(t, env, "migrate")
			mustCLI(t, env, "tenant", "create", "acme")
			srv := startServer(t, env)
			c := newClient(true)
			tok := mintToken(t, env, "acme", "keys:write")
			claimAndComplete(t, c, srv.url, tok, "order-1", `{"id":"ord_1"}`)
			code, _ = srv.stop(t, syscall.SIGTERM, 20*time.Second)
			require.Equal(t, 0, code)

			if backend == "sqlite" {
				for _, suffix := range []string{"", "-wal", "-shm"} {
					require.NoError(t, os.RemoveAll(path+suffix))
				}
			} else {
				pgDropLedger(t, url)
			}
			msg = serveRefuses(t, env)
			require.Contains(t, msg, "no idem ledger")
			require.False(t, exists(), "serve re-created the lost ledger")

			// --create-db is the explicit way to start afresh.
			srv = startServer(t, env, "--create-db")
			require.True(t, exists())
			mustCLI(t, env, "tenant", "create", "acme")
			res := mustCall(t, c, http.MethodPost, srv.url+"/v1/keys/order-1/claim", tok, map[string]any{"operation": "POST /v1/orders"})
			require.Equal(t, http.StatusCreated, res.status, "a new ledger, created on purpose: %s", res.body)
		})
	}
}

// TestSQLiteDevModeCreatesItsFile: development mode (no key, sqlite:)
// creates its file: the README's `make run` (bin/idem serve) on a fresh clone.
func TestSQLiteDevModeCreatesItsFile(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "data", "idem.db")
	srv := startServer(t, map[string]string{"IDEM_DATABASE_URL": "sqlite:" + path})
	_, err := os.Stat(path)
	require.NoError(t, err)
	res := mustCall(t, newClient(false), http.MethodGet, srv.url+"/readyz", "", nil)
	require.Equal(t, http.StatusOK, res.status)
}

// TestSQLiteFileDeletedOrReplacedWhileRunning: once the file a server opened
// is deleted or replaced, /readyz answers 503 and every write answers
// 503 store_unavailable with Retry-After, so nothing is written into a file
// that is no longer the ledger; with the file back, writes resume and
// nothing stored before is lost. Before the fix /readyz stayed 200 and the
// writes answered 201/200 into the deleted file.
func TestSQLiteFileDeletedOrReplacedWhileRunning(t *testing.T) {
	t.Parallel()
	env := backendEnv(t, "sqlite", map[string]string{"IDEM_CREATE_DB": ""})
	path := strings.TrimPrefix(env["IDEM_DATABASE_URL"], "sqlite:")
	mustCLI(t, env, "migrate")
	mustCLI(t, env, "tenant", "create", "acme")
	srv := startServer(t, env)
	c := newClient(true)
	tok := mintToken(t, env, "acme", "keys:write")
	claimAndComplete(t, c, srv.url, tok, "order-1", `{"id":"ord_1"}`)
	res := mustCall(t, c, http.MethodPost, srv.url+"/v1/keys/order-2/claim", tok, map[string]any{"operation": "POST /v1/orders"})
	require.Equal(t, http.StatusCreated, res.status, string(res.body))
	inflight := decodeRecord(t, res.body)

	requireDown := func(when string) int {
		t.Helper()
		res := mustCall(t, c, http.MethodGet, srv.url+"/readyz", "", nil)
		require.Equal(t, http.StatusServiceUnavailable, res.status, "/readyz %s: %s", when, res.body)
		writes := []struct {
			path string
			body map[string]any
		}{
			{"/v1/keys/order-3/claim", map[string]any{"operation": "POST /v1/orders"}},
			{"/v1/keys/order-1/claim", map[string]any{"operation": "POST /v1/orders"}},
			{"/v1/keys/order-2/checkpoint", map[string]any{"fencing_token": inflight.FencingToken, "recovery_point": "charged"}},
			{"/v1/keys/order-2/complete", map[string]any{"fencing_token": inflight.FencingToken, "response": map[string]any{"status": 201, "body": "late"}}},
		}
		for _, w := range writes {
			res := mustCall(t, c, http.MethodPost, srv.url+w.path, tok, w.body)
			require.Equal(t, http.StatusServiceUnavailable, res.status, "%s %s: %s", w.path, when, res.body)
			require.Equal(t, "store_unavailable", problemCode(res.body))
			require.NotEmpty(t, res.header.Get("Retry-After"))
		}
		return len(writes) + 1
	}

	// Deleted: keep a second name of the same file to put it back later.
	keep := path + ".keep"
	require.NoError(t, os.Link(path, keep))
	require.NoError(t, os.Remove(path))
	tried := requireDown("after the file was deleted")

	// Replaced by another file (another ledger, a stale copy).
	other := filepath.Join(filepath.Dir(path), "other.db")
	mustCLI(t, map[string]string{"IDEM_DATABASE_URL": "sqlite:" + other}, "migrate")
	require.NoError(t, os.Rename(other, path))
	tried += requireDown("after the file was replaced")

	// The original file back under its name: the server resumes.
	require.NoError(t, os.Rename(keep, path))
	res = mustCall(t, c, http.MethodGet, srv.url+"/readyz", "", nil)
	require.Equal(t, http.StatusOK, res.status, string(res.body))
	requireReplay(t, c, srv.url, tok, "order-1", `{"id":"ord_1"}`)
	res = mustCall(t, c, http.MethodPost, srv.url+"/v1/keys/order-2/complete", tok,
		map[string]any{"fencing_token": inflight.FencingToken, "response": map[string]any{"status": 201, "body": `{"id":"ord_2"}`}})
	require.Equal(t, http.StatusOK, res.status, "the in-flight key kept its token: %s", res.body)
	claimAndComplete(t, c, srv.url, tok, "order-3", `{"id":"ord_3"}`)

	// Nothing was lost across a restart either.
	code, _ := srv.stop(t, syscall.SIGTERM, 20*time.Second)
	require.Equal(t, 0, code)
	srv = startServer(t, env)
	for k, body := range map[string]string{"order-1": `{"id":"ord_1"}`, "order-2": `{"id":"ord_2"}`, "order-3": `{"id":"ord_3"}`} {
		requireReplay(t, c, srv.url, tok, k, body)
	}
	t.Logf("requests during the outage: %d, all 503 store_unavailable; stored before: 2, lost: 0", tried)
}

// pgTableExists reports whether table exists in the schema url selects.
func pgTableExists(t *testing.T, url, table string) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer conn.Close(ctx)
	var ok bool
	require.NoError(t, conn.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", table).Scan(&ok))
	return ok
}

// pgDropLedger drops every idem table of the schema url selects, as a
// database re-created empty would be.
func pgDropLedger(t *testing.T, url string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer conn.Close(ctx)
	// Drop the whole schema and make it again empty: every table, trigger,
	// function and sequence a migration made goes, whatever later
	// migrations add.
	var schema string
	require.NoError(t, conn.QueryRow(ctx, "SELECT current_schema()").Scan(&schema))
	_, err = conn.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE; CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize())
	require.NoError(t, err)
}
