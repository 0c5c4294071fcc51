// Package server is the wiring of the idem binary: configuration, the store
// chosen by URL scheme, development mode, the HTTP routes (API, metrics,
// OpenAPI spec, docs, dashboard), the background jobs and graceful
// shutdown. cmd/server and the end-to-end tests (package servertest) both
// use it, so tests exercise exactly what production runs.
package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/api"
	"github.com/idem-dev/idem/auth"
	"github.com/idem-dev/idem/jobs"
	"github.com/idem-dev/idem/keyevents"
	"github.com/idem-dev/idem/metrics"
	"github.com/idem-dev/idem/retrybudget"
	"github.com/idem-dev/idem/storemw"
	"github.com/idem-dev/idem/tenants"
	"github.com/idem-dev/idem/web"
	"github.com/idem-dev/idem/webhooks"
)

// ConfigError is New's error for a configuration that Validate refuses;
// cmd/server reports it as a usage error.
type ConfigError struct{ Err error }

// Error implements error.
func (e *ConfigError) Error() string { return "invalid configuration:\n" + e.Err.Error() }

// Unwrap returns Validate's error.
func (e *ConfigError) Unwrap() error { return e.Err }

// Server is one running idem service: store, HTTP handler and background
// jobs. Create it with New, then Run it; Run closes it.
type Server struct {
	cfg      Config
	db       database
	logger   *slog.Logger
	rawStore idem.Driver
	store    idem.Driver
	tenants  *tenants.Service
	registry *prometheus.Registry
	metrics  *metrics.Metrics
	jobs     *jobs.Runner
	// ledger stops key writes when the database went back in time
	// (rollback.go); nil for a store that cannot tell.
	ledger *ledgerGuard
	// durability reports what the database guarantees (durability.go).
	durability *durabilityWatch
	// waiters hold claims that wait for a key in flight; nil when waiting
	// is off.
	waiters *keyevents.Waiters
	handler http.Handler
	dev     *DevInfo
	// webhooks is the store's webhook side; deliverer sends its outbox.
	webhooks  idem.WebhookStore
	deliverer *webhooks.Deliverer
	// completer drives the orphans of tenants with a completer to an
	// outcome (jobs.Completer, issue 24).
	completer *jobs.Completer
	// operator are the operator-only listeners beside the public one:
	// /metrics on cfg.MetricsAddr, /debug/pprof/ on cfg.PprofAddr, each
	// present only when its address is set.
	operator []*operatorListener

	mu        sync.Mutex
	listener  net.Listener
	closeOnce sync.Once
	closeErr  error
}

// operatorListener is a listener for operators only (metrics, profiling),
// on an address of its own so the public address never serves it.
type operatorListener struct {
	setting string // the environment variable of addr, for messages
	serves  string // what it serves, for the log line
	addr    string
	handler http.Handler
	ln      net.Listener // bound by Listen; guarded by Server.mu
}

// addOperator adds an operator-only listener serving handler on addr.
func (s *Server) addOperator(setting, serves, addr string, handler http.Handler) {
	s.operator = append(s.operator, &operatorListener{setting: setting, serves: serves, addr: addr, handler: handler})
}

// pprofHandler serves the runtime profiles of net/http/pprof under
// /debug/pprof/ (CPU, heap, goroutines, mutex, block, execution trace), for
// profiling production the way docs/benchmarks.md profiles the benchmarks.
func pprofHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}

// Option is an option of New that is not a setting: a seam for tests,
// which no environment variable or flag reaches.
type Option func(*options)

type options struct {
	wrapDriver func(idem.Driver) idem.Driver
}

// WithDriver has New wrap the driver it opened (migrated, before the store
// middleware and everything else sees it): tests put a fault into one of
// its capabilities — e.g. key-event subscriptions that fail while the
// store works (testkit/listenerdown) — and the server runs as it would on
// a driver that has it.
func WithDriver(wrap func(idem.Driver) idem.Driver) Option {
	return func(o *options) { o.wrapDriver = wrap }
}

// New validates cfg, opens the store (running its migrations), prepares
// development mode when no signing key is configured with SQLite, and
// builds the HTTP handler. It does not listen yet; see Listen and Run.
func New(ctx context.Context, cfg Config, logger *slog.Logger, opts ...Option) (*Server, error) {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	if err := cfg.Validate(); err != nil {
		return nil, &ConfigError{Err: err}
	}
	db, err := parseDatabase(cfg.DatabaseURL) // valid: Validate parsed it
	if err != nil {
		return nil, &ConfigError{Err: err}
	}
	if logger == nil {
		logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	s := &Server{cfg: cfg, db: db, logger: logger}

	authCfg := auth.Config{Issuer: cfg.JWTIssuer, Audience: cfg.JWTAudience}
	if cfg.JWTHS256Secret != "" {
		authCfg.HS256Secret = []byte(cfg.JWTHS256Secret)
	}
	if cfg.JWTJWKSFile != "" {
		b, err := os.ReadFile(cfg.JWTJWKSFile)
		if err != nil {
			return nil, fmt.Errorf("IDEM_JWT_JWKS_FILE: %w", err)
		}
		authCfg.JWKS = b
	}
	var devSecret []byte
	if devMode(cfg, db) {
		secret, err := s.bootstrapDev()
		if err != nil {
			return nil, fmt.Errorf("development mode: %w", err)
		}
		devSecret = secret
		authCfg.HS256Secret = secret
	}
	verifier, err := auth.NewVerifier(authCfg)
	if err != nil {
		return nil, fmt.Errorf("configure token verification: %w", err)
	}

	raw, err := db.open(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if o.wrapDriver != nil {
		raw = o.wrapDriver(raw)
	}
	s.rawStore = raw

	s.registry = prometheus.NewRegistry()
	s.metrics = metrics.New(s.registry)
	s.metrics.LimitTenants(cfg.MetricsMaxTenants)
	metrics.RegisterReadiness(s.registry, raw.Ping)
	s.metrics.RegisterPool(s.registry, raw.PoolStats)
	// The store is wrapped once (storemw.Wrap: metrics, deadline, tenant
	// share, its webhook side alike), and every user of s.store — the
	// API, the tenant service, the background jobs, the deliverer — gets
	// it; the background jobs name no tenant and are not held to a share.
	// Outside it the ledger guard stops key writes when the database went
	// back in time (rollback.go).
	s.store = storemw.Wrap(raw, storemw.Options{Timeout: cfg.StoreTimeout, TenantShare: cfg.DBTenantShare, Metrics: s.metrics})
	if src := raw.Ledger(); src != nil {
		s.ledger = newLedgerGuard(s.store, src, cfg, logger, s.registry)
		s.store = s.ledger
	}
	s.durability = newDurabilityWatch(ctx, raw, cfg, logger, s.registry)
	watchKeyEvents(raw, logger, s.registry)
	s.tenants = tenants.NewService(s.store, cfg.TenantCacheTTL)
	// Claims wait on the raw store's key events; their claims go through
	// s.store, so each one is bounded by IDEM_STORE_TIMEOUT and the wait
	// is not.
	if ev := raw.KeyEvents(); ev != nil && cfg.MaxWaiters > 0 && cfg.MaxWait() > 0 {
		s.waiters = keyevents.NewSharedWaiters(ev, cfg.MaxWaiters)
	}
	s.registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "idem_claim_waiters",
		Help: "Claims this replica holds now, waiting for a key in flight (at most IDEM_MAX_WAITERS).",
	}, func() float64 { return float64(s.waiters.Waiting()) }))

	if devSecret != nil {
		if _, err := s.tenants.Ensure(ctx, DevTenant, "Demo tenant (development mode)"); err != nil {
			_ = raw.Close()
			return nil, fmt.Errorf("development mode: create tenant %s: %w", DevTenant, err)
		}
		info, err := mintDevTokens(cfg, devSecret)
		if err != nil {
			_ = raw.Close()
			return nil, fmt.Errorf("development mode: %w", err)
		}
		s.dev = &info
	}

	ws := s.store.Webhooks()
	if ws == nil {
		_ = raw.Close()
		return nil, fmt.Errorf("store %s keeps no webhook outbox", s.db)
	}
	s.webhooks = ws
	s.jobs = jobs.New(s.store, cfg.Jobs, logger, s.metrics)
	cs := s.store.Completers()
	if cs == nil {
		_ = raw.Close()
		return nil, fmt.Errorf("store %s keeps no completers", s.db)
	}
	// The completer's calls follow the webhooks' target rules; both jobs'
	// store calls are bounded as every other's.
	completer := cfg.Completer
	completer.StoreTimeout, completer.AllowPrivate = cfg.StoreTimeout, cfg.Webhooks.AllowPrivate
	s.completer = jobs.NewCompleter(cs, s.store, completer, logger, s.metrics)
	delivery := cfg.Webhooks
	delivery.StoreTimeout = cfg.StoreTimeout
	s.deliverer = webhooks.New(ws, delivery, logger, s.metrics)

	s.handler = s.routes(verifier)
	return s, nil
}

// routes builds the handler: the API router plus the operational and
// static routes.
func (s *Server) routes(verifier *auth.Verifier) http.Handler {
	mux := api.New(api.Options{
		Store:                s.store,
		Tenants:              s.tenants,
		Verifier:             verifier,
		Logger:               s.logger,
		MaxBodyBytes:         s.cfg.MaxBodyBytes,
		MaxInflightBytes:     s.cfg.MaxInflightBytes,
		InflightShare:        s.cfg.InflightShare,
		MinBodyRate:          minBodyRate(s.cfg.MinBodyRate),
		Waiters:              s.waiters,
		MaxWait:              s.cfg.MaxWait(),
		Observer:             s.metrics,
		Webhooks:             s.webhooks,
		AllowPrivateWebhooks: s.cfg.Webhooks.AllowPrivate,
		RetryBudget:          retrybudget.New(s.cfg.RetryBudgetWindow, nil),
		Completers:           s.store.Completers(),
	})
	metricsHandler := promhttp.HandlerFor(s.registry, promhttp.HandlerOpts{Registry: s.registry})
	if s.cfg.MetricsAddr == "" {
		mux.Get("/metrics", metricsHandler.ServeHTTP)
	} else {
		internal := http.NewServeMux()
		internal.Handle("GET /metrics", metricsHandler)
		s.addOperator("IDEM_METRICS_ADDR", "/metrics", s.cfg.MetricsAddr, internal)
	}
	if s.cfg.PprofAddr != "" {
		s.addOperator("IDEM_PPROF_ADDR", "/debug/pprof/", s.cfg.PprofAddr, pprofHandler())
	}
	mux.Get("/openapi.yaml", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/yaml")
		_, _ = w.Write(idem.OpenAPISpec)
	})
	static := func(prefix string, h http.Handler) {
		mux.Get(prefix, http.RedirectHandler(prefix+"/", http.StatusMovedPermanently).ServeHTTP)
		mux.Handle(prefix+"/*", http.StripPrefix(prefix+"/", h))
	}
	static("/docs", web.DocsHandler())
	static("/dashboard", web.DashboardHandler())
	return mux
}

// Handler returns the server's HTTP handler.
func (s *Server) Handler() http.Handler { return s.handler }

// Store returns the server's store, wrapped (storemw.Wrap).
func (s *Server) Store() idem.Driver { return s.store }

// Tenants returns the server's tenant service.
func (s *Server) Tenants() *tenants.Service { return s.tenants }

// Config returns the configuration the server runs with.
func (s *Server) Config() Config { return s.cfg }

// Dev returns what development mode prepared, or nil outside it.
func (s *Server) Dev() *DevInfo { return s.dev }

// Listen binds cfg.Addr. It is optional: Run listens if it was not called.
// After Listen, Addr returns the bound address (useful with port 0).
func (s *Server) Listen() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.listener != nil {
		return nil
	}
	ln, err := net.Listen("tcp", s.cfg.Addr)
	if err != nil {
		return fmt.Errorf("listen on %s (IDEM_ADDR): %w", s.cfg.Addr, err)
	}
	for i, o := range s.operator {
		oln, err := net.Listen("tcp", o.addr)
		if err != nil {
			_ = ln.Close()
			for _, bound := range s.operator[:i] {
				_ = bound.ln.Close()
				bound.ln = nil
			}
			return fmt.Errorf("listen on %s (%s): %w", o.addr, o.setting, err)
		}
		o.ln = oln
	}
	s.listener = ln
	return nil
}

// MetricsURL returns http://ADDR of the address serving /metrics: the
// metrics listener when IDEM_METRICS_ADDR is set, else the public one.
func (s *Server) MetricsURL() string {
	if s.cfg.MetricsAddr == "" {
		return s.URL()
	}
	return s.operatorURL("IDEM_METRICS_ADDR")
}

// PprofURL returns http://ADDR of the profiling listener, or "" when
// IDEM_PPROF_ADDR is not set.
func (s *Server) PprofURL() string {
	if s.cfg.PprofAddr == "" {
		return ""
	}
	return s.operatorURL("IDEM_PPROF_ADDR")
}

// operatorURL returns http://ADDR of the operator listener configured by
// setting: the bound address once listening, else the configured one.
func (s *Server) operatorURL(setting string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, o := range s.operator {
		if o.setting != setting {
			continue
		}
		if o.ln != nil {
			return "http://" + displayAddr(o.ln.Addr().String())
		}
		return "http://" + displayAddr(o.addr)
	}
	return ""
}

// Addr returns the bound address once listening, or the configured one.
func (s *Server) Addr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.listener != nil {
		return s.listener.Addr().String()
	}
	return s.cfg.Addr
}

// URL returns http://ADDR of the bound address, with an unspecified host
// replaced by localhost.
func (s *Server) URL() string { return "http://" + displayAddr(s.Addr()) }

// Run serves HTTP and runs the background jobs until ctx is done. Then it
// shuts down gracefully: it stops accepting connections, lets in-flight
// requests finish within cfg.ShutdownGrace, stops the jobs and closes the
// store. It returns nil after a clean shutdown.
func (s *Server) Run(ctx context.Context) error {
	if err := s.Listen(); err != nil {
		_ = s.Close()
		return err
	}
	s.mu.Lock()
	ln := s.listener
	type bound struct {
		o  *operatorListener
		ln net.Listener
	}
	var operator []bound
	for _, o := range s.operator {
		operator = append(operator, bound{o, o.ln})
	}
	s.mu.Unlock()

	srv := s.cfg.httpServer(s.handler, s.logger)
	srv.BaseContext = func(net.Listener) context.Context { return context.WithoutCancel(ctx) }
	// Claims held waiting for a key answer their 409 as soon as the
	// shutdown begins, so they never hold it up.
	srv.RegisterOnShutdown(s.waiters.Close)

	jobsCtx, stopJobs := context.WithCancel(context.WithoutCancel(ctx))
	defer stopJobs()
	jobsDone := make(chan error, 4)
	go func() { jobsDone <- s.jobs.Run(jobsCtx) }()
	go func() { jobsDone <- s.deliverer.Run(jobsCtx) }()
	go func() { jobsDone <- s.completer.Run(jobsCtx) }()
	go func() { jobsDone <- s.watchStore(jobsCtx) }()

	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	// The operator listeners have no graceful shutdown to speak of: a
	// scrape is short and repeated, a profile can be taken again; they
	// close when the service has drained.
	var operatorSrvs []*http.Server
	for _, b := range operator {
		osrv := s.cfg.httpServer(b.o.handler, s.logger)
		if b.o.setting == "IDEM_PPROF_ADDR" {
			// A CPU profile or trace answers after its ?seconds=N.
			osrv.WriteTimeout = 0
		}
		operatorSrvs = append(operatorSrvs, osrv)
		go func() { _ = osrv.Serve(b.ln) }()
		s.logger.Info("serving "+b.o.serves, "addr", b.ln.Addr().String(), "setting", b.o.setting)
	}
	s.logger.Info("listening", "addr", ln.Addr().String(), "store", s.db.String(), "dev_mode", s.dev != nil)

	var errs []error
	select {
	case err := <-serveErr:
		errs = append(errs, fmt.Errorf("serve http: %w", err))
	case <-ctx.Done():
		s.logger.Info("shutting down: no new connections, waiting for in-flight requests", "grace", s.cfg.ShutdownGrace)
		graceCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.ShutdownGrace)
		err := srv.Shutdown(graceCtx)
		cancel()
		if err != nil {
			_ = srv.Close()
			errs = append(errs, fmt.Errorf("graceful shutdown within IDEM_SHUTDOWN_GRACE (%s): %w", s.cfg.ShutdownGrace, err))
		}
		if err := <-serveErr; err != nil && !errors.Is(err, http.ErrServerClosed) {
			errs = append(errs, fmt.Errorf("serve http: %w", err))
		}
	}
	for _, osrv := range operatorSrvs {
		_ = osrv.Close()
	}
	stopJobs()
	for range 4 {
		if err := <-jobsDone; err != nil && !errors.Is(err, context.Canceled) {
			errs = append(errs, fmt.Errorf("background jobs: %w", err))
		}
	}
	if err := s.Close(); err != nil {
		errs = append(errs, err)
	}
	if len(errs) == 0 {
		s.logger.Info("stopped cleanly")
	}
	return errors.Join(errs...)
}

// Close closes the listener (if Run never used it) and the store. It is
// safe to call more than once.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		s.waiters.Close()
		s.mu.Lock()
		if s.listener != nil {
			_ = s.listener.Close()
		}
		for _, o := range s.operator {
			if o.ln != nil {
				_ = o.ln.Close()
			}
		}
		s.mu.Unlock()
		if s.rawStore != nil {
			if err := s.rawStore.Close(); err != nil {
				s.closeErr = fmt.Errorf("close store: %w", err)
			}
		}
	})
	return s.closeErr
}

// NewLogger returns the slog logger cfg asks for, writing to w: JSON or
// text (text by default in development mode), at cfg.LogLevel: slog's own
// handlers, which write each line with one Write.
func NewLogger(cfg Config, w io.Writer) *slog.Logger {
	var level slog.Level
	switch strings.ToLower(cfg.LogLevel) {
	case "debug":
		level = slog.LevelDebug
	case "warn":
		level = slog.LevelWarn
	case "error":
		level = slog.LevelError
	default:
		level = slog.LevelInfo
	}
	opts := &slog.HandlerOptions{Level: level}
	if cfg.EffectiveLogFormat() == "text" {
		return slog.New(slog.NewTextHandler(w, opts))
	}
	return slog.New(slog.NewJSONHandler(w, opts))
}

// Waiting returns how many claims this server holds now waiting for a key
// in flight; tests wait on it instead of sleeping.
func (s *Server) Waiting() int { return s.waiters.Waiting() }

// KeyEvents returns the store's notification source (nil when the store
// has none), for a gateway or test that runs beside this server's store.
func (s *Server) KeyEvents() idem.KeyEvents {
	return s.rawStore.KeyEvents()
}

// httpServer returns a server of h hardened by the HTTP settings
// (IDEM_READ_HEADER_TIMEOUT, IDEM_READ_TIMEOUT, IDEM_WRITE_TIMEOUT,
// IDEM_IDLE_TIMEOUT, IDEM_MAX_HEADER_BYTES), its errors logged at warn:
// every listener of serve takes them from here.
func (c Config) httpServer(h http.Handler, logger *slog.Logger) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: c.ReadHeaderTimeout,
		ReadTimeout:       c.ReadTimeout,
		WriteTimeout:      c.WriteTimeout,
		IdleTimeout:       c.IdleTimeout,
		MaxHeaderBytes:    c.MaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
}

// minBodyRate is api.Options.MinBodyRate for IDEM_MIN_BODY_RATE: 0 there
// turns the bound off, which the option spells below zero.
func minBodyRate(rate int64) int64 {
	if rate == 0 {
		return -1
	}
	return rate
}
