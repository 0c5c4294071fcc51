package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/gateway"
	"github.com/idem-dev/idem/keyevents"
	"github.com/idem-dev/idem/metrics"
	"github.com/idem-dev/idem/retrybudget"
	"github.com/idem-dev/idem/server"
)

// gatewaySetting is one setting of the gateway command: a flag that
// overrides its IDEM_GATEWAY_… environment variable, like every server
// setting.
type gatewaySetting struct {
	flag, env, def, usage string
	value                 *string
}

func runGateway(ctx context.Context, e env, args []string) int {
	fs := flag.NewFlagSet("gateway", flag.ContinueOnError)
	gs := []*gatewaySetting{
		{flag: "listen", env: "IDEM_GATEWAY_LISTEN", def: ":8081", usage: "address the gateway listens on (host:port; port 0 picks a free one)"},
		{flag: "upstream", env: "IDEM_GATEWAY_UPSTREAM", usage: "default upstream URL, e.g. http://localhost:3000 (the \"default\" upstream of the config file)"},
		{flag: "tenant", env: "IDEM_GATEWAY_TENANT", usage: "tenant whose records the gateway writes (create it first: PROG tenant create ID)"},
		{flag: "config", env: "IDEM_GATEWAY_CONFIG", usage: "YAML route configuration file; SIGHUP reloads it"},
		{flag: "metrics-listen", env: "IDEM_GATEWAY_METRICS_LISTEN", usage: "address serving /metrics and /healthz of the gateway (empty: off); the gateway's own port proxies every path"},
	}
	for _, s := range gs {
		s.value = new(string)
		fs.StringVar(s.value, s.flag, s.def, e.expand(s.usage)+" ("+s.env+")")
	}
	usage := settingsUsage(e, fs, `Usage: PROG gateway --upstream URL --tenant ID [--listen ADDR] [--config FILE] [flags]

Runs the idempotency gateway: a reverse proxy that gives any HTTP API
Stripe-style Idempotency-Key semantics by configuration alone. It uses the
same store as 'PROG serve' (IDEM_DATABASE_URL): its records are ordinary
records of the tenant, visible in the API, the dashboard and the metrics
(run 'PROG serve' on the same store for the reaper and the dashboard).
SIGHUP reloads the config file without dropping requests; SIGTERM or SIGINT
stop it gracefully within --shutdown-grace. Of the server settings below
the gateway uses the store (IDEM_DATABASE_URL, IDEM_STORE_TIMEOUT, pool),
log, shutdown, waiting, tenant cache, header, idle and read settings
(IDEM_READ_TIMEOUT bounds reading a protected request's body), and the
in-flight budget of protected request bodies (IDEM_MAX_INFLIGHT_BYTES).`)
	cfg, done, code := loadConfigNoArgs(e, fs, usage, args, gatewaySettings...)
	if done {
		return code
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	for _, s := range gs {
		if v := e.getenv(s.env); v != "" && !given[s.flag] {
			*s.value = v
		}
	}
	listen, upstream, tenant, file, metricsListen := *gs[0].value, *gs[1].value, *gs[2].value, *gs[3].value, *gs[4].value
	var errs []error
	if cfg.StoreTimeout <= 0 {
		errs = append(errs, fmt.Errorf("IDEM_STORE_TIMEOUT must be a positive duration such as 5s (got %s)", cfg.StoreTimeout))
	}
	if listen == "" {
		errs = append(errs, errors.New("IDEM_GATEWAY_LISTEN must not be empty (e.g. :8081)"))
	}
	if err := idem.ValidateTenantID(tenant); err != nil {
		errs = append(errs, fmt.Errorf("IDEM_GATEWAY_TENANT must name a tenant: 1-64 of [a-z0-9_-] (got %q)", tenant))
	}
	if upstream == "" && file == "" {
		errs = append(errs, errors.New("IDEM_GATEWAY_UPSTREAM (or IDEM_GATEWAY_CONFIG with upstreams) must be set"))
	}
	if len(errs) > 0 {
		return invalidConfig(e, errors.Join(errs...), 2)
	}

	logger, closeLog := newLogger(cfg, e)
	defer closeLog()
	store, err := server.OpenStore(ctx, cfg)
	if err != nil {
		logger.Error("start failed", "err", err)
		return 1
	}
	defer store.Close()
	// Requests with Prefer: wait=N wait on the store's key events, at most
	// IDEM_MAX_WAITERS at once; a shutdown answers them 409 at once.
	var waiters *keyevents.Waiters
	if ev := store.KeyEvents(); ev != nil && cfg.MaxWaiters > 0 {
		waiters = keyevents.NewWaiters(ev, cfg.MaxWaiters)
	}
	defer waiters.Close()
	reg := prometheus.NewRegistry() // metrics.New adds the Go and process collectors
	// The gateway keeps its tenant's fleet retry budget itself, as idem
	// serve does for the API (docs/frontdoor.md rule 9), and exports it as
	// idem serve does (idem_attempts_total, idem_retries_refused_total,
	// idem_retry_amplification_ratio).
	retries := retrybudget.New(cfg.RetryBudgetWindow, nil)
	m := metrics.New(reg)
	m.RetryBudget(retries.Snapshot)
	g, err := gateway.New(gateway.Options{
		RetryBudget: retries, Store: store, Metrics: m, Tenant: tenant, Upstream: upstream, ConfigFile: file,
		StoreTimeout: cfg.StoreTimeout, TenantCacheTTL: cfg.TenantCacheTTL, Registerer: reg, Logger: logger,
		Waiters: waiters, BodyReadTimeout: cfg.ReadTimeout, MaxInflightBytes: cfg.MaxInflightBytes, InflightShare: cfg.InflightShare,
	})
	if err != nil {
		logger.Error("start failed", "err", err)
		return 1
	}
	checkCtx, cancel := context.WithTimeout(ctx, cfg.StoreTimeout)
	if t, err := store.GetTenant(checkCtx, idem.GetTenantParams{ID: tenant}); err != nil {
		logger.Warn("the gateway's tenant cannot be read now; protected requests fail closed until it can", "tenant", tenant, "err", err)
	} else if t.Disabled {
		logger.Warn("the gateway's tenant is disabled; protected requests fail closed", "tenant", tenant)
	}
	cancel()

	ln, err := net.Listen("tcp", listen)
	if err != nil {
		logger.Error("start failed", "err", err)
		return 1
	}
	srv := &http.Server{
		Handler:           g,
		ReadHeaderTimeout: cfg.ReadHeaderTimeout,
		IdleTimeout:       cfg.IdleTimeout,
		MaxHeaderBytes:    cfg.MaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
		BaseContext:       func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
	}
	srv.RegisterOnShutdown(waiters.Close)
	serveErr := make(chan error, 2)
	go func() { serveErr <- srv.Serve(ln) }()
	var msrv *http.Server
	if metricsListen != "" {
		mln, err := net.Listen("tcp", metricsListen)
		if err != nil {
			_ = srv.Close()
			logger.Error("start failed", "err", err)
			return 1
		}
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
		msrv = &http.Server{Handler: mux, ReadHeaderTimeout: cfg.ReadHeaderTimeout}
		go func() { serveErr <- msrv.Serve(mln) }()
		logger.Info("gateway metrics listening", "addr", mln.Addr().String())
	}
	logger.Info("listening", "component", "gateway", "addr", ln.Addr().String(), "upstream", upstream, "tenant", tenant, "config", file)

	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	for {
		select {
		case <-hup:
			if err := g.Reload(); err != nil {
				logger.Error("gateway config reload failed; the previous configuration stays", "err", err)
			} else {
				logger.Info("gateway config reloaded", "config", file)
			}
			continue
		case err := <-serveErr:
			logger.Error("gateway stopped", "err", err)
			return 1
		case <-ctx.Done():
		}
		break
	}
	logger.Info("gateway shutting down: no new connections, waiting for in-flight requests", "grace", cfg.ShutdownGrace)
	graceCtx, cancelGrace := context.WithTimeout(context.WithoutCancel(ctx), cfg.ShutdownGrace)
	defer cancelGrace()
	code = 0
	if err := srv.Shutdown(graceCtx); err != nil {
		_ = srv.Close()
		logger.Error("graceful shutdown within IDEM_SHUTDOWN_GRACE failed", "err", err)
		code = 1
	}
	if msrv != nil {
		_ = msrv.Close()
	}
	return code
}
