package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/server"
	"github.com/idem-dev/idem/testkit/pgtest"
	"github.com/idem-dev/idem/testkit/servertest"
)

// startServer runs srv until the test ends and returns its base URL.
func startServer(t *testing.T, srv *server.Server) string {
	t.Helper()
	require.NoError(t, srv.Listen())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(30 * time.Second):
			t.Error("server did not stop")
		}
	})
	return srv.URL()
}

func do(t *testing.T, method, url, token, body string) (*http.Response, []byte) {
	t.Helper()
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, r)
	require.NoError(t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, b
}

func devConfig(t *testing.T, dir string) server.Config {
	cfg := server.DefaultConfig()
	cfg.Addr = "127.0.0.1:0"
	cfg.DatabaseURL = "sqlite:" + filepath.Join(dir, "db", "idem.db")
	return cfg
}

func TestDevModeBootstrap(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cfg := devConfig(t, dir)
	require.True(t, cfg.DevMode())

	ctx := context.Background()
	srv, err := server.New(ctx, cfg, nil)
	require.NoError(t, err)
	dev := srv.Dev()
	require.NotNil(t, dev)

	// The secret is created with mode 0600 in the folder of the SQLite file.
	secretPath := filepath.Join(dir, "db", server.DevSecretFile)
	require.Equal(t, secretPath, dev.SecretFile)
	fi, err := os.Stat(secretPath)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	secret, err := os.ReadFile(secretPath)
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(bytes.TrimSpace(secret)), 32)

	// The demo tenant exists.
	tn, err := srv.Store().GetTenant(ctx, idem.GetTenantParams{ID: server.DevTenant})
	require.NoError(t, err)
	require.False(t, tn.Disabled)

	// The banner carries both tokens and a curl line, and goes only where
	// it is asked to.
	base := startServer(t, srv)
	var banner bytes.Buffer
	srv.PrintDevBanner(&banner)
	require.Contains(t, banner.String(), dev.OperatorToken)
	require.Contains(t, banner.String(), dev.DemoToken)
	require.Contains(t, banner.String(), "curl -sS -X POST "+base+"/v1/keys/order-42/claim")

	// The printed tokens work against the running server.
	resp, body := do(t, http.MethodPost, base+"/v1/keys/order-42/claim", dev.DemoToken, `{"operation":"POST /v1/payments","request":{"amount":1000}}`)
	require.Equal(t, http.StatusCreated, resp.StatusCode, string(body))
	resp, body = do(t, http.MethodGet, base+"/v1/admin/tenants", dev.OperatorToken, "")
	require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
	require.Contains(t, string(body), `"demo"`)
	// The demo token is not an operator token.
	resp, _ = do(t, http.MethodGet, base+"/v1/admin/tenants", dev.DemoToken, "")
	require.Equal(t, http.StatusForbidden, resp.StatusCode)
}

func TestDevModeReusesSecret(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cfg := devConfig(t, dir)
	ctx := context.Background()

	first, err := server.New(ctx, cfg, nil)
	require.NoError(t, err)
	token := first.Dev().DemoToken
	require.NoError(t, first.Close())
	secret1, err := os.ReadFile(filepath.Join(dir, "db", server.DevSecretFile))
	require.NoError(t, err)

	second, err := server.New(ctx, cfg, nil)
	require.NoError(t, err)
	secret2, err := os.ReadFile(filepath.Join(dir, "db", server.DevSecretFile))
	require.NoError(t, err)
	require.Equal(t, secret1, secret2, "the secret must be reused, not regenerated")

	// A token printed by the first start still works after a restart.
	base := startServer(t, second)
	resp, body := do(t, http.MethodGet, base+"/v1/tenant", token, "")
	require.Equal(t, http.StatusOK, resp.StatusCode, string(body))

	// SigningSecret (used by `server token`) finds the same secret.
	s, err := server.SigningSecret(cfg)
	require.NoError(t, err)
	require.Equal(t, bytes.TrimSpace(secret1), s)
}

func TestNoDevModeWithConfiguredSecret(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cfg := devConfig(t, dir)
	cfg.JWTHS256Secret = strings.Repeat("k", 32)
	cfg.CreateDB = true
	srv, err := server.New(context.Background(), cfg, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = srv.Close() })
	require.Nil(t, srv.Dev())
	var banner bytes.Buffer
	srv.PrintDevBanner(&banner)
	require.Empty(t, banner.String())
	_, err = os.Stat(filepath.Join(dir, "db", server.DevSecretFile))
	require.ErrorIs(t, err, os.ErrNotExist)
	_, err = srv.Store().GetTenant(context.Background(), idem.GetTenantParams{ID: server.DevTenant})
	require.ErrorIs(t, err, idem.ErrTenantNotFound, "no demo tenant outside development mode")
}

func TestPostgresWithoutKeyRefusesToStart(t *testing.T) {
	t.Parallel()
	cfg := server.DefaultConfig()
	cfg.DatabaseURL = "postgres://idem:idem@127.0.0.1:1/idem"
	_, err := server.New(context.Background(), cfg, nil)
	require.Error(t, err)
	require.Contains(t, err.Error(), "IDEM_JWT_HS256_SECRET")
	require.Contains(t, err.Error(), "IDEM_JWT_JWKS_FILE")
}

func TestProductionLogsCarryNoSecrets(t *testing.T) {
	t.Parallel()
	var logs syncBuffer
	secret := "production-secret-0123456789abcdefgh"
	cfg := devConfig(t, t.TempDir())
	cfg.JWTHS256Secret = secret
	cfg.CreateDB = true
	cfg.LogFormat = "json"
	logger := server.NewLogger(cfg, &logs)
	srv, err := server.New(context.Background(), cfg, logger)
	require.NoError(t, err)
	base := startServer(t, srv)
	resp, _ := do(t, http.MethodGet, base+"/v1/tenant", "not-a-token", "")
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	resp, _ = do(t, http.MethodGet, base+"/healthz", "", "")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	out := logs.String()
	require.NotContains(t, out, secret)
	require.NotContains(t, out, "not-a-token")
	// Production logs are JSON.
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		require.True(t, json.Valid([]byte(line)), "not JSON: %s", line)
	}
}

func TestServertestRoutes(t *testing.T) {
	t.Parallel()
	for _, backend := range []string{servertest.BackendSQLite, servertest.BackendPostgres} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			ts := servertest.Start(t, servertest.Options{Backend: backend, Tenants: []string{"acme"}})
			tok := ts.Token(t, "acme", "keys:write")

			resp, body := do(t, http.MethodPost, ts.URL()+"/v1/keys/k1/claim", tok, `{"fingerprint":"fp"}`)
			require.Equal(t, http.StatusCreated, resp.StatusCode, string(body))
			rec, err := ts.Store().GetRecord(context.Background(), idem.GetRecordParams{TenantID: "acme", Key: "k1"})
			require.NoError(t, err)
			require.Equal(t, idem.StateInFlight, rec.State)

			resp, body = do(t, http.MethodGet, ts.URL()+"/openapi.yaml", "", "")
			require.Equal(t, http.StatusOK, resp.StatusCode)
			require.Equal(t, "application/yaml", resp.Header.Get("Content-Type"))
			require.Equal(t, idem.OpenAPISpec, body)

			resp, body = do(t, http.MethodGet, ts.URL()+"/metrics", "", "")
			require.Equal(t, http.StatusOK, resp.StatusCode)
			require.Contains(t, string(body), "idem_")
			require.Contains(t, string(body), "go_goroutines")

			for _, p := range []string{"/docs/", "/dashboard/", "/healthz", "/readyz"} {
				resp, _ = do(t, http.MethodGet, ts.URL()+p, "", "")
				require.Equal(t, http.StatusOK, resp.StatusCode, p)
			}
			resp, _ = do(t, http.MethodGet, ts.URL()+"/docs", "", "") // redirect followed
			require.Equal(t, http.StatusOK, resp.StatusCode)

			ts.CreateTenant(t, "other", idem.SettingsPatch{})
			resp, body = do(t, http.MethodGet, ts.URL()+"/v1/admin/tenants", ts.Token(t, "", "admin"), "")
			require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
			require.Contains(t, string(body), `"other"`)
		})
	}
}

func TestServersShareOnePostgres(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	a := servertest.Start(t, servertest.Options{DatabaseURL: url, Tenants: []string{"acme"}})
	b := servertest.Start(t, servertest.Options{DatabaseURL: url})
	tok := a.Token(t, "acme", "keys:write")
	resp, body := do(t, http.MethodPost, a.URL()+"/v1/keys/shared/claim", tok, `{"fingerprint":"fp"}`)
	require.Equal(t, http.StatusCreated, resp.StatusCode, string(body))
	resp, body = do(t, http.MethodPost, b.URL()+"/v1/keys/shared/claim", tok, `{"fingerprint":"fp"}`)
	require.Equal(t, http.StatusConflict, resp.StatusCode, string(body))
	require.Contains(t, string(body), "request_in_flight")
}

// syncBuffer is a bytes.Buffer safe for the server's goroutines.
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
