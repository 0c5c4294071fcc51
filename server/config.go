package server

import (
	"errors"
	"flag"
	"fmt"
	"math"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/idem-dev/idem/api"
	"github.com/idem-dev/idem/auth"
	"github.com/idem-dev/idem/internal/budget"
	"github.com/idem-dev/idem/jobs"
	"github.com/idem-dev/idem/metrics"
	"github.com/idem-dev/idem/retrybudget"
	"github.com/idem-dev/idem/storemw"
	"github.com/idem-dev/idem/webhooks"
)

// Config is the whole configuration of the server. Every setting is both an
// environment variable (IDEM_…) and a flag of cmd/server; a flag overrides
// the environment. Flags fills it, Validate checks it. The settings of the
// background jobs are the configurations of their packages, taken as they
// are (Jobs, Webhooks, Completer).
type Config struct {
	// Addr is the listen address (IDEM_ADDR); "127.0.0.1:0" picks a free
	// port, see Server.Addr.
	Addr string
	// MetricsAddr, when set, is a second listen address that serves
	// /metrics (IDEM_METRICS_ADDR); the public Addr then answers 404 for
	// it, so the metrics need not be reachable where the API is.
	MetricsAddr string
	// PprofAddr, when set, is a listen address of its own that serves the
	// runtime profiles of net/http/pprof under /debug/pprof/
	// (IDEM_PPROF_ADDR). Off by default: profiles expose the program's
	// internals and a CPU profile costs CPU while it runs, so it is for
	// operators only, bound to loopback or a private interface.
	PprofAddr string
	// MetricsMaxTenants is how many tenants get their own tenant-labelled
	// series; the others share tenant="(other)" (IDEM_METRICS_MAX_TENANTS).
	MetricsMaxTenants int
	// DatabaseURL chooses the store by scheme (IDEM_DATABASE_URL):
	// postgres:// or postgresql:// for PostgreSQL, sqlite:PATH for the
	// embedded store.
	DatabaseURL string
	// DatabasePasswordFile names a file holding the database password
	// (IDEM_DATABASE_PASSWORD_FILE), e.g. a Docker or Kubernetes secret
	// mounted at /run/secrets/…, so the password need not be written into
	// IDEM_DATABASE_URL. Flags puts it into DatabaseURL (trailing newlines
	// removed); the URL must then name a user and no password.
	DatabasePasswordFile string
	// CreateDB lets serve (and the tenant and gateway commands) create the
	// ledger when the database holds none: a missing SQLite file, a
	// PostgreSQL schema without idem's tables (IDEM_CREATE_DB). Without it
	// they refuse to start, so a deleted file or an unmounted volume never
	// silently becomes an empty ledger. Development mode and `migrate`
	// create it anyway.
	CreateDB bool
	// JWTHS256Secret is the HS256 signing secret, at least 32 bytes
	// (IDEM_JWT_HS256_SECRET).
	JWTHS256Secret string
	// JWTJWKSFile names a JWKS file of public keys (IDEM_JWT_JWKS_FILE).
	JWTJWKSFile string
	// JWTIssuer and JWTAudience are the expected iss and aud claims.
	JWTIssuer   string
	JWTAudience string
	// MaxBodyBytes is the largest request body accepted.
	MaxBodyBytes int64
	// MaxInflightBytes is the server-wide budget of request body bytes in
	// flight (each body counted api.BodyMemoryFactor times); past it a
	// request is answered 503 server_busy before its body is read, so many
	// large bodies at once cannot run the process out of memory.
	MaxInflightBytes int64
	// InflightShare is the part of that budget each owner of requests — a
	// tenant at the API, a caller (the route's scope, else the client's
	// address) at the gateway — may always hold, and at least the largest
	// request (IDEM_INFLIGHT_SHARE, 0 < share <= 1; budget.ShareOf). Past
	// it an owner's request is admitted only while a whole share stays
	// free for the others, so one tenant's slow bodies or unread answers
	// cannot refuse everyone else; 1 turns it off.
	InflightShare float64
	// MinBodyRate is the slowest a request body above 64 KiB may arrive,
	// in bytes per second (IDEM_MIN_BODY_RATE): its read must end within
	// 5 s plus its Content-Length at this rate, when that is sooner than
	// IDEM_READ_TIMEOUT, so a large body sent one byte at a time gives its
	// reservation back in seconds. 0 leaves the read timeout alone.
	MinBodyRate int64
	// LogFormat is "json" or "text"; "" picks text in development mode and
	// json otherwise.
	LogFormat string
	// LogLevel is debug, info, warn or error.
	LogLevel string
	// ShutdownGrace is how long in-flight requests may take to finish after
	// a shutdown signal.
	ShutdownGrace time.Duration
	// DBMaxConns is the PostgreSQL pool size.
	DBMaxConns int
	// DBTenantShare is the part of the store's connections each tenant's
	// store calls may always have (IDEM_DB_TENANT_SHARE, 0 < share <= 1):
	// the pool's size times it, rounded up, at least one call
	// (storemw.WithTenantShare). Past it a tenant's calls start only while
	// the pool keeps a connection free, else wait for one of its own, so
	// one tenant cannot take every connection; 1 turns it off.
	DBTenantShare float64
	// DBConnectTimeout bounds one attempt to connect to the database at
	// start.
	DBConnectTimeout time.Duration
	// DBStartTimeout bounds how long serve keeps retrying, with backoff, to
	// open a database that does not answer at start (IDEM_DB_START_TIMEOUT):
	// meanwhile it listens and answers 503 store_unavailable, so a replica
	// started during a failover waits instead of exiting; past it it exits
	// non-zero. 0 tries once.
	DBStartTimeout time.Duration
	// LedgerCheckInterval is how often each replica compares the fencing
	// token source with the highest token it has seen issued
	// (IDEM_LEDGER_CHECK_INTERVAL), the check that tells the database went
	// back in time; it also runs before the first claim after the store
	// was unreachable.
	LedgerCheckInterval time.Duration
	// StoreTimeout bounds every store call (IDEM_STORE_TIMEOUT), waiting
	// for a pooled connection included: past it the caller gets 503
	// store_unavailable with Retry-After instead of hanging with the
	// database. It must be shorter than WriteTimeout, so the answer is
	// written before the server gives up on the connection.
	StoreTimeout time.Duration
	// MaxWaiters bounds the claims this replica holds at once while their
	// key is in flight (IDEM_MAX_WAITERS); past it a claim that asked to
	// wait gets the immediate 409. 0 turns waiting off.
	MaxWaiters int
	// Jobs tunes the reaper and the orphan watch (IDEM_REAP_INTERVAL,
	// IDEM_REAP_BATCH_SIZE, IDEM_REAP_PAUSE, IDEM_ORPHAN_WATCH_INTERVAL).
	Jobs jobs.Config
	// TenantCacheTTL is how long tenant settings are cached on the hot
	// path; other replicas see a settings change after at most this long.
	TenantCacheTTL time.Duration
	// RetryBudgetWindow is the sliding window of each tenant's retry
	// budget on this replica (IDEM_RETRY_BUDGET_WINDOW): retries are held
	// to the tenant's retry_budget_percent of the first attempts seen
	// within it. Longer smooths the share over bursts; shorter lets a
	// tenant retry again sooner after a storm.
	RetryBudgetWindow time.Duration
	// HTTP server hardening.
	ReadHeaderTimeout time.Duration
	ReadTimeout       time.Duration
	WriteTimeout      time.Duration
	IdleTimeout       time.Duration
	MaxHeaderBytes    int
	// DataDir holds the development-mode secret; "" means the folder of the
	// SQLite file.
	DataDir string
	// Webhooks tunes webhook delivery (IDEM_WEBHOOK_*): poll interval,
	// per-attempt timeout, full-jitter retry base and cap, how long an
	// event is retried, when a failing endpoint is disabled, and
	// AllowPrivate (IDEM_WEBHOOK_ALLOW_PRIVATE), which also lets tenants
	// register loopback, link-local and private addresses: for tests and
	// closed networks only. Its StoreTimeout is StoreTimeout's.
	Webhooks webhooks.Config
	// Completer tunes the completer (jobs.Completer, IDEM_COMPLETER_*):
	// poll interval, per-call timeout, attempts and total deadline per
	// key, full-jitter backoff base and cap between unknown attempts. Its
	// calls follow the webhooks' target rules (Webhooks.AllowPrivate) and
	// its StoreTimeout is StoreTimeout's: New sets both.
	Completer jobs.CompleterConfig
}

// DefaultConfig returns the configuration with every default of the
// contract applied.
func DefaultConfig() Config {
	return Config{
		Addr:                ":8080",
		MetricsMaxTenants:   metrics.DefaultMaxTenants,
		DatabaseURL:         "sqlite:./data/idem.db",
		JWTIssuer:           "idem",
		JWTAudience:         "idem",
		MaxBodyBytes:        10 << 20,
		MaxInflightBytes:    64 << 20,
		InflightShare:       budget.DefaultShare,
		MinBodyRate:         api.DefaultMinBodyRate,
		LogLevel:            "info",
		ShutdownGrace:       20 * time.Second,
		DBMaxConns:          10,
		DBTenantShare:       storemw.DefaultStoreShare,
		DBConnectTimeout:    10 * time.Second,
		DBStartTimeout:      5 * time.Minute,
		LedgerCheckInterval: time.Second,
		StoreTimeout:        5 * time.Second,
		MaxWaiters:          1000,
		TenantCacheTTL:      5 * time.Second,
		RetryBudgetWindow:   retrybudget.DefaultWindow,
		ReadHeaderTimeout:   5 * time.Second,
		ReadTimeout:         30 * time.Second,
		WriteTimeout:        30 * time.Second,
		IdleTimeout:         120 * time.Second,
		MaxHeaderBytes:      64 << 10,

		Jobs: jobs.Config{
			ReapInterval:        jobs.DefaultReapInterval,
			ReapBatchSize:       jobs.DefaultReapBatchSize,
			ReapPause:           jobs.DefaultReapPause,
			OrphanWatchInterval: jobs.DefaultOrphanWatchInterval,
		},
		Webhooks: webhooks.Config{
			Interval:           webhooks.DefaultInterval,
			Timeout:            webhooks.DefaultTimeout,
			RetryBase:          webhooks.DefaultRetryBase,
			RetryCap:           webhooks.DefaultRetryCap,
			MaxAge:             webhooks.DefaultMaxAge,
			DisableAfter:       webhooks.DefaultDisableAfter,
			DisableMinFailures: webhooks.DefaultDisableMinFailures,
		},
		Completer: jobs.CompleterConfig{
			Interval:    jobs.DefaultCompleterInterval,
			Timeout:     jobs.DefaultCompleterTimeout,
			MaxAttempts: jobs.DefaultCompleterMaxAttempts,
			Deadline:    jobs.DefaultCompleterDeadline,
			BackoffBase: jobs.DefaultCompleterBackoffBase,
			BackoffCap:  jobs.DefaultCompleterBackoffCap,
		},
	}
}

// setting describes one configuration entry: its flag, its environment
// variable, its help text and the field of Config it sets.
type setting struct {
	flag, env, usage string
	secret           bool
	field            field
}

func settings() []setting {
	return []setting{
		{"addr", "IDEM_ADDR", "listen address (host:port; port 0 picks a free one)", false,
			text(func(c *Config) *string { return &c.Addr })},
		{"metrics-addr", "IDEM_METRICS_ADDR", "separate listen address for /metrics (host:port); when set, the public address answers 404 for /metrics (default: /metrics on the public address)", false,
			text(func(c *Config) *string { return &c.MetricsAddr })},
		{"pprof-addr", "IDEM_PPROF_ADDR", "operator-only listen address (host:port, e.g. 127.0.0.1:6060) serving the Go runtime profiles under /debug/pprof/ (empty: off); never the public address", false,
			text(func(c *Config) *string { return &c.PprofAddr })},
		{"metrics-max-tenants", "IDEM_METRICS_MAX_TENANTS", "tenants with their own tenant-labelled metric series; the others share tenant=\"(other)\"", false,
			whole(func(c *Config) *int { return &c.MetricsMaxTenants })},
		{"database-url", "IDEM_DATABASE_URL", "store: postgres://… or postgresql://… for PostgreSQL, sqlite:PATH for the embedded store", true,
			text(func(c *Config) *string { return &c.DatabaseURL })},
		{"database-password-file", "IDEM_DATABASE_PASSWORD_FILE", "file holding the PostgreSQL password (e.g. /run/secrets/postgres_password), put into IDEM_DATABASE_URL, which then names the user and no password", false,
			text(func(c *Config) *string { return &c.DatabasePasswordFile })},
		{"create-db", "IDEM_CREATE_DB", "create the ledger (SQLite file, PostgreSQL tables) when the database holds none; without it serve refuses to start on a missing ledger (development mode and migrate create it anyway)", false,
			boolean(func(c *Config) *bool { return &c.CreateDB })},
		{"jwt-hs256-secret", "IDEM_JWT_HS256_SECRET", "HS256 signing secret, at least 32 bytes (prefer the environment variable over the flag)", true,
			text(func(c *Config) *string { return &c.JWTHS256Secret })},
		{"jwt-jwks-file", "IDEM_JWT_JWKS_FILE", "JWKS file of public keys (EdDSA, ES256, RS256) selected by kid", false,
			text(func(c *Config) *string { return &c.JWTJWKSFile })},
		{"jwt-issuer", "IDEM_JWT_ISSUER", "expected iss claim", false,
			text(func(c *Config) *string { return &c.JWTIssuer })},
		{"jwt-audience", "IDEM_JWT_AUDIENCE", "expected aud claim", false,
			text(func(c *Config) *string { return &c.JWTAudience })},
		{"max-body-bytes", "IDEM_MAX_BODY_BYTES", "largest request body accepted, in bytes (1 to 1073741824)", false,
			whole64(func(c *Config) *int64 { return &c.MaxBodyBytes })},
		{"max-inflight-bytes", "IDEM_MAX_INFLIGHT_BYTES", "budget of request body bytes in flight across all requests, each body counted 4 times its size; past it 503 server_busy with Retry-After", false,
			whole64(func(c *Config) *int64 { return &c.MaxInflightBytes })},
		{"inflight-share", "IDEM_INFLIGHT_SHARE", "part of the in-flight budget each tenant (at the gateway: each caller, the route's scope or else the client address) may always hold, and at least one request of the largest size (0 < share <= 1); past it a request is admitted only while a whole share stays free for the others, else 503 server_busy; 1 turns it off", false,
			number(func(c *Config) *float64 { return &c.InflightShare })},
		{"min-body-rate", "IDEM_MIN_BODY_RATE", "slowest a request body above 64 KiB may arrive at the API, in bytes per second: its read ends within 5s plus its Content-Length at this rate (when sooner than IDEM_READ_TIMEOUT), else 400; 0 leaves only the read timeout", false,
			whole64(func(c *Config) *int64 { return &c.MinBodyRate })},
		{"log-format", "IDEM_LOG_FORMAT", "log format: json or text (default: text in development mode, json otherwise)", false,
			text(func(c *Config) *string { return &c.LogFormat })},
		{"log-level", "IDEM_LOG_LEVEL", "log level: debug, info, warn or error", false,
			text(func(c *Config) *string { return &c.LogLevel })},
		{"shutdown-grace", "IDEM_SHUTDOWN_GRACE", "time in-flight requests get to finish after SIGTERM/SIGINT", false,
			duration(func(c *Config) *time.Duration { return &c.ShutdownGrace })},
		{"max-waiters", "IDEM_MAX_WAITERS", "claims this replica holds at once waiting for a key in flight (wait_seconds, Prefer: wait=N), one tenant at most half of them; past it the immediate 409; 0 turns waiting off", false,
			whole(func(c *Config) *int { return &c.MaxWaiters })},
		{"db-max-conns", "IDEM_DB_MAX_CONNS", "PostgreSQL connection pool size", false,
			whole(func(c *Config) *int { return &c.DBMaxConns })},
		{"db-tenant-share", "IDEM_DB_TENANT_SHARE", "part of the database connections each tenant's store calls may always have (0 < share <= 1; rounded up, at least one); past it they start only while one connection stays free, else wait for one of the tenant's own, up to IDEM_STORE_TIMEOUT; 1 turns it off", false,
			number(func(c *Config) *float64 { return &c.DBTenantShare })},
		{"db-connect-timeout", "IDEM_DB_CONNECT_TIMEOUT", "time allowed to connect to the database at start", false,
			duration(func(c *Config) *time.Duration { return &c.DBConnectTimeout })},
		{"db-start-timeout", "IDEM_DB_START_TIMEOUT", "how long serve keeps retrying (with backoff) to open a database that does not answer at start, listening and answering 503 meanwhile; past it it exits non-zero; 0 tries once", false,
			duration(func(c *Config) *time.Duration { return &c.DBStartTimeout })},
		{"ledger-check-interval", "IDEM_LEDGER_CHECK_INTERVAL", "how often the replica checks that the database did not go back in time (the fencing token source below a token it saw issued); also before the first claim after an outage", false,
			duration(func(c *Config) *time.Duration { return &c.LedgerCheckInterval })},
		{"store-timeout", "IDEM_STORE_TIMEOUT", "longest a store call (database query, connection wait included) may take; past it the request gets 503 store_unavailable", false,
			duration(func(c *Config) *time.Duration { return &c.StoreTimeout })},
		{"reap-interval", "IDEM_REAP_INTERVAL", "how often the reaper deletes records past their purge time", false,
			duration(func(c *Config) *time.Duration { return &c.Jobs.ReapInterval })},
		{"reap-batch-size", "IDEM_REAP_BATCH_SIZE", "most records the reaper deletes per batch", false,
			whole(func(c *Config) *int { return &c.Jobs.ReapBatchSize })},
		{"reap-pause", "IDEM_REAP_PAUSE", "after each full batch the reaper rests this many times as long as the batch took (0: batches back to back)", false,
			number(func(c *Config) *float64 { return &c.Jobs.ReapPause })},
		{"orphan-watch-interval", "IDEM_ORPHAN_WATCH_INTERVAL", "how often orphan counts and ages are refreshed", false,
			duration(func(c *Config) *time.Duration { return &c.Jobs.OrphanWatchInterval })},
		{"tenant-cache-ttl", "IDEM_TENANT_CACHE_TTL", "how long tenant settings are cached on the hot path", false,
			duration(func(c *Config) *time.Duration { return &c.TenantCacheTTL })},
		{"retry-budget-window", "IDEM_RETRY_BUDGET_WINDOW", "sliding window of each tenant's retry budget (retry_budget_percent) on this replica", false,
			duration(func(c *Config) *time.Duration { return &c.RetryBudgetWindow })},
		{"read-header-timeout", "IDEM_READ_HEADER_TIMEOUT", "time allowed to read request headers", false,
			duration(func(c *Config) *time.Duration { return &c.ReadHeaderTimeout })},
		{"read-timeout", "IDEM_READ_TIMEOUT", "time allowed to read a whole request", false,
			duration(func(c *Config) *time.Duration { return &c.ReadTimeout })},
		{"write-timeout", "IDEM_WRITE_TIMEOUT", "time allowed to write a response", false,
			duration(func(c *Config) *time.Duration { return &c.WriteTimeout })},
		{"idle-timeout", "IDEM_IDLE_TIMEOUT", "how long an idle keep-alive connection stays open", false,
			duration(func(c *Config) *time.Duration { return &c.IdleTimeout })},
		{"max-header-bytes", "IDEM_MAX_HEADER_BYTES", "largest request header block accepted, in bytes", false,
			whole(func(c *Config) *int { return &c.MaxHeaderBytes })},
		{"data-dir", "IDEM_DATA_DIR", "folder of the development-mode secret (default: the folder of the SQLite file)", false,
			text(func(c *Config) *string { return &c.DataDir })},
		{"webhook-interval", "IDEM_WEBHOOK_INTERVAL", "how often the webhook outbox is polled when it is empty", false,
			duration(func(c *Config) *time.Duration { return &c.Webhooks.Interval })},
		{"webhook-timeout", "IDEM_WEBHOOK_TIMEOUT", "longest one webhook attempt may take (connect, TLS, request, response)", false,
			duration(func(c *Config) *time.Duration { return &c.Webhooks.Timeout })},
		{"webhook-retry-base", "IDEM_WEBHOOK_RETRY_BASE", "first webhook retry ceiling; it doubles per attempt up to the cap (full jitter)", false,
			duration(func(c *Config) *time.Duration { return &c.Webhooks.RetryBase })},
		{"webhook-retry-cap", "IDEM_WEBHOOK_RETRY_CAP", "largest pause between two attempts of a webhook", false,
			duration(func(c *Config) *time.Duration { return &c.Webhooks.RetryCap })},
		{"webhook-max-age", "IDEM_WEBHOOK_MAX_AGE", "how long after its event a webhook is retried before it is marked failed", false,
			duration(func(c *Config) *time.Duration { return &c.Webhooks.MaxAge })},
		{"webhook-disable-after", "IDEM_WEBHOOK_DISABLE_AFTER", "an endpoint whose every attempt failed for this long (and at least the minimum number of times) is disabled", false,
			duration(func(c *Config) *time.Duration { return &c.Webhooks.DisableAfter })},
		{"webhook-disable-min-failures", "IDEM_WEBHOOK_DISABLE_MIN_FAILURES", "consecutive failed attempts an endpoint needs before it can be disabled", false,
			whole(func(c *Config) *int { return &c.Webhooks.DisableMinFailures })},
		{"webhook-allow-private", "IDEM_WEBHOOK_ALLOW_PRIVATE", "allow webhook endpoints on loopback, link-local and private addresses (tests and closed networks only)", false,
			boolean(func(c *Config) *bool { return &c.Webhooks.AllowPrivate })},
		{"completer-interval", "IDEM_COMPLETER_INTERVAL", "how often the completer looks for orphans to resume when it found none", false,
			duration(func(c *Config) *time.Duration { return &c.Completer.Interval })},
		{"completer-timeout", "IDEM_COMPLETER_TIMEOUT", "longest one call of a resume endpoint may take (connect, TLS, request, answer)", false,
			duration(func(c *Config) *time.Duration { return &c.Completer.Timeout })},
		{"completer-max-attempts", "IDEM_COMPLETER_MAX_ATTEMPTS", "resume attempts per key before it goes to review", false,
			whole(func(c *Config) *int { return &c.Completer.MaxAttempts })},
		{"completer-deadline", "IDEM_COMPLETER_DEADLINE", "how long after its first resume attempt a key goes to review", false,
			duration(func(c *Config) *time.Duration { return &c.Completer.Deadline })},
		{"completer-backoff-base", "IDEM_COMPLETER_BACKOFF_BASE", "first pause ceiling after an unknown resume attempt; it doubles per attempt up to the cap (full jitter)", false,
			duration(func(c *Config) *time.Duration { return &c.Completer.BackoffBase })},
		{"completer-backoff-cap", "IDEM_COMPLETER_BACKOFF_CAP", "largest pause between two resume attempts of a key", false,
			duration(func(c *Config) *time.Duration { return &c.Completer.BackoffCap })},
	}
}

// Flags registers a flag per setting on fs, bound to a Config that starts
// from the defaults: every setting, or only those whose flag names are in
// only, so a command's --help lists just the settings it uses. Call the
// returned function after fs.Parse: it applies the environment (read through
// getenv) to every setting whose flag was not given, registered or not, so a
// flag overrides its environment variable and the environment configures
// every command alike. Help texts show the built-in defaults, never a value
// from the environment. An unknown name in only panics: it is a bug of the
// caller.
func Flags(fs *flag.FlagSet, getenv func(string) string, only ...string) func() (Config, error) {
	cfg := DefaultConfig()
	all := settings()
	want := map[string]bool{}
	for _, name := range only {
		want[name] = true
	}
	for _, s := range all {
		if len(only) > 0 && !want[s.flag] {
			continue
		}
		delete(want, s.flag)
		set := func(v string) error { return s.field.set(&cfg, v) }
		if s.field.isBool {
			fs.BoolFunc(s.flag, s.usage+" ("+s.env+")", set)
		} else {
			fs.Func(s.flag, s.usage+" ("+s.env+")", set)
		}
		// The help shows the built-in default, as a flag bound to the
		// field itself would.
		fs.Lookup(s.flag).DefValue = s.field.get(&cfg)
	}
	for name := range want {
		panic("server.Flags: no setting " + name)
	}
	return func() (Config, error) {
		given := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
		var errs []error
		for _, s := range all {
			if given[s.flag] {
				continue
			}
			v := getenv(s.env)
			if v == "" {
				continue
			}
			if err := s.field.set(&cfg, v); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", s.env, err))
			}
		}
		if err := cfg.applyPasswordFile(); err != nil {
			errs = append(errs, err)
		}
		return cfg, errors.Join(errs...)
	}
}

// applyPasswordFile puts the password of DatabasePasswordFile into
// DatabaseURL. The file's trailing newlines are not part of the password
// (as PostgreSQL's own *_FILE variables read it).
func (c *Config) applyPasswordFile() error {
	if c.DatabasePasswordFile == "" {
		return nil
	}
	b, err := os.ReadFile(c.DatabasePasswordFile)
	if err != nil {
		return fmt.Errorf("IDEM_DATABASE_PASSWORD_FILE: %w", err)
	}
	password := strings.TrimRight(string(b), "\r\n")
	if password == "" {
		return fmt.Errorf("IDEM_DATABASE_PASSWORD_FILE: %s is empty", c.DatabasePasswordFile)
	}
	db, err := parseDatabase(c.DatabaseURL)
	if err != nil {
		return err
	}
	u, err := url.Parse(c.DatabaseURL)
	if !db.is("postgres") || err != nil {
		return errors.New("IDEM_DATABASE_PASSWORD_FILE is set, but IDEM_DATABASE_URL is not a postgres:// URL")
	}
	if u.User == nil || u.User.Username() == "" {
		return errors.New("IDEM_DATABASE_PASSWORD_FILE is set, but IDEM_DATABASE_URL names no user (postgres://USER@host/db)")
	}
	if _, has := u.User.Password(); has || u.Query().Has("password") {
		return errors.New("IDEM_DATABASE_PASSWORD_FILE is set, but IDEM_DATABASE_URL has a password too: keep one")
	}
	u.User = url.UserPassword(u.User.Username(), password)
	c.DatabaseURL = u.String()
	return nil
}

// memoryBase is what the process needs beside the request bodies in
// flight: the Go runtime, the binary, store caches and connections.
const memoryBase = 64 << 20

// waitMargin is kept between the longest wait and IDEM_WRITE_TIMEOUT on
// top of IDEM_STORE_TIMEOUT: room to write the answer.
const waitMargin = time.Second

// MaxWait is the longest any claim is held waiting for a key in flight,
// whatever its tenant allows: IDEM_WRITE_TIMEOUT less IDEM_STORE_TIMEOUT
// (the claim made when the wait ends) and a second to write the answer, so
// a held claim is always answered before the server cuts the connection.
// With the defaults (30s, 5s) it is 24s. Zero means no waiting.
func (c Config) MaxWait() time.Duration {
	return max(c.WriteTimeout-c.StoreTimeout-waitMargin, 0).Truncate(time.Second)
}

// MemoryLimit is the Go runtime's soft memory limit `serve` sets (unless
// GOMEMLIMIT is set): the in-flight budget plus a fixed base. The budget
// bounds what live requests hold; the limit makes the garbage collector
// work harder instead of letting garbage double the heap.
func (c Config) MemoryLimit() int64 { return c.MaxInflightBytes + memoryBase }

// DevMode reports whether the server runs in development mode: no signing
// key is configured and the store is the embedded SQLite.
func (c Config) DevMode() bool {
	db, err := parseDatabase(c.DatabaseURL)
	return err == nil && devMode(c, db)
}

// SQLitePath returns the file path of a sqlite: database URL, or "" for
// another store.
func (c Config) SQLitePath() string {
	if db, err := parseDatabase(c.DatabaseURL); err == nil && db.is("sqlite") {
		return db.target
	}
	return ""
}

// createsLedger reports whether opening the store may create the ledger:
// asked for (IDEM_CREATE_DB) or in development mode.
func (c Config) createsLedger() bool {
	return c.CreateDB || c.DevMode()
}

// devMode is DevMode for an already parsed database URL.
func devMode(c Config, db database) bool {
	return db.is("sqlite") && c.JWTHS256Secret == "" && c.JWTJWKSFile == ""
}

// DataFolder returns the folder of the development-mode secret: DataDir, or
// the folder of the SQLite file, or "./data".
func (c Config) DataFolder() string {
	if c.DataDir != "" {
		return c.DataDir
	}
	if p := c.SQLitePath(); p != "" {
		return filepath.Dir(p)
	}
	return "data"
}

// EffectiveLogFormat returns LogFormat, or its default: text in
// development mode, json otherwise.
func (c Config) EffectiveLogFormat() string {
	if c.LogFormat != "" {
		return c.LogFormat
	}
	if c.DevMode() {
		return "text"
	}
	return "json"
}

// MaxBodyBytesLimit is the largest IDEM_MAX_BODY_BYTES (1 GiB): far above
// any body idem stores, and far enough below the int64 range that the
// in-flight budget's arithmetic (BodyMemoryFactor × a body) cannot overflow.
const MaxBodyBytesLimit = 1 << 30

// Validate checks the configuration and returns every problem found, each
// naming its environment variable.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }

	if c.Addr == "" {
		bad("IDEM_ADDR must not be empty (e.g. :8080)")
	}
	db, err := parseDatabase(c.DatabaseURL)
	if err != nil {
		errs = append(errs, err)
	}
	if c.JWTHS256Secret != "" && len(c.JWTHS256Secret) < auth.MinSecretBytes {
		bad("IDEM_JWT_HS256_SECRET must be at least %d bytes (got %d)", auth.MinSecretBytes, len(c.JWTHS256Secret))
	}
	if db.is("postgres") && c.JWTHS256Secret == "" && c.JWTJWKSFile == "" {
		bad("IDEM_DATABASE_URL is PostgreSQL but no signing key is configured: set IDEM_JWT_HS256_SECRET (at least %d bytes) or IDEM_JWT_JWKS_FILE; development mode with a generated secret is only available with the embedded sqlite: store", auth.MinSecretBytes)
	}
	if c.JWTIssuer == "" {
		bad("IDEM_JWT_ISSUER must not be empty")
	}
	if c.JWTAudience == "" {
		bad("IDEM_JWT_AUDIENCE must not be empty")
	}
	// The bound keeps BodyMemoryFactor × the limit far from overflowing the
	// in-flight budget's arithmetic; the largest body idem stores (two
	// responses of the 8 MiB cap, escaped as JSON) is well below it.
	if c.MaxBodyBytes < 1 || c.MaxBodyBytes > MaxBodyBytesLimit {
		bad("IDEM_MAX_BODY_BYTES must be between 1 and %d (got %d)", MaxBodyBytesLimit, c.MaxBodyBytes)
	}
	if c.MaxBodyBytes >= 1 && c.MaxBodyBytes <= MaxBodyBytesLimit && c.MaxInflightBytes < c.MaxBodyBytes*api.BodyMemoryFactor {
		bad("IDEM_MAX_INFLIGHT_BYTES must be at least %d × IDEM_MAX_BODY_BYTES (%d), or a body of the largest size could never be read (got %d)",
			api.BodyMemoryFactor, c.MaxBodyBytes*api.BodyMemoryFactor, c.MaxInflightBytes)
	}
	switch c.LogFormat {
	case "", "json", "text":
	default:
		bad("IDEM_LOG_FORMAT must be json or text (got %q)", c.LogFormat)
	}
	switch strings.ToLower(c.LogLevel) {
	case "debug", "info", "warn", "error":
	default:
		bad("IDEM_LOG_LEVEL must be debug, info, warn or error (got %q)", c.LogLevel)
	}
	positive := []struct {
		env string
		d   time.Duration
	}{
		{"IDEM_SHUTDOWN_GRACE", c.ShutdownGrace},
		{"IDEM_DB_CONNECT_TIMEOUT", c.DBConnectTimeout},
		{"IDEM_STORE_TIMEOUT", c.StoreTimeout},
		{"IDEM_REAP_INTERVAL", c.Jobs.ReapInterval},
		{"IDEM_ORPHAN_WATCH_INTERVAL", c.Jobs.OrphanWatchInterval},
		{"IDEM_LEDGER_CHECK_INTERVAL", c.LedgerCheckInterval},
		{"IDEM_READ_HEADER_TIMEOUT", c.ReadHeaderTimeout},
		{"IDEM_READ_TIMEOUT", c.ReadTimeout},
		{"IDEM_WRITE_TIMEOUT", c.WriteTimeout},
		{"IDEM_IDLE_TIMEOUT", c.IdleTimeout},
		{"IDEM_WEBHOOK_INTERVAL", c.Webhooks.Interval},
		{"IDEM_WEBHOOK_TIMEOUT", c.Webhooks.Timeout},
		{"IDEM_WEBHOOK_RETRY_BASE", c.Webhooks.RetryBase},
		{"IDEM_WEBHOOK_RETRY_CAP", c.Webhooks.RetryCap},
		{"IDEM_WEBHOOK_MAX_AGE", c.Webhooks.MaxAge},
		{"IDEM_WEBHOOK_DISABLE_AFTER", c.Webhooks.DisableAfter},
		{"IDEM_COMPLETER_INTERVAL", c.Completer.Interval},
		{"IDEM_COMPLETER_TIMEOUT", c.Completer.Timeout},
		{"IDEM_COMPLETER_DEADLINE", c.Completer.Deadline},
		{"IDEM_COMPLETER_BACKOFF_BASE", c.Completer.BackoffBase},
		{"IDEM_COMPLETER_BACKOFF_CAP", c.Completer.BackoffCap},
	}
	for _, p := range positive {
		if p.d <= 0 {
			bad("%s must be a positive duration such as 30s (got %s)", p.env, p.d)
		}
	}
	if c.StoreTimeout > 0 && c.WriteTimeout > 0 && c.StoreTimeout >= c.WriteTimeout {
		bad("IDEM_STORE_TIMEOUT (%s) must be shorter than IDEM_WRITE_TIMEOUT (%s): a request that waits for the store must still get its 503 before the server closes the connection", c.StoreTimeout, c.WriteTimeout)
	}
	if c.DBStartTimeout < 0 {
		bad("IDEM_DB_START_TIMEOUT must not be negative (got %s)", c.DBStartTimeout)
	}
	if c.TenantCacheTTL < 0 {
		bad("IDEM_TENANT_CACHE_TTL must not be negative (got %s)", c.TenantCacheTTL)
	}
	if c.RetryBudgetWindow < time.Second || c.RetryBudgetWindow > time.Hour {
		bad("IDEM_RETRY_BUDGET_WINDOW must be between 1s and 1h (got %s)", c.RetryBudgetWindow)
	}
	if c.Completer.MaxAttempts < 1 || c.Completer.MaxAttempts > 100 {
		bad("IDEM_COMPLETER_MAX_ATTEMPTS must be between 1 and 100 (got %d)", c.Completer.MaxAttempts)
	}
	if c.DBMaxConns < 1 || c.DBMaxConns > 1000 {
		bad("IDEM_DB_MAX_CONNS must be between 1 and 1000 (got %d)", c.DBMaxConns)
	}
	if !(c.InflightShare > 0 && c.InflightShare <= 1) {
		bad("IDEM_INFLIGHT_SHARE must be above 0 and at most 1 (got %g)", c.InflightShare)
	}
	if c.MinBodyRate < 0 {
		bad("IDEM_MIN_BODY_RATE must not be negative (got %d)", c.MinBodyRate)
	}
	if !(c.DBTenantShare > 0 && c.DBTenantShare <= 1) {
		bad("IDEM_DB_TENANT_SHARE must be above 0 and at most 1 (got %g)", c.DBTenantShare)
	}
	if c.MaxWaiters < 0 || c.MaxWaiters > 1000000 {
		bad("IDEM_MAX_WAITERS must be between 0 and 1000000 (got %d)", c.MaxWaiters)
	}
	if c.Jobs.ReapBatchSize < 1 || c.Jobs.ReapBatchSize > 100000 {
		bad("IDEM_REAP_BATCH_SIZE must be between 1 and 100000 (got %d)", c.Jobs.ReapBatchSize)
	}
	if !(c.Jobs.ReapPause >= 0 && c.Jobs.ReapPause <= 100) {
		bad("IDEM_REAP_PAUSE must be between 0 and 100 (got %g)", c.Jobs.ReapPause)
	}
	if c.MetricsMaxTenants < 0 || c.MetricsMaxTenants > 100000 {
		bad("IDEM_METRICS_MAX_TENANTS must be between 0 and 100000 (got %d)", c.MetricsMaxTenants)
	}
	if c.MetricsAddr != "" && c.MetricsAddr == c.Addr && !strings.HasSuffix(c.Addr, ":0") {
		bad("IDEM_METRICS_ADDR must differ from IDEM_ADDR (%s); leave it empty to serve /metrics on the public address", c.Addr)
	}
	if c.Webhooks.DisableMinFailures < 1 {
		bad("IDEM_WEBHOOK_DISABLE_MIN_FAILURES must be at least 1 (got %d)", c.Webhooks.DisableMinFailures)
	}
	if c.Webhooks.RetryCap > 0 && c.Webhooks.RetryBase > c.Webhooks.RetryCap {
		bad("IDEM_WEBHOOK_RETRY_BASE (%s) must not exceed IDEM_WEBHOOK_RETRY_CAP (%s)", c.Webhooks.RetryBase, c.Webhooks.RetryCap)
	}
	if c.PprofAddr != "" && !strings.HasSuffix(c.PprofAddr, ":0") && (c.PprofAddr == c.Addr || c.PprofAddr == c.MetricsAddr) {
		bad("IDEM_PPROF_ADDR must differ from IDEM_ADDR and IDEM_METRICS_ADDR (%s): the profiles are for operators only", c.PprofAddr)
	}
	if c.MaxHeaderBytes < 4096 {
		bad("IDEM_MAX_HEADER_BYTES must be at least 4096 (got %d)", c.MaxHeaderBytes)
	}
	return errors.Join(errs...)
}

// Setting is one line of the effective configuration, as `server config`
// prints it.
type Setting struct {
	Env   string
	Flag  string
	Value string
}

// Redacted returns the effective configuration, one Setting per variable,
// with secrets hidden: the HS256 secret is shown as "[redacted]" and a
// password in the database URL as "xxxxx".
func (c Config) Redacted() []Setting {
	out := make([]Setting, 0, len(settings()))
	for _, s := range settings() {
		v := s.field.get(&c)
		switch {
		case s.env == "IDEM_DATABASE_URL":
			v = redactURL(v)
		case s.secret && v != "":
			v = "[redacted]"
		}
		out = append(out, Setting{Env: s.env, Flag: "--" + s.flag, Value: v})
	}
	return out
}

// redactURL hides the password of a database URL, in the user info and in
// a password query parameter.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		if strings.Contains(raw, "@") || strings.Contains(strings.ToLower(raw), "password") {
			return "[redacted: unparsable URL]"
		}
		return raw
	}
	q := u.Query()
	if q.Has("password") {
		q.Set("password", "xxxxx")
		u.RawQuery = q.Encode()
	}
	return u.Redacted()
}

// field reads and sets one Config field in its text form: the flag's and
// the environment variable's. Its parse errors say what was expected; the
// text is trimmed of spaces first (an environment file's stray blank).
type field struct {
	get    func(*Config) string
	set    func(*Config, string) error
	isBool bool
}

// bind is the field at p, read with parse and written with format.
func bind[T any](p func(*Config) *T, parse func(string) (T, error), format func(T) string) field {
	return field{
		get: func(c *Config) string { return format(*p(c)) },
		set: func(c *Config, s string) error {
			v, err := parse(s)
			if err != nil {
				return err
			}
			*p(c) = v
			return nil
		},
	}
}

func text(p func(*Config) *string) field {
	return bind(p, func(s string) (string, error) { return s, nil }, func(v string) string { return v })
}

func whole(p func(*Config) *int) field {
	return bind(p, func(s string) (int, error) {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil {
			return 0, fmt.Errorf("%q is not a whole number", s)
		}
		return n, nil
	}, strconv.Itoa)
}

func whole64(p func(*Config) *int64) field {
	return bind(p, func(s string) (int64, error) {
		n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%q is not a whole number", s)
		}
		return n, nil
	}, func(v int64) string { return strconv.FormatInt(v, 10) })
}

func number(p func(*Config) *float64) field {
	return bind(p, func(s string) (float64, error) {
		f, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
		if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
			return 0, fmt.Errorf("%q is not a number", s)
		}
		return f, nil
	}, func(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) })
}

func boolean(p func(*Config) *bool) field {
	f := bind(p, func(s string) (bool, error) {
		b, err := strconv.ParseBool(strings.TrimSpace(s))
		if err != nil {
			return false, fmt.Errorf("%q is not true or false (1 or 0)", s)
		}
		return b, nil
	}, strconv.FormatBool)
	f.isBool = true
	return f
}

func duration(p func(*Config) *time.Duration) field {
	return bind(p, func(s string) (time.Duration, error) {
		d, err := time.ParseDuration(strings.TrimSpace(s))
		if err != nil {
			return 0, fmt.Errorf("%q is not a duration such as 30s or 1m30s", s)
		}
		return d, nil
	}, time.Duration.String)
}
