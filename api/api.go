// Package api is the HTTP layer of idem: a chi router with JWT
// authentication, one generic JSON endpoint wrapper (handle) and one RFC 9457
// problem writer (writeProblem). Handlers hold no state that matters: every
// decision on a key is made by the Store.
//
// Per-tenant rate limits are enforced by an in-memory token bucket in each
// replica, so with N replicas the effective fleet limit is N times the
// tenant's rate_limit_per_second.
package api

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/auth"
	"github.com/idem-dev/idem/client/errcode"
	"github.com/idem-dev/idem/internal/budget"
	"github.com/idem-dev/idem/keyevents"
	"github.com/idem-dev/idem/metrics"
	"github.com/idem-dev/idem/retrybudget"
	"github.com/idem-dev/idem/tenants"
)

// DefaultMaxBodyBytes is the request body limit when Options.MaxBodyBytes is
// zero or less.
const DefaultMaxBodyBytes = 10 << 20

// ReadyTimeout bounds the store ping of GET /readyz; idem_ready pings with
// the same bound.
const ReadyTimeout = metrics.ReadyTimeout

// Options configure the router returned by New.
type Options struct {
	Store    idem.Store
	Tenants  *tenants.Service
	Verifier *auth.Verifier
	// Logger receives the access log and internal errors; nil discards.
	Logger *slog.Logger
	// MaxBodyBytes limits every request body; zero or less means
	// DefaultMaxBodyBytes.
	MaxBodyBytes int64
	// MaxInflightBytes is the server-wide budget of request body bytes in
	// flight, each body charged BodyMemoryFactor times its size; past it a
	// request is refused with 503 server_busy before its body is read. Zero
	// or less means DefaultMaxInflightBytes.
	MaxInflightBytes int64
	// InflightShare is the part of the in-flight budget each tenant may
	// always hold, and at least one body of the largest size (budget
	// NewShared, ShareOf); past it a tenant's request is still admitted
	// while a whole share stays free for the other tenants. Zero means
	// budget.DefaultShare; 1 or more turns the shares off.
	InflightShare float64
	// MinBodyRate is the slowest a body above largeBody bytes may arrive,
	// in bytes per second: its read must end within bodyReadGrace plus
	// its Content-Length at this rate (when that is sooner than the
	// server's read timeout), so that a body announced large and sent one
	// byte at a time holds its reservation for seconds, not for the read
	// timeout. Zero means DefaultMinBodyRate; less than zero, no bound.
	MinBodyRate int64
	// Waiters hold claims that asked to wait (wait_seconds, Prefer:
	// wait=N) while their key is in flight; nil never waits.
	Waiters *keyevents.Waiters
	// MaxWait caps every wait whatever the tenant allows; the server sets
	// it below its write timeout, so a held claim is answered before the
	// connection is cut. Zero or less means idem.MaxWaitSecondsLimit.
	MaxWait time.Duration
	// Observer receives metrics hooks; nil for none.
	Observer Observer
	// Webhooks is the store's webhook side; nil serves no /v1/webhooks
	// routes.
	Webhooks idem.WebhookStore
	// AllowPrivateWebhooks accepts endpoint URLs on loopback, link-local
	// and private addresses (IDEM_WEBHOOK_ALLOW_PRIVATE), webhooks' and
	// completers' alike.
	AllowPrivateWebhooks bool
	// RetryBudget is this replica's retry budget of every tenant; nil
	// means one with retrybudget.DefaultWindow.
	RetryBudget *retrybudget.Budget
	// Completers is the store's completer side; nil serves no
	// /v1/completers routes.
	Completers idem.CompleterStore
}

// Observer receives the outcome of requests, claims and writes, for
// metrics.
type Observer interface {
	// ObserveHTTP is called once per request, after its answer, by the
	// access log middleware with what it logs: the chi route pattern (""
	// when no route matched), the method, the status written (500 when the
	// handler panicked before writing; 499 when the client went away) and
	// the time since the request reached the router. One wrapper of the
	// response and one route pattern serve both the log line and the
	// metric.
	ObserveHTTP(route, method string, status int, d time.Duration)
	// ObserveClaim is called after every claim that reached the store;
	// action is 0 when err != nil.
	ObserveClaim(tenant string, action idem.ClaimAction, err error)
	// ObserveWrite is called after every checkpoint, complete and release
	// that passed request validation; op is "checkpoint", "complete" or
	// "release".
	ObserveWrite(tenant, op string, err error)
	// InflightBudget is called once, by New, with a reader of the request
	// body bytes held against the server-wide in-flight budget (each body
	// times BodyMemoryFactor), for a gauge read at scrape time.
	InflightBudget(used func() int64)
	// ObserveAttempt is called for every request of a tenant the retry
	// budget decided on (Idem-Attempt), with whether it refused it.
	ObserveAttempt(tenant string, a retrybudget.Attempt, refused bool)
	// RetryBudget is called once, by New, with a reader of the retry
	// budget's windows, for the amplification gauge read at scrape time.
	RetryBudget(snapshot func() []retrybudget.Stats)
}

// service is the HTTP API: the dependencies its handlers share. (Package
// server wires it into the binary; cmd/server is that binary.)
type service struct {
	store    idem.Store
	tenants  *tenants.Service
	verifier *auth.Verifier
	logger   *slog.Logger
	maxBody  int64
	inflight *inflight
	minRate  int64
	observer Observer
	waiters  *keyevents.Waiters
	maxWait  time.Duration
	limiter  *limiter
	retries  *retrybudget.Budget
	buffers  sync.Pool // of *bytes.Buffer, for encoding responses

	webhooks             idem.WebhookStore
	allowPrivateWebhooks bool
	completers           idem.CompleterStore
}

// New returns the router serving /v1/..., /healthz and /readyz. The caller
// may mount more routes on it afterwards.
func New(opts Options) *chi.Mux {
	s := &service{
		store:    opts.Store,
		tenants:  opts.Tenants,
		verifier: opts.Verifier,
		logger:   opts.Logger,
		maxBody:  opts.MaxBodyBytes,
		observer: opts.Observer,
		waiters:  opts.Waiters,
		maxWait:  opts.MaxWait,
		limiter:  newLimiter(time.Now),
		retries:  opts.RetryBudget,

		webhooks:             opts.Webhooks,
		allowPrivateWebhooks: opts.AllowPrivateWebhooks,
		completers:           opts.Completers,
	}
	if s.maxWait <= 0 {
		s.maxWait = idem.MaxWaitSecondsLimit * time.Second
	}
	s.buffers.New = func() any { return new(bytes.Buffer) }
	if s.logger == nil {
		s.logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if s.maxBody <= 0 {
		s.maxBody = DefaultMaxBodyBytes
	}
	limit := opts.MaxInflightBytes
	if limit <= 0 {
		limit = DefaultMaxInflightBytes
	}
	share := opts.InflightShare
	if share <= 0 {
		share = budget.DefaultShare
	}
	s.inflight = budget.NewShared(limit, budget.ShareOf(limit, share, s.maxBody*BodyMemoryFactor))
	s.minRate = opts.MinBodyRate
	if s.minRate == 0 {
		s.minRate = DefaultMinBodyRate
	}
	if s.retries == nil {
		s.retries = retrybudget.New(retrybudget.DefaultWindow, nil)
	}
	if s.observer != nil {
		s.observer.InflightBudget(s.inflight.Used)
		s.observer.RetryBudget(s.retries.Snapshot)
	}

	r := chi.NewRouter()
	r.Use(requestID, s.accessLog, s.recoverer)
	r.NotFound(func(w http.ResponseWriter, r *http.Request) {
		s.writeProblem(w, r, idem.Errorf(errcode.NotFound, "no such endpoint"))
	})
	r.MethodNotAllowed(func(w http.ResponseWriter, req *http.Request) {
		// RFC 9110 §15.5.6: a 405 lists the methods the resource has.
		w.Header().Set("Allow", strings.Join(allowedMethods(r, req), ", "))
		s.writeProblem(w, req, idem.Errorf(errcode.MethodNotAllowed, "method %s is not allowed here", req.Method))
	})

	r.Get("/healthz", s.healthz)
	r.Get("/readyz", s.readyz)

	// One router, every path written out whole: a mounted /v1 subrouter
	// cost each request a second tree walk and a copy of its path.
	r.Group(func(r chi.Router) {
		r.Use(s.authenticate)

		r.Group(func(r chi.Router) {
			r.Use(s.requireScope(auth.ScopeAdmin))
			r.Post("/v1/admin/tenants", handle(s, s.createTenant))
			r.Get("/v1/admin/tenants", handle(s, s.listTenants))
			r.Get("/v1/admin/tenants/{id}", handle(s, s.getTenant))
			r.Patch("/v1/admin/tenants/{id}", handle(s, s.patchTenant))
			r.Delete("/v1/admin/tenants/{id}", handle(s, s.deleteTenant))
			r.Get("/v1/admin/orphans", handle(s, s.listOrphans))
			r.Get("/v1/admin/tenants/{id}/keys/{key}", handle(s, s.getAnyKey))
			r.Post("/v1/admin/tenants/{id}/keys/{key}/resolve", handle(s, s.resolveAny))
			r.Get("/v1/admin/tenants/{id}/keys/{key}/audit", handle(s, s.listAnyKeyAudit))
			r.Get("/v1/admin/audit", handle(s, s.listAnyAudit))
			r.Get("/v1/admin/retry-amplification", handle(s, s.retryAmplification))
		})

		r.Group(func(r chi.Router) {
			r.Use(s.requireScope(auth.ScopeKeysWrite))
			r.With(s.resolveClaimTenant, exposeResponseHeader).Post("/v1/keys/{key}/claim", handle(s, s.claim))
			// A suspended tenant still finishes the claims made before.
			r.With(s.resolveFinishingTenant(retrybudget.KindCheckpoint)).Post("/v1/keys/{key}/checkpoint", handle(s, s.checkpoint))
			r.With(s.resolveFinishingTenant(retrybudget.KindComplete)).Post("/v1/keys/{key}/complete", handle(s, s.complete))
			r.With(s.resolveFinishingTenant(retrybudget.KindRelease)).Post("/v1/keys/{key}/release", handle(s, s.release))
		})

		r.Group(func(r chi.Router) {
			r.Use(s.requireScope(auth.ScopeKeysRead))
			r.Use(s.resolveTenant)
			r.Get("/v1/keys", handle(s, s.listKeys))
			r.Get("/v1/keys/{key}", handle(s, s.getKey))
		})

		r.Group(func(r chi.Router) {
			r.Use(s.requireScope(auth.ScopeKeysRead, auth.ScopeTenantAdmin))
			r.Use(s.resolveTenant)
			r.Get("/v1/tenant", handle(s, s.getOwnTenant))
			r.Get("/v1/keys/{key}/audit", handle(s, s.listOwnKeyAudit))
			r.Get("/v1/audit", handle(s, s.listOwnAudit))
		})

		// The tenant's own settings, resolutions, webhook endpoints and
		// completers (the last two when the store keeps them).
		r.Group(func(r chi.Router) {
			r.Use(s.requireScope(auth.ScopeTenantAdmin))
			r.Use(s.resolveTenant)
			r.Patch("/v1/tenant", handle(s, s.patchOwnTenant))
			r.Post("/v1/keys/{key}/resolve", handle(s, s.resolveOwn))
			if s.webhooks != nil {
				r.Post("/v1/webhooks", handle(s, s.createWebhook))
				r.Get("/v1/webhooks", handle(s, s.listWebhooks))
				r.Get("/v1/webhooks/{id}", handle(s, s.getWebhook))
				r.Patch("/v1/webhooks/{id}", handle(s, s.patchWebhook))
				r.Delete("/v1/webhooks/{id}", handle(s, s.deleteWebhook))
				r.Post("/v1/webhooks/{id}/test", handle(s, s.testWebhook))
				r.Get("/v1/webhooks/{id}/deliveries", handle(s, s.listDeliveries))
			}
			if s.completers != nil {
				r.Post("/v1/completers", handle(s, s.createCompleter))
				r.Get("/v1/completers", handle(s, s.listCompleters))
				r.Get("/v1/completers/{id}", handle(s, s.getCompleter))
				r.Delete("/v1/completers/{id}", handle(s, s.deleteCompleter))
			}
		})
	})
	return r
}

func (s *service) healthz(w http.ResponseWriter, r *http.Request) {
	s.writeJSON(w, r, map[string]string{"status": "ok"})
}

func (s *service) readyz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), ReadyTimeout)
	defer cancel()
	if err := s.store.Ping(ctx); err != nil {
		s.writeProblem(w, r, &idem.Error{Code: idem.CodeStoreUnavailable, Detail: "the store does not answer", Err: err})
		return
	}
	s.writeJSON(w, r, map[string]string{"status": "ready"})
}

// allowedMethods lists the methods routes answers for the request's path.
func allowedMethods(routes chi.Routes, r *http.Request) []string {
	path := r.URL.RawPath
	if path == "" {
		path = r.URL.Path
	}
	var allowed []string
	for _, m := range []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete} {
		if routes.Match(chi.NewRouteContext(), m, path) {
			allowed = append(allowed, m)
		}
	}
	return allowed
}
