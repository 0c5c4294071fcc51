// Package servertest starts the real idem server wiring (package server) on
// 127.0.0.1:0 for end-to-end tests: a real HTTP listener, a real store
// (SQLite in a temporary folder or an isolated PostgreSQL schema), a fixed
// HS256 test secret, and the requested tenants. The server is stopped when
// the test ends.
package servertest

import (
	"context"
	"log/slog"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/auth"
	"github.com/idem-dev/idem/server"
	"github.com/idem-dev/idem/testkit/pgtest"
)

// Secret is the fixed HS256 secret every test server verifies tokens with.
const Secret = "servertest-hs256-secret-0123456789abcdef"

// Backends.
const (
	BackendSQLite   = "sqlite"
	BackendPostgres = "postgres"
)

// Options configure Start.
type Options struct {
	// Backend is BackendSQLite (the default) or BackendPostgres (an isolated
	// schema from pgtest.URL; the test skips when TEST_DATABASE_URL is unset
	// unless IDEM_REQUIRE_POSTGRES=1).
	Backend string
	// DatabaseURL, when set, overrides Backend: e.g. the same pgtest.URL for
	// several servers sharing one database.
	DatabaseURL string
	// Tenants are created with default settings before Start returns.
	Tenants []string
	// ReapInterval, ReapBatchSize and OrphanWatchInterval tune the background
	// jobs; zero values pick short test defaults (200ms, 500, 200ms).
	ReapInterval        time.Duration
	ReapBatchSize       int
	OrphanWatchInterval time.Duration
	// Logger receives the server's logs; nil logs warnings and errors to the
	// test's output.
	Logger *slog.Logger
	// Configure, when set, may change any setting before the server starts.
	Configure func(*server.Config)
	// WrapDriver, when set, wraps the store the server opened
	// (server.WithDriver): a test's fault in one of the driver's
	// capabilities, e.g. testkit/listenerdown.
	WrapDriver func(idem.Driver) idem.Driver
}

// Server is a running test server.
type Server struct {
	srv *server.Server
	cfg server.Config
}

// Start starts the real server wiring on 127.0.0.1:0 and stops it (graceful
// shutdown, jobs stopped, store closed) when the test ends.
func Start(t *testing.T, opts Options) *Server {
	t.Helper()
	cfg := server.DefaultConfig()
	cfg.Addr = "127.0.0.1:0"
	cfg.JWTHS256Secret = Secret
	// Each test starts from a fresh, empty store: creating the ledger is
	// expected here (production refuses to without IDEM_CREATE_DB).
	cfg.CreateDB = true
	cfg.ShutdownGrace = 10 * time.Second
	cfg.Jobs.ReapInterval = orDefault(opts.ReapInterval, 200*time.Millisecond)
	cfg.Jobs.OrphanWatchInterval = orDefault(opts.OrphanWatchInterval, 200*time.Millisecond)
	if opts.ReapBatchSize > 0 {
		cfg.Jobs.ReapBatchSize = opts.ReapBatchSize
	}
	switch {
	case opts.DatabaseURL != "":
		cfg.DatabaseURL = opts.DatabaseURL
	case opts.Backend == "" || opts.Backend == BackendSQLite:
		cfg.DatabaseURL = "sqlite:" + filepath.Join(t.TempDir(), "idem.db")
	case opts.Backend == BackendPostgres:
		cfg.DatabaseURL = pgtest.URL(t)
	default:
		t.Fatalf("servertest: unknown backend %q (want %q or %q)", opts.Backend, BackendSQLite, BackendPostgres)
	}
	if opts.Configure != nil {
		opts.Configure(&cfg)
	}
	logger := opts.Logger
	if logger == nil {
		logger = slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var sopts []server.Option
	if opts.WrapDriver != nil {
		sopts = append(sopts, server.WithDriver(opts.WrapDriver))
	}
	srv, err := server.New(ctx, cfg, logger, sopts...)
	require.NoError(t, err, "servertest: start server")
	if err := srv.Listen(); err != nil {
		_ = srv.Close()
		require.NoError(t, err, "servertest: listen")
	}

	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(runCtx) }()
	t.Cleanup(func() {
		stop()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("servertest: server stopped with an error: %v", err)
			}
		case <-time.After(cfg.ShutdownGrace + 10*time.Second):
			t.Errorf("servertest: server did not stop within %s", cfg.ShutdownGrace+10*time.Second)
		}
	})

	s := &Server{srv: srv, cfg: cfg}
	for _, id := range opts.Tenants {
		s.CreateTenant(t, id, idem.SettingsPatch{})
	}
	return s
}

func orDefault(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

// URL returns the base URL of the server, e.g. http://127.0.0.1:41234.
func (s *Server) URL() string { return s.srv.URL() }

// Addr returns the bound host:port.
func (s *Server) Addr() string { return s.srv.Addr() }

// Store returns the server's store, for assertions on what is stored.
func (s *Server) Store() idem.Driver { return s.srv.Store() }

// Handler returns the server's HTTP handler.
func (s *Server) Handler() http.Handler { return s.srv.Handler() }

// Server returns the underlying server wiring.
func (s *Server) Server() *server.Server { return s.srv }

// Config returns the configuration the server runs with (it contains the
// test secret).
func (s *Server) Config() server.Config { return s.cfg }

// Token returns an HS256 token valid for one hour for tenant with the given
// scopes. An empty tenant gives an operator token (use scope "admin").
func (s *Server) Token(t *testing.T, tenant string, scopes ...string) string {
	t.Helper()
	tok, err := auth.MintHS256([]byte(s.cfg.JWTHS256Secret), auth.MintClaims{
		Issuer:   s.cfg.JWTIssuer,
		Audience: s.cfg.JWTAudience,
		Subject:  "servertest",
		Tenant:   tenant,
		Scopes:   scopes,
		TTL:      time.Hour,
	})
	require.NoError(t, err, "servertest: mint token")
	return tok
}

// CreateTenant creates a tenant named after its id with the given settings
// patch applied to the defaults.
func (s *Server) CreateTenant(t *testing.T, id string, patch idem.SettingsPatch) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := s.srv.Tenants().Create(ctx, id, id, patch)
	require.NoError(t, err, "servertest: create tenant %s", id)
}
