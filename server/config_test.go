package server

import (
	"flag"
	"fmt"
	"io"
	"math"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem/jobs"
)

// load parses args (flags, without the program name) over the environment
// read through getenv, over the defaults, as cmd/server does.
func load(args []string, getenv func(string) string) (Config, error) {
	fs := flag.NewFlagSet("idem", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	done := Flags(fs, getenv)
	if err := fs.Parse(args); err != nil {
		return Config{}, fmt.Errorf("parse flags: %w", err)
	}
	if fs.NArg() > 0 {
		return Config{}, fmt.Errorf("unexpected arguments: %s", strings.Join(fs.Args(), " "))
	}
	return done()
}

func envOf(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func TestLoadDefaults(t *testing.T) {
	t.Parallel()
	cfg, err := load(nil, envOf(nil))
	require.NoError(t, err)
	require.Equal(t, DefaultConfig(), cfg)
	require.Equal(t, ":8080", cfg.Addr)
	require.Equal(t, "sqlite:./data/idem.db", cfg.DatabaseURL)
	require.Equal(t, int64(10485760), cfg.MaxBodyBytes)
	require.Equal(t, 20*time.Second, cfg.ShutdownGrace)
	require.Equal(t, 30*time.Second, cfg.Jobs.ReapInterval)
	require.Equal(t, 500, cfg.Jobs.ReapBatchSize)
	require.Equal(t, 15*time.Second, cfg.Jobs.OrphanWatchInterval)
	require.True(t, cfg.DevMode())
	require.Equal(t, "text", cfg.EffectiveLogFormat())
	require.Equal(t, "data", cfg.DataFolder())
	require.NoError(t, cfg.Validate())
}

func TestLoadFlagOverridesEnv(t *testing.T) {
	t.Parallel()
	env := envOf(map[string]string{
		"IDEM_ADDR":             ":9000",
		"IDEM_REAP_INTERVAL":    "1m",
		"IDEM_DB_MAX_CONNS":     "7",
		"IDEM_JWT_ISSUER":       "env-issuer",
		"IDEM_MAX_BODY_BYTES":   "2048",
		"IDEM_LOG_FORMAT":       "text",
		"IDEM_SHUTDOWN_GRACE":   "5s",
		"IDEM_DATABASE_URL":     "postgres://u:p@db/idem",
		"IDEM_JWT_HS256_SECRET": strings.Repeat("s", 32),
	})
	cfg, err := load([]string{"--addr", "127.0.0.1:0", "--reap-interval=2s", "-db-max-conns", "3", "--log-format", "json"}, env)
	require.NoError(t, err)
	// Flags win over the environment.
	require.Equal(t, "127.0.0.1:0", cfg.Addr)
	require.Equal(t, 2*time.Second, cfg.Jobs.ReapInterval)
	require.Equal(t, 3, cfg.DBMaxConns)
	require.Equal(t, "json", cfg.LogFormat)
	// The environment wins over the defaults.
	require.Equal(t, "env-issuer", cfg.JWTIssuer)
	require.Equal(t, int64(2048), cfg.MaxBodyBytes)
	require.Equal(t, 5*time.Second, cfg.ShutdownGrace)
	require.False(t, cfg.DevMode())
	require.Equal(t, "json", cfg.EffectiveLogFormat())
	require.NoError(t, cfg.Validate())
}

func TestLoadParseErrorsNameTheVariable(t *testing.T) {
	t.Parallel()
	_, err := load(nil, envOf(map[string]string{"IDEM_REAP_INTERVAL": "soon", "IDEM_DB_MAX_CONNS": "many"}))
	require.Error(t, err)
	require.Contains(t, err.Error(), `IDEM_REAP_INTERVAL: "soon" is not a duration`)
	require.Contains(t, err.Error(), `IDEM_DB_MAX_CONNS: "many" is not a whole number`)

	_, err = load(nil, envOf(map[string]string{"IDEM_REAP_PAUSE": "NaN"}))
	require.ErrorContains(t, err, `IDEM_REAP_PAUSE: "NaN" is not a number`)

	_, err = load([]string{"--reap-interval", "soon"}, envOf(nil))
	require.ErrorContains(t, err, "reap-interval")

	_, err = load([]string{"stray"}, envOf(nil))
	require.ErrorContains(t, err, "unexpected arguments: stray")
}

func TestValidateMessages(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		change func(*Config)
		want   string
	}{
		{"short secret", func(c *Config) { c.JWTHS256Secret = "short" }, "IDEM_JWT_HS256_SECRET must be at least 32 bytes (got 5)"},
		{"postgres without key", func(c *Config) { c.DatabaseURL = "postgres://idem@localhost/idem" }, "set IDEM_JWT_HS256_SECRET (at least 32 bytes) or IDEM_JWT_JWKS_FILE"},
		{"unknown scheme", func(c *Config) { c.DatabaseURL = "mysql://root:hunter2@db/idem" }, "IDEM_DATABASE_URL must start with postgres://, postgresql:// or sqlite:"},
		{"memory sqlite", func(c *Config) { c.DatabaseURL = "sqlite::memory:" }, "in-memory SQLite database is not supported"},
		{"empty sqlite path", func(c *Config) { c.DatabaseURL = "sqlite:" }, "sqlite: needs a file path"},
		{"empty addr", func(c *Config) { c.Addr = "" }, "IDEM_ADDR must not be empty"},
		{"issuer", func(c *Config) { c.JWTIssuer = "" }, "IDEM_JWT_ISSUER must not be empty"},
		{"audience", func(c *Config) { c.JWTAudience = "" }, "IDEM_JWT_AUDIENCE must not be empty"},
		{"body", func(c *Config) { c.MaxBodyBytes = 0 }, "IDEM_MAX_BODY_BYTES must be between 1 and 1073741824 (got 0)"},
		// 4 × a body limit this large overflowed: the in-flight budget
		// check passed, a Content-Length of 3<<61 was charged a negative
		// amount, and every later body, however large, was read.
		{"huge body", func(c *Config) { c.MaxBodyBytes = math.MaxInt64; c.MaxInflightBytes = math.MaxInt64 }, "IDEM_MAX_BODY_BYTES must be between 1 and 1073741824 (got 9223372036854775807)"},
		{"inflight", func(c *Config) { c.MaxInflightBytes = 4*c.MaxBodyBytes - 1 }, "IDEM_MAX_INFLIGHT_BYTES must be at least 4 × IDEM_MAX_BODY_BYTES"},
		{"log format", func(c *Config) { c.LogFormat = "xml" }, `IDEM_LOG_FORMAT must be json or text (got "xml")`},
		{"log level", func(c *Config) { c.LogLevel = "loud" }, `IDEM_LOG_LEVEL must be debug, info, warn or error (got "loud")`},
		{"grace", func(c *Config) { c.ShutdownGrace = 0 }, "IDEM_SHUTDOWN_GRACE must be a positive duration"},
		{"reap interval", func(c *Config) { c.Jobs.ReapInterval = -time.Second }, "IDEM_REAP_INTERVAL must be a positive duration"},
		{"orphan watch", func(c *Config) { c.Jobs.OrphanWatchInterval = 0 }, "IDEM_ORPHAN_WATCH_INTERVAL must be a positive duration"},
		{"read header", func(c *Config) { c.ReadHeaderTimeout = 0 }, "IDEM_READ_HEADER_TIMEOUT must be a positive duration"},
		{"write timeout", func(c *Config) { c.WriteTimeout = 0 }, "IDEM_WRITE_TIMEOUT must be a positive duration"},
		{"connect timeout", func(c *Config) { c.DBConnectTimeout = 0 }, "IDEM_DB_CONNECT_TIMEOUT must be a positive duration"},
		{"store timeout", func(c *Config) { c.StoreTimeout = 0 }, "IDEM_STORE_TIMEOUT must be a positive duration"},
		{"store timeout past write timeout", func(c *Config) { c.StoreTimeout = 30 * time.Second }, "IDEM_STORE_TIMEOUT (30s) must be shorter than IDEM_WRITE_TIMEOUT (30s)"},
		{"max conns", func(c *Config) { c.DBMaxConns = 0 }, "IDEM_DB_MAX_CONNS must be between 1 and 1000 (got 0)"},
		{"max waiters", func(c *Config) { c.MaxWaiters = -1 }, "IDEM_MAX_WAITERS must be between 0 and 1000000 (got -1)"},
		{"batch", func(c *Config) { c.Jobs.ReapBatchSize = 0 }, "IDEM_REAP_BATCH_SIZE must be between 1 and 100000 (got 0)"},
		{"reap pause", func(c *Config) { c.Jobs.ReapPause = -1 }, "IDEM_REAP_PAUSE must be between 0 and 100 (got -1)"},
		{"tenant share zero", func(c *Config) { c.DBTenantShare = 0 }, "IDEM_DB_TENANT_SHARE must be above 0 and at most 1 (got 0)"},
		{"inflight share zero", func(c *Config) { c.InflightShare = 0 }, "IDEM_INFLIGHT_SHARE must be above 0 and at most 1 (got 0)"},
		{"inflight share above the budget", func(c *Config) { c.InflightShare = 1.5 }, "IDEM_INFLIGHT_SHARE must be above 0 and at most 1 (got 1.5)"},
		{"negative body rate", func(c *Config) { c.MinBodyRate = -1 }, "IDEM_MIN_BODY_RATE must not be negative (got -1)"},
		{"tenant share above the pool", func(c *Config) { c.DBTenantShare = 1.5 }, "IDEM_DB_TENANT_SHARE must be above 0 and at most 1 (got 1.5)"},
		{"header bytes", func(c *Config) { c.MaxHeaderBytes = 10 }, "IDEM_MAX_HEADER_BYTES must be at least 4096 (got 10)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := DefaultConfig()
			tt.change(&cfg)
			err := cfg.Validate()
			require.Error(t, err)
			require.Contains(t, err.Error(), tt.want)
			require.NotContains(t, err.Error(), "hunter2", "a validation message must not echo a password")
		})
	}
}

// TestMaxWait: every wait stays below IDEM_WRITE_TIMEOUT with room for the
// last store call and the answer; IDEM_MAX_WAITERS is a flag and a variable.
func TestMaxWait(t *testing.T) {
	t.Parallel()
	cfg := DefaultConfig()
	require.Equal(t, 1000, cfg.MaxWaiters)
	require.Equal(t, 24*time.Second, cfg.MaxWait(), "30s write timeout - 5s store timeout - 1s")
	cfg.WriteTimeout, cfg.StoreTimeout = 6*time.Second, 5*time.Second
	require.Equal(t, time.Duration(0), cfg.MaxWait(), "no room: no waiting")
	cfg.WriteTimeout, cfg.StoreTimeout = 10500*time.Millisecond, 2*time.Second
	require.Equal(t, 7*time.Second, cfg.MaxWait(), "whole seconds")

	loaded, err := load([]string{"--max-waiters", "5"}, envOf(map[string]string{"IDEM_MAX_WAITERS": "9"}))
	require.NoError(t, err)
	require.Equal(t, 5, loaded.MaxWaiters)
	loaded, err = load(nil, envOf(map[string]string{"IDEM_MAX_WAITERS": "9"}))
	require.NoError(t, err)
	require.Equal(t, 9, loaded.MaxWaiters)
}

func TestValidateReportsEveryProblem(t *testing.T) {
	t.Parallel()
	cfg := DefaultConfig()
	cfg.JWTHS256Secret = "short"
	cfg.Jobs.ReapBatchSize = -1
	cfg.LogLevel = "loud"
	err := cfg.Validate()
	require.Error(t, err)
	for _, want := range []string{"IDEM_JWT_HS256_SECRET", "IDEM_REAP_BATCH_SIZE", "IDEM_LOG_LEVEL"} {
		require.Contains(t, err.Error(), want)
	}
}

func TestPostgresWithKeyIsValid(t *testing.T) {
	t.Parallel()
	cfg := DefaultConfig()
	cfg.DatabaseURL = "postgresql://idem@localhost/idem"
	cfg.JWTJWKSFile = "/etc/idem/jwks.json"
	require.NoError(t, cfg.Validate())
	require.False(t, cfg.DevMode())
}

func TestRedacted(t *testing.T) {
	t.Parallel()
	cfg := DefaultConfig()
	cfg.JWTHS256Secret = "super-secret-value-0123456789abcdef"
	cfg.DatabaseURL = "postgres://idem:hunter2@db:5432/idem?sslmode=disable&password=alsosecret"
	got := map[string]string{}
	for _, s := range cfg.Redacted() {
		require.True(t, strings.HasPrefix(s.Flag, "--"), s.Flag)
		got[s.Env] = s.Value
	}
	require.Equal(t, "[redacted]", got["IDEM_JWT_HS256_SECRET"])
	require.NotContains(t, got["IDEM_DATABASE_URL"], "hunter2")
	require.NotContains(t, got["IDEM_DATABASE_URL"], "alsosecret")
	require.Contains(t, got["IDEM_DATABASE_URL"], "postgres://idem:xxxxx@db:5432/idem")
	require.Equal(t, ":8080", got["IDEM_ADDR"])
	require.Equal(t, "20s", got["IDEM_SHUTDOWN_GRACE"])
	require.Equal(t, "500", got["IDEM_REAP_BATCH_SIZE"])
	// Every setting is listed once.
	require.Len(t, got, len(settings()))

	cfg.JWTHS256Secret = ""
	for _, s := range cfg.Redacted() {
		if s.Env == "IDEM_JWT_HS256_SECRET" {
			require.Empty(t, s.Value, "an unset secret shows as empty, not as redacted")
		}
	}
}

func TestDataFolder(t *testing.T) {
	t.Parallel()
	cfg := DefaultConfig()
	cfg.DatabaseURL = "sqlite:/var/lib/idem/idem.db"
	require.Equal(t, "/var/lib/idem", cfg.DataFolder())
	require.Equal(t, "/var/lib/idem/idem.db", sqlitePath(t, cfg))
	cfg.DatabaseURL = "sqlite:///var/lib/idem/other.db"
	require.Equal(t, "/var/lib/idem/other.db", sqlitePath(t, cfg))
	cfg.DataDir = "/srv/idem"
	require.Equal(t, "/srv/idem", cfg.DataFolder())
}

func sqlitePath(t *testing.T, cfg Config) string {
	t.Helper()
	db, err := parseDatabase(cfg.DatabaseURL)
	require.NoError(t, err)
	require.True(t, db.is("sqlite"))
	return db.target
}

// TestDatabasePasswordFile: the password comes from the file into the URL
// (trailing newline dropped, special characters escaped), is redacted like
// one written in the URL, and every misuse is a clear error.
func TestDatabasePasswordFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file := filepath.Join(dir, "pw")
	require.NoError(t, os.WriteFile(file, []byte("s3cr@t/pw\n"), 0o600))
	cfg, err := load(nil, envOf(map[string]string{
		"IDEM_DATABASE_URL":           "postgres://idem@db:5432/idem?sslmode=disable",
		"IDEM_DATABASE_PASSWORD_FILE": file,
	}))
	require.NoError(t, err)
	u, err := url.Parse(cfg.DatabaseURL)
	require.NoError(t, err)
	pw, ok := u.User.Password()
	require.True(t, ok)
	require.Equal(t, "s3cr@t/pw", pw)
	require.Equal(t, "idem", u.User.Username())
	require.Equal(t, "db:5432", u.Host)
	for _, st := range cfg.Redacted() {
		require.NotContains(t, st.Value, "s3cr", st.Env)
	}

	empty := filepath.Join(dir, "empty")
	require.NoError(t, os.WriteFile(empty, []byte("\n"), 0o600))
	for _, c := range []struct{ url, file, want string }{
		{"postgres://idem@db/idem", filepath.Join(dir, "missing"), "IDEM_DATABASE_PASSWORD_FILE: open"},
		{"postgres://idem@db/idem", empty, "is empty"},
		{"postgres://idem:other@db/idem", file, "has a password too"},
		{"postgres://idem@db/idem?password=x", file, "has a password too"},
		{"postgres://db/idem", file, "names no user"},
		{"sqlite:./data/idem.db", file, "not a postgres:// URL"},
	} {
		_, err := load(nil, envOf(map[string]string{"IDEM_DATABASE_URL": c.url, "IDEM_DATABASE_PASSWORD_FILE": c.file}))
		require.ErrorContains(t, err, c.want, c.url)
	}
}

// TestReapPause: IDEM_REAP_PAUSE defaults to the jobs' pacing, takes a
// fraction, and 0 turns pacing off (jobs.Config.ReapPause 0, which the
// jobs keep as it is).
func TestReapPause(t *testing.T) {
	t.Parallel()
	paused := func(cfg Config) float64 { return jobs.New(nil, cfg.Jobs, nil, nil).Config().ReapPause }
	cfg, err := load(nil, envOf(nil))
	require.NoError(t, err)
	require.Equal(t, jobs.DefaultReapPause, cfg.Jobs.ReapPause)
	require.Equal(t, jobs.DefaultReapPause, paused(cfg))
	cfg, err = load(nil, envOf(map[string]string{"IDEM_REAP_PAUSE": "0.5"}))
	require.NoError(t, err)
	require.Equal(t, 0.5, paused(cfg))
	cfg, err = load([]string{"--reap-pause", "0"}, envOf(nil))
	require.NoError(t, err)
	require.NoError(t, cfg.Validate())
	require.Zero(t, paused(cfg), "0 must turn pacing off")
}
