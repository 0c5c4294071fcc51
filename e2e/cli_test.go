package e2e

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestCLITenantAndToken(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	env := map[string]string{
		"IDEM_DATABASE_URL":     "sqlite:" + filepath.Join(dir, "idem.db"),
		"IDEM_JWT_HS256_SECRET": testSecret,
	}
	mustCLI(t, env, "migrate")

	// tenant create prints the tenant with its settings.
	out := mustCLI(t, env, "tenant", "create", "acme", "--name", "Acme Inc", "--replay-window-seconds", "600", "--reaper-threshold-seconds", "3600")
	var created struct {
		ID       string         `json:"id"`
		Name     string         `json:"name"`
		Disabled bool           `json:"disabled"`
		Settings map[string]int `json:"settings"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &created), out)
	require.Equal(t, "acme", created.ID)
	require.Equal(t, "Acme Inc", created.Name)
	require.Equal(t, 600, created.Settings["replay_window_seconds"])
	require.Equal(t, 30, created.Settings["lease_seconds_default"], "unset settings take the defaults")
	mustCLI(t, env, "tenant", "create", "--name", "Beta", "beta")

	// Creating it again and invalid settings fail with clear messages.
	_, errOut, code := runCLI(t, env, "tenant", "create", "acme")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "tenant 'acme' already exists (tenant_exists)", "the API's words")
	require.NotContains(t, errOut, "UNIQUE", "never the raw SQL error")
	_, errOut, code = runCLI(t, env, "tenant", "create", "gamma", "--lease-seconds-max", "0")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "lease_seconds_max")
	_, errOut, code = runCLI(t, env, "tenant", "create", "Bad Id!")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "invalid_request")
	_, _, code = runCLI(t, env, "tenant", "create")
	require.Equal(t, 2, code)

	// tenant list: a table and JSON.
	out = mustCLI(t, env, "tenant", "list")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 3, out)
	require.True(t, strings.HasPrefix(lines[0], "ID"))
	require.Contains(t, lines[1], "acme")
	require.Contains(t, lines[1], "Acme Inc")
	require.Contains(t, lines[2], "beta")
	out = mustCLI(t, env, "tenant", "list", "--json")
	var list []struct {
		ID string `json:"id"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &list))
	require.Len(t, list, 2)

	// tenant set changes only what is given.
	out = mustCLI(t, env, "tenant", "set", "acme", "--lease-seconds-default", "10")
	require.NoError(t, json.Unmarshal([]byte(out), &created), out)
	require.Equal(t, 10, created.Settings["lease_seconds_default"])
	require.Equal(t, 600, created.Settings["replay_window_seconds"])
	require.Equal(t, "Acme Inc", created.Name)
	_, errOut, code = runCLI(t, env, "tenant", "set", "nobody", "--name", "x")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "tenant_not_found")

	// token mints tokens the server accepts with the same secret.
	srv := startServer(t, env)
	c := newClient(true)
	tok := mintToken(t, env, "acme", "keys:write")
	res := mustCall(t, c, http.MethodPost, srv.url+"/v1/keys/k1/claim", tok, map[string]any{"fingerprint": "fp"})
	require.Equal(t, http.StatusCreated, res.status, string(res.body))
	admin := mintToken(t, env, "", "admin")
	res = mustCall(t, c, http.MethodGet, srv.url+"/v1/admin/tenants/beta", admin, nil)
	require.Equal(t, http.StatusOK, res.status, string(res.body))
	readOnly := mintToken(t, env, "acme", "keys:read")
	res = mustCall(t, c, http.MethodPost, srv.url+"/v1/keys/k2/claim", readOnly, map[string]any{"fingerprint": "fp"})
	require.Equal(t, http.StatusForbidden, res.status, string(res.body))

	// A tenant disabled with the CLI is refused by the server (its cache
	// expires after IDEM_TENANT_CACHE_TTL; beta was never cached).
	mustCLI(t, env, "tenant", "set", "beta", "--disabled=true")
	betaTok := mintToken(t, env, "beta", "keys:write")
	res = mustCall(t, c, http.MethodPost, srv.url+"/v1/keys/k1/claim", betaTok, map[string]any{"fingerprint": "fp"})
	require.Equal(t, http.StatusForbidden, res.status, string(res.body))
	require.Equal(t, "tenant_unknown", problemCode(res.body))

	// tenant delete asks for --yes, then removes the tenant for good.
	_, errOut, code = runCLI(t, env, "tenant", "delete", "beta")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "--yes")
	res = mustCall(t, c, http.MethodGet, srv.url+"/v1/admin/tenants/beta", admin, nil)
	require.Equal(t, http.StatusOK, res.status, "nothing was deleted without --yes: %s", res.body)
	require.Equal(t, "deleted tenant beta and all of its records\n", mustCLI(t, env, "tenant", "delete", "beta", "--yes"))
	res = mustCall(t, c, http.MethodGet, srv.url+"/v1/admin/tenants/beta", admin, nil)
	require.Equal(t, http.StatusNotFound, res.status, string(res.body))
	_, errOut, code = runCLI(t, env, "tenant", "delete", "beta", "--yes")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "tenant_not_found")

	// healthcheck asks the running service.
	hcEnv := map[string]string{"IDEM_ADDR": strings.TrimPrefix(srv.url, "http://")}
	require.Equal(t, "ok\n", mustCLI(t, hcEnv, "healthcheck"))

	// The server never logged the secret or a token.
	code, _ = srv.stop(t, syscall.SIGTERM, 20*time.Second)
	require.Equal(t, 0, code)
	_, _, code = runCLI(t, hcEnv, "healthcheck", "--timeout", "1s")
	require.Equal(t, 1, code, "healthcheck must fail once the service is gone")
	logs := srv.stderr.String()
	require.NotContains(t, logs, testSecret)
	require.NotContains(t, logs, tok)
	require.NotContains(t, logs, admin)
	require.Empty(t, srv.stdout.String(), "production mode prints nothing on stdout")

	// token usage errors.
	_, errOut, code = runCLI(t, env, "token", "--tenant", "acme")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "--scope is required")
	_, errOut, code = runCLI(t, env, "token", "--tenant", "acme", "--scope", "keys:everything")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "unknown scope")
	_, errOut, code = runCLI(t, map[string]string{"IDEM_DATABASE_URL": env["IDEM_DATABASE_URL"], "IDEM_JWT_HS256_SECRET": "short"}, "token", "--tenant", "acme", "--scope", "keys:write")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "IDEM_JWT_HS256_SECRET must be at least 32 bytes")
}

func TestCLIDevModeTokenAndServe(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	env := map[string]string{"IDEM_DATABASE_URL": "sqlite:" + filepath.Join(dir, "data", "idem.db")}

	// `token` never creates a secret: a token signed by a secret no server
	// uses would be rejected. It fails and says where it looked.
	secretFile := filepath.Join(dir, "data", "dev-jwt-secret")
	out, errOut, code := runCLI(t, env, "token", "--tenant", "demo", "--scope", "keys:write")
	require.Equal(t, 1, code)
	require.Empty(t, out)
	require.Contains(t, errOut, "IDEM_JWT_HS256_SECRET is not set")
	require.Contains(t, errOut, "--jwt-hs256-secret")
	require.Contains(t, errOut, secretFile)
	_, err := os.Stat(filepath.Join(dir, "data"))
	require.ErrorIs(t, err, os.ErrNotExist, "token created the data folder")

	srv := startServer(t, env)
	// The server created the secret; `token` now uses it.
	fi, err := os.Stat(secretFile)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	tok := mintToken(t, env, "demo", "keys:write")
	// The banner on stdout carries working tokens and a curl line. It is
	// written before the "listening" log line, but stdout is copied by
	// another goroutine: wait for it.
	require.Eventually(t, func() bool { return strings.Contains(srv.stdout.String(), "Try a claim:") },
		10*time.Second, 10*time.Millisecond, "no banner on stdout")
	banner := srv.stdout.String()
	require.Contains(t, banner, "DEVELOPMENT MODE")
	require.Contains(t, banner, "curl -sS -X POST "+srv.url+"/v1/keys/order-42/claim")
	var demoTok string
	for _, line := range strings.Split(banner, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "export IDEM_TOKEN="); ok {
			demoTok = v
		}
	}
	require.NotEmpty(t, demoTok, banner)
	require.NotContains(t, srv.stderr.String(), demoTok, "tokens go to stdout, never to the log")

	c := newClient(true)
	res := mustCall(t, c, http.MethodPost, srv.url+"/v1/keys/order-42/claim", demoTok, map[string]any{"operation": "POST /v1/payments", "request": map[string]any{"amount": 1000}})
	require.Equal(t, http.StatusCreated, res.status, string(res.body))
	res = mustCall(t, c, http.MethodPost, srv.url+"/v1/keys/order-43/claim", tok, map[string]any{"fingerprint": "fp"})
	require.Equal(t, http.StatusCreated, res.status, string(res.body))
	code, _ = srv.stop(t, syscall.SIGINT, 20*time.Second)
	require.Equal(t, 0, code)
}

func TestCLIConfigRedacts(t *testing.T) {
	t.Parallel()
	env := map[string]string{
		"IDEM_DATABASE_URL":     "postgres://idem:hunter2@db.internal:5432/idem?sslmode=disable",
		"IDEM_JWT_HS256_SECRET": testSecret,
		"IDEM_REAP_INTERVAL":    "45s",
	}
	out := mustCLI(t, env, "config", "--reap-batch-size", "77")
	require.NotContains(t, out, testSecret)
	require.NotContains(t, out, "hunter2")
	require.Contains(t, out, "IDEM_JWT_HS256_SECRET=[redacted]\n")
	require.Contains(t, out, "IDEM_DATABASE_URL=postgres://idem:xxxxx@db.internal:5432/idem?sslmode=disable\n")
	require.Contains(t, out, "IDEM_REAP_INTERVAL=45s\n")
	require.Contains(t, out, "IDEM_REAP_BATCH_SIZE=77\n", "a flag overrides")
	require.Contains(t, out, "IDEM_ADDR=:8080\n")
	require.Contains(t, out, "# mode: production; log format: json")

	// The password from IDEM_DATABASE_PASSWORD_FILE (a compose or
	// Kubernetes secret) joins the URL, redacted like one written in it.
	pwFile := filepath.Join(t.TempDir(), "postgres_password")
	require.NoError(t, os.WriteFile(pwFile, []byte("from-a-secret\n"), 0o600))
	out = mustCLI(t, map[string]string{
		"IDEM_DATABASE_URL": "postgres://idem@db.internal:5432/idem?sslmode=disable", "IDEM_DATABASE_PASSWORD_FILE": pwFile,
		"IDEM_JWT_HS256_SECRET": testSecret,
	}, "config")
	require.Contains(t, out, "IDEM_DATABASE_URL=postgres://idem:xxxxx@db.internal:5432/idem?sslmode=disable\n")
	require.Contains(t, out, "IDEM_DATABASE_PASSWORD_FILE="+pwFile+"\n")
	require.NotContains(t, out, "from-a-secret")

	// Invalid configuration: printed, then the problems, exit 1.
	out, errOut, code := runCLI(t, map[string]string{"IDEM_DATABASE_URL": "postgres://idem:hunter2@db/idem", "IDEM_SHUTDOWN_GRACE": "0s"}, "config")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "set IDEM_JWT_HS256_SECRET (at least 32 bytes) or IDEM_JWT_JWKS_FILE")
	require.Contains(t, errOut, "IDEM_SHUTDOWN_GRACE must be a positive duration")
	require.NotContains(t, out+errOut, "hunter2")

	// serve refuses PostgreSQL without a key, before connecting anywhere.
	_, errOut, code = runCLI(t, map[string]string{"IDEM_DATABASE_URL": "postgres://idem:hunter2@127.0.0.1:1/idem"}, "serve")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "IDEM_JWT_HS256_SECRET")
	require.NotContains(t, errOut, "hunter2")

	// A bad value names its variable.
	_, errOut, code = runCLI(t, map[string]string{"IDEM_REAP_INTERVAL": "often"}, "config")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, `IDEM_REAP_INTERVAL: "often" is not a duration`)
}

func TestCLIHelp(t *testing.T) {
	t.Parallel()
	out := mustCLI(t, nil, "--help")
	for _, c := range []string{"serve", "gateway", "conformance", "migrate", "token", "tenant", "config", "healthcheck"} {
		require.Contains(t, out, "\n  "+c)
	}
	out = mustCLI(t, nil, "serve", "--help")
	require.Contains(t, out, "--shutdown-grace")
	require.Contains(t, out, "IDEM_SHUTDOWN_GRACE")
	require.Contains(t, out, "development mode")
	out = mustCLI(t, nil, "token", "--help")
	require.Contains(t, out, "--tenant")
	require.Contains(t, out, "--jwt-hs256-secret")
	require.Contains(t, out, "--data-dir")
	out = mustCLI(t, nil, "tenant", "--help")
	require.Contains(t, out, "tenant create ID")

	// Each command lists only the settings it uses.
	countFlags := func(help string) int { return strings.Count(help, "\n  --") }
	lists := func(help, flag string) bool {
		return strings.Contains(help, "\n  "+flag+" ") || strings.Contains(help, "\n  "+flag+"\n")
	}
	serveHelp := mustCLI(t, nil, "serve", "--help")
	for _, c := range []struct {
		args          []string
		want, notWant []string
	}{
		{[]string{"token", "--help"}, []string{"--scope", "--ttl", "--jwt-issuer"}, []string{"--addr", "--shutdown-grace", "--reap-interval", "--db-max-conns"}},
		{[]string{"tenant", "create", "--help"}, []string{"--lease-seconds-max", "--name", "--database-url", "--create-db"}, []string{"--addr", "--shutdown-grace", "--jwt-hs256-secret", "--max-header-bytes"}},
		{[]string{"tenant", "list", "--help"}, []string{"--json", "--database-url"}, []string{"--addr", "--lease-seconds-max"}},
		{[]string{"migrate", "--help"}, []string{"--database-url"}, []string{"--addr", "--jwt-issuer"}},
		{[]string{"healthcheck", "--help"}, []string{"--addr", "--timeout"}, []string{"--database-url"}},
		{[]string{"gateway", "--help"}, []string{"--upstream", "--tenant", "--database-url", "--store-timeout", "--max-waiters"}, []string{"--addr", "--reap-interval", "--jwt-issuer", "--max-body-bytes"}},
	} {
		help := mustCLI(t, nil, c.args...)
		for _, w := range c.want {
			require.True(t, lists(help, w), "%v does not list %s:\n%s", c.args, w, help)
		}
		for _, w := range c.notWant {
			require.False(t, lists(help, w), "%v lists %s:\n%s", c.args, w, help)
		}
		if c.args[0] == "gateway" {
			// A server of its own: it shares serve's limits and timeouts,
			// so only its lists above say it shows what it uses.
			continue
		}
		require.Less(t, countFlags(help), countFlags(serveHelp)/2+2, "%v lists too many flags:\n%s", c.args, help)
	}
	// A setting without its flag still comes from the environment.
	_, errOut, code := runCLI(t, map[string]string{"IDEM_ADDR": "127.0.0.1:1"}, "healthcheck", "--timeout", "2s")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "127.0.0.1:1")
	_, errOut, code = runCLI(t, nil, "frobnicate")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, `unknown command "frobnicate"`)
	_, errOut, code = runCLI(t, nil, "serve", "--no-such-flag")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "no-such-flag")
}
