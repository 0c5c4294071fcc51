package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	"github.com/idem-dev/idem/internal/logsink"
	"github.com/idem-dev/idem/server"
)

// gcPercent is the garbage collector's target `serve` sets unless GOGC is
// set (see runServe).
const gcPercent = 400

// Settings flags each command registers (beside its own); the environment
// configures every setting of every command.
var (
	// storeSettings are what opening the store reads.
	storeSettings = []string{"database-url", "database-password-file", "create-db", "db-max-conns", "db-connect-timeout", "store-timeout"}
	// tokenSettings are what minting a token reads: the key, the claims
	// checked by the server and where the development secret lives.
	tokenSettings = []string{"jwt-hs256-secret", "jwt-jwks-file", "jwt-issuer", "jwt-audience", "database-url", "data-dir"}
	// gatewaySettings are what `gateway` reads beside its own flags: the
	// store, logs, shutdown, waiting claims, the tenant cache and the HTTP
	// limits of its listener.
	gatewaySettings = append(slices.Clone(storeSettings), "log-format", "log-level", "shutdown-grace", "max-waiters",
		"tenant-cache-ttl", "read-header-timeout", "read-timeout", "idle-timeout", "max-header-bytes", "max-inflight-bytes", "inflight-share")
	// healthcheckSettings name the local service.
	healthcheckSettings = []string{"addr"}
)

// loadConfig registers the settings flags on fs (all, or only those named), parses args and returns
// the configuration. done reports that the command must end with code.
func loadConfig(e env, fs *flag.FlagSet, usage func(io.Writer), args []string, only ...string) (cfg server.Config, positional []string, done bool, code int) {
	finish := server.Flags(fs, e.getenv, only...)
	positional, done, code = parseFlags(fs, e, usage, args)
	if done {
		return server.Config{}, nil, true, code
	}
	cfg, err := finish()
	if err != nil {
		return server.Config{}, nil, true, invalidConfig(e, err, 2)
	}
	return cfg, positional, false, 0
}

// loadConfigNoArgs is loadConfig for a command that takes no positional
// arguments: one is a usage error.
func loadConfigNoArgs(e env, fs *flag.FlagSet, usage func(io.Writer), args []string, only ...string) (cfg server.Config, done bool, code int) {
	cfg, pos, done, code := loadConfig(e, fs, usage, args, only...)
	if done {
		return cfg, true, code
	}
	if len(pos) > 0 {
		fmt.Fprintf(e.stderr, "%s: unexpected argument %q\n", e.prog, pos[0])
		return server.Config{}, true, 2
	}
	return cfg, false, 0
}

// invalidConfig reports an invalid configuration and returns code.
func invalidConfig(e env, err error, code int) int {
	fmt.Fprintf(e.stderr, "%s: invalid configuration:\n%s\n", e.prog, indent(err.Error()))
	return code
}

func indent(s string) string {
	return "  " + strings.ReplaceAll(s, "\n", "\n  ")
}

func settingsUsage(e env, fs *flag.FlagSet, head string) func(io.Writer) {
	return func(w io.Writer) {
		fmt.Fprintf(w, "%s\n\nSettings (each flag overrides the environment variable in brackets):\n", e.expand(head))
		printFlags(w, fs)
	}
}

func runServe(ctx context.Context, e env, args []string) int {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	usage := settingsUsage(e, fs, `Usage: PROG [serve] [flags]

Runs the idem HTTP service: the /v1 API, /healthz, /readyz, /metrics,
/openapi.yaml, /docs/ and /dashboard/. SIGTERM or SIGINT stop it gracefully:
no new connections, in-flight requests finish within --shutdown-grace, then
the background jobs stop and the database pool closes.

Without IDEM_JWT_HS256_SECRET and IDEM_JWT_JWKS_FILE and with the sqlite:
store, it runs in development mode and prints an operator token, a token for
the "demo" tenant and a curl line to try. With PostgreSQL a key is required.

It applies pending migrations at start but never creates a ledger outside
development mode: on a missing SQLite file or a PostgreSQL schema without
idem's tables it refuses to start (a lost file must not become an empty
ledger where every key runs again). Create one with 'PROG migrate' or
--create-db (IDEM_CREATE_DB=1). A database that does not answer at start is
retried with backoff for up to --db-start-timeout while the service listens
and answers 503 on /readyz and the API; past it it exits 1. A running SQLite server whose file is deleted
or replaced answers 503 on /readyz and on every write until the file is back.`)
	cfg, done, code := loadConfigNoArgs(e, fs, usage, args)
	if done {
		return code
	}
	// The in-flight budget bounds the memory that live requests hold; the
	// soft memory limit makes the garbage collector return their garbage
	// before the heap grows past it, unless the operator set GOMEMLIMIT.
	if e.getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(cfg.MemoryLimit())
	}
	// GC pacing chosen deliberately (unless the operator set GOGC): the live
	// heap of a busy server is small (a few MiB), so the default GOGC=100
	// collects very often; 400 cut the server's CPU per request by about 12 %
	// at a steady RSS of ~37 MiB instead of ~26 MiB (scripts/bench-floor,
	// docs/benchmarks.md). The soft memory limit above still makes the
	// collector work harder before the heap outgrows the in-flight budget.
	if e.getenv("GOGC") == "" {
		debug.SetGCPercent(gcPercent)
	}
	logger, closeLog := newLogger(cfg, e)
	defer closeLog()
	// Start listens at once and waits for a database that does not answer
	// yet (IDEM_DB_START_TIMEOUT), answering 503 meanwhile.
	srv, err := server.Start(ctx, cfg, logger)
	if cfgErr := (*server.ConfigError)(nil); errors.As(err, &cfgErr) {
		closeLog() // its lines before the message written straight to stderr
		return invalidConfig(e, cfgErr.Err, 2)
	}
	if err != nil && errors.Is(err, context.Canceled) && ctx.Err() != nil {
		logger.Info("stopped before the store opened")
		return 0
	}
	if err != nil {
		logger.Error("start failed", "err", err)
		return 1
	}
	if err := srv.Listen(); err != nil {
		_ = srv.Close()
		logger.Error("start failed", "err", err)
		return 1
	}
	srv.PrintDevBanner(e.stdout)
	if err := srv.Run(ctx); err != nil {
		logger.Error("stopped with an error", "err", err)
		return 1
	}
	return 0
}

// newLogger returns the logger of a long-running command (serve, gateway),
// writing to e.stderr through a logsink.Writer so that no request waits on
// the write(2) of its access log line, and the function that flushes and
// closes that writer. The command defers it right away, so every return
// after the logger exists (start-up errors, shutdown on a signal) writes
// every line logged before the process exits; calling it again is harmless.
func newLogger(cfg server.Config, e env) (*slog.Logger, func()) {
	sink := logsink.New(e.stderr, 0)
	return server.NewLogger(cfg, sink), func() { _ = sink.Close() }
}

func runMigrate(ctx context.Context, e env, args []string) int {
	fs := flag.NewFlagSet("migrate", flag.ContinueOnError)
	usage := settingsUsage(e, fs, `Usage: PROG migrate [flags]

Runs the embedded database migrations of the store named by
IDEM_DATABASE_URL and exits, creating the ledger (the SQLite file, the
PostgreSQL tables) when there is none: the explicit first step of a new
installation. The service applies later migrations at start, but never
creates a ledger unless development mode or IDEM_CREATE_DB=1.`)
	cfg, done, code := loadConfigNoArgs(e, fs, usage, args, storeSettings...)
	if done {
		return code
	}
	if err := server.Migrate(ctx, cfg); err != nil {
		return fail(e, "%v", err)
	}
	fmt.Fprintln(e.stdout, "migrations applied")
	return 0
}

func runConfig(_ context.Context, e env, args []string) int {
	fs := flag.NewFlagSet("config", flag.ContinueOnError)
	usage := settingsUsage(e, fs, `Usage: PROG config [flags]

Prints the effective configuration (defaults, then environment, then flags)
with secrets redacted, then checks it. Exits 1 when it is invalid.`)
	cfg, done, code := loadConfigNoArgs(e, fs, usage, args)
	if done {
		return code
	}
	for _, s := range cfg.Redacted() {
		fmt.Fprintf(e.stdout, "%s=%s\n", s.Env, s.Value)
	}
	mode := "production"
	if cfg.DevMode() {
		mode = "development (generated secret in " + cfg.DataFolder() + ")"
	}
	fmt.Fprintf(e.stdout, "# mode: %s; log format: %s\n", mode, cfg.EffectiveLogFormat())
	if err := cfg.Validate(); err != nil {
		return invalidConfig(e, err, 1)
	}
	return 0
}

func runHealthcheck(ctx context.Context, e env, args []string) int {
	fs := flag.NewFlagSet("healthcheck", flag.ContinueOnError)
	timeout := fs.Duration("timeout", 3*time.Second, "how long to wait for the answer")
	usage := settingsUsage(e, fs, `Usage: PROG healthcheck [flags]

Asks the service listening on IDEM_ADDR (on this host) for GET /healthz and
exits 0 when it answers 200, 1 otherwise. Meant for container HEALTHCHECKs
in images without curl.`)
	cfg, done, code := loadConfigNoArgs(e, fs, usage, args, healthcheckSettings...)
	if done {
		return code
	}
	host, port, err := net.SplitHostPort(cfg.Addr)
	if err != nil {
		return fail(e, "IDEM_ADDR %q: %v", cfg.Addr, err)
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+net.JoinHostPort(host, port)+"/healthz", nil)
	if err != nil {
		return fail(e, "healthcheck: %v", err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fail(e, "healthcheck: %v", err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fail(e, "healthcheck: /healthz answered %d", resp.StatusCode)
	}
	fmt.Fprintln(e.stdout, "ok")
	return 0
}
