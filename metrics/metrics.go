// Package metrics exports the service's Prometheus metrics, all prefixed
// idem_, on a registry the caller injects.
//
// # Metrics
//
//	idem_claims_total{tenant,outcome}                      counter   claim outcomes: created|replayed|in_flight|mismatch|takeover|recovered|error|canceled
//	idem_key_writes_total{tenant,op,result}                counter   op checkpoint|complete|release; result ok|lease_lost|already_completed|not_found|error|canceled
//	idem_orphans{tenant}                                   gauge     orphaned keys (in_flight, lease expired), from the orphan watch
//	idem_oldest_orphan_age_seconds{tenant}                 gauge     seconds since the oldest orphan's lease expired
//	idem_orphan_watch_last_success_timestamp_seconds       gauge     unix time of the last successful orphan watch
//	idem_reaper_deleted_total{state}                       counter   records deleted by the reaper, by API state at deletion
//	idem_reaper_orphans_deleted_total{tenant}              counter   orphans deleted by the reaper (each is also logged)
//	idem_reaper_runs_total{result}                         counter   reaper passes: ok|error
//	idem_reaper_last_success_timestamp_seconds             gauge     unix time of the last successful reaper pass
//	idem_http_request_duration_seconds{route,method,status_class}  histogram status_class 1xx…5xx, or 499 when the client went away
//	idem_store_operation_duration_seconds{op,result}       histogram result ok|rejected|unavailable|canceled|error
//	idem_db_pool_*                                         gauges/counters of the database connection pool
//
// plus the standard go_* and process_* collectors.
//
// # Cardinality
//
// Tenant labels are deliberate: a tenant is an account created by the
// operator, not a value a caller can mint, so the number of tenants T is
// bounded by the operator. The tenant-labelled series are at most
// 7·T (claims) + 18·T (key writes) + 2·T (orphan gauges) + T (reaped
// orphans), about 28 series per tenant; a thousand tenants make roughly
// 28,000 series. Keys, fingerprints and raw paths never become labels: the
// HTTP histogram uses the chi route pattern ("/v1/keys/{key}/claim"), and a
// request that matched no route is labelled "other".
//
// The orphan gauges exist only for tenants that currently have orphans: when
// a tenant's last orphan is taken over, completed, released or reaped, its
// idem_orphans and idem_oldest_orphan_age_seconds series are deleted (not set
// to 0), so disabled or deleted tenants do not linger. Queries that need a
// zero use `or vector(0)`. With several replicas every replica exports the
// same orphan gauges (they come from the shared database); aggregate them
// with max by (tenant), never sum.
package metrics

import (
	"context"
	"errors"
	"maps"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/idem-dev/idem"
)

// Namespace is the prefix of every metric this package exports.
const Namespace = "idem"

// RouteOther is the route label of requests that matched no route.
const RouteOther = "other"

// Claim outcomes, the values of the outcome label of idem_claims_total.
const (
	OutcomeCreated  = "created"
	OutcomeReplayed = "replayed"
	OutcomeInFlight = "in_flight"
	OutcomeMismatch = "mismatch"
	OutcomeTakeover = "takeover"
	// OutcomeRecovered counts claims that got their own attempt back
	// (same attempt id while its lease runs): their first answer was lost.
	OutcomeRecovered = "recovered"
	OutcomeError     = "error"
	// OutcomeCanceled counts claims whose caller went away before the
	// answer; they are not errors of the service.
	OutcomeCanceled = "canceled"
)

// Write results, the values of the result label of idem_key_writes_total.
const (
	WriteOK               = "ok"
	WriteLeaseLost        = "lease_lost"
	WriteAlreadyCompleted = "already_completed"
	WriteNotFound         = "not_found"
	WriteError            = "error"
	WriteCanceled         = "canceled" // the caller went away before the answer
)

// Store operation results, the values of the result label of
// idem_store_operation_duration_seconds.
const (
	StoreOK          = "ok"
	StoreRejected    = "rejected"    // a domain answer such as key_not_found or lease_lost
	StoreUnavailable = "unavailable" // store_unavailable: the database cannot be reached
	StoreCanceled    = "canceled"    // the caller went away (its context was canceled)
	StoreError       = "error"       // anything else
)

// StatusClientClosedRequest is the status the HTTP layer records (nginx's
// 499) when the client went away before its answer: no answer reached
// anyone, and it is neither a client error nor a server error, so
// idem_http_request_duration_seconds counts it as status_class="499".
const StatusClientClosedRequest = 499

// Metrics holds the service's collectors. Its ObserveClaim and ObserveWrite
// methods satisfy api.Observer. A nil *Metrics is valid and records nothing.
type Metrics struct {
	claims               *prometheus.CounterVec
	writes               *prometheus.CounterVec
	orphans              *prometheus.GaugeVec
	oldestOrphanAge      *prometheus.GaugeVec
	watchLastSuccess     prometheus.Gauge
	reaperDeleted        *prometheus.CounterVec
	reaperOrphansDeleted *prometheus.CounterVec
	reaperRuns           *prometheus.CounterVec
	reaperLastSuccess    prometheus.Gauge
	httpDuration         *prometheus.HistogramVec
	storeDuration        *prometheus.HistogramVec

	mu            sync.Mutex
	orphanTenants map[string]struct{} // tenants whose orphan gauges are set
}

// New creates the service's metrics and registers them on reg. It also
// registers the Go and process collectors unless reg already has them. It
// panics if the idem_ metrics are already registered on reg, like
// prometheus.MustRegister.
func New(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		claims: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "claims_total",
			Help: "Claims by tenant and outcome (created, replayed, in_flight, mismatch, takeover, error, canceled).",
		}, []string{"tenant", "outcome"}),
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "key_writes_total",
			Help: "Checkpoints, completes and releases by tenant, operation and result; result lease_lost counts stale fencing tokens refused, canceled the callers that went away.",
		}, []string{"tenant", "op", "result"}),
		orphans: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: Namespace, Name: "orphans",
			Help: "Orphaned keys (in flight with an expired lease) by tenant, as of the last orphan watch. Absent for tenants without orphans.",
		}, []string{"tenant"}),
		oldestOrphanAge: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: Namespace, Name: "oldest_orphan_age_seconds",
			Help: "Seconds since the lease of the tenant's oldest orphan expired, as of the last orphan watch.",
		}, []string{"tenant"}),
		watchLastSuccess: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: Namespace, Name: "orphan_watch_last_success_timestamp_seconds",
			Help: "Unix time of the last successful orphan watch.",
		}),
		reaperDeleted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "reaper_deleted_total",
			Help: "Records deleted by the reaper, by their API state at deletion (orphaned, expired, in_flight, completed).",
		}, []string{"state"}),
		reaperOrphansDeleted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "reaper_orphans_deleted_total",
			Help: "Orphans deleted by the reaper, by tenant; each one is also logged for follow-up.",
		}, []string{"tenant"}),
		reaperRuns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "reaper_runs_total",
			Help: "Reaper passes by result (ok, error).",
		}, []string{"result"}),
		reaperLastSuccess: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: Namespace, Name: "reaper_last_success_timestamp_seconds",
			Help: "Unix time of the last successful reaper pass.",
		}),
		httpDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: Namespace, Name: "http_request_duration_seconds",
			Help:    "HTTP request duration by chi route pattern, method and status class (2xx … 5xx, or 499 when the client went away); unmatched routes are \"other\".",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}, []string{"route", "method", "status_class"}),
		storeDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: Namespace, Name: "store_operation_duration_seconds",
			Help:    "Store operation duration by operation and result (ok, rejected, unavailable, canceled, error).",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5},
		}, []string{"op", "result"}),
		orphanTenants: map[string]struct{}{},
	}
	reg.MustRegister(
		m.claims, m.writes, m.orphans, m.oldestOrphanAge, m.watchLastSuccess,
		m.reaperDeleted, m.reaperOrphansDeleted, m.reaperRuns, m.reaperLastSuccess,
		m.httpDuration, m.storeDuration,
	)
	registerOnce(reg, collectors.NewGoCollector())
	registerOnce(reg, collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// registerOnce registers c, tolerating a registry that already has it (the
// caller may have added the standard collectors itself).
func registerOnce(reg prometheus.Registerer, c prometheus.Collector) {
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if !errors.As(err, &are) {
			panic("metrics: register collector: " + err.Error())
		}
	}
}

// ClaimOutcome maps the result of a claim to its outcome label: the action
// when err is nil, otherwise in_flight, mismatch or error by error code.
func ClaimOutcome(action idem.ClaimAction, err error) string {
	if err != nil {
		if errors.Is(err, context.Canceled) {
			return OutcomeCanceled
		}
		switch idem.ErrorCode(err) {
		case idem.CodeRequestInFlight:
			return OutcomeInFlight
		case idem.CodeFingerprintMismatch:
			return OutcomeMismatch
		}
		return OutcomeError
	}
	switch action {
	case idem.ActionCreate:
		return OutcomeCreated
	case idem.ActionReplay:
		return OutcomeReplayed
	case idem.ActionTakeover:
		return OutcomeTakeover
	case idem.ActionRecover:
		return OutcomeRecovered
	case idem.ActionRejectInFlight:
		return OutcomeInFlight
	case idem.ActionRejectMismatch:
		return OutcomeMismatch
	}
	return OutcomeError
}

// WriteResult maps the error of a checkpoint, complete or release to its
// result label.
func WriteResult(err error) string {
	if errors.Is(err, context.Canceled) {
		return WriteCanceled
	}
	switch idem.ErrorCode(err) {
	case "":
		return WriteOK
	case idem.CodeLeaseLost:
		return WriteLeaseLost
	case idem.CodeAlreadyCompleted:
		return WriteAlreadyCompleted
	case idem.CodeKeyNotFound:
		return WriteNotFound
	}
	return WriteError
}

// ObserveClaim counts one claim of tenant. action is the store's decision
// when err is nil; err is the claim's error otherwise. It implements
// api.Observer.
func (m *Metrics) ObserveClaim(tenant string, action idem.ClaimAction, err error) {
	if m == nil {
		return
	}
	m.claims.WithLabelValues(tenant, ClaimOutcome(action, err)).Inc()
}

// ObserveWrite counts one checkpoint, complete or release (op) of tenant
// with its error. Ops other than the three are counted as "other". It
// implements api.Observer.
func (m *Metrics) ObserveWrite(tenant, op string, err error) {
	if m == nil {
		return
	}
	switch op {
	case "checkpoint", "complete", "release":
	default:
		op = "other"
	}
	m.writes.WithLabelValues(tenant, op, WriteResult(err)).Inc()
}

// SetOrphans replaces the orphan gauges with stats, the result of
// idem.Store.OrphanStats. The age of a tenant's oldest orphan is measured on
// the database clock (ObservedAt minus OldestLeaseExpiry). Series of tenants
// missing from stats are deleted.
func (m *Metrics) SetOrphans(stats []idem.OrphanStat) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	seen := make(map[string]struct{}, len(stats))
	for _, s := range stats {
		if s.Count <= 0 {
			continue
		}
		seen[s.TenantID] = struct{}{}
		m.orphans.WithLabelValues(s.TenantID).Set(float64(s.Count))
		age := max(s.ObservedAt.Sub(s.OldestLeaseExpiry), 0)
		m.oldestOrphanAge.WithLabelValues(s.TenantID).Set(age.Seconds())
	}
	for t := range m.orphanTenants {
		if _, ok := seen[t]; !ok {
			m.orphans.DeleteLabelValues(t)
			m.oldestOrphanAge.DeleteLabelValues(t)
		}
	}
	m.orphanTenants = seen
	m.watchLastSuccess.SetToCurrentTime()
}

// OrphanTenants returns the tenants whose orphan gauges are currently set.
func (m *Metrics) OrphanTenants() map[string]struct{} {
	if m == nil {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return maps.Clone(m.orphanTenants)
}

// ObserveReaped counts records the reaper deleted, by their API state at
// the moment of deletion, and counts orphans per tenant.
func (m *Metrics) ObserveReaped(records []idem.Record) {
	if m == nil {
		return
	}
	for _, r := range records {
		state := r.APIState()
		m.reaperDeleted.WithLabelValues(string(state)).Inc()
		if state == idem.StateOrphaned {
			m.reaperOrphansDeleted.WithLabelValues(r.TenantID).Inc()
		}
	}
}

// ObserveReaperRun counts one reaper pass; err nil marks a success.
func (m *Metrics) ObserveReaperRun(err error) {
	if m == nil {
		return
	}
	if err != nil {
		m.reaperRuns.WithLabelValues("error").Inc()
		return
	}
	m.reaperRuns.WithLabelValues("ok").Inc()
	m.reaperLastSuccess.SetToCurrentTime()
}

// Middleware records idem_http_request_duration_seconds. Install it inside
// the chi router (r.Use) so the route pattern is known once the handler has
// run; requests that matched no route, or that ran outside a chi router, are
// labelled "other".
func (m *Metrics) Middleware(next http.Handler) http.Handler {
	if m == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		ww := middleware.NewWrapResponseWriter(w, r.ProtoMajor)
		defer func() {
			status := ww.Status()
			if status == 0 {
				status = http.StatusOK
			}
			if rec := recover(); rec != nil {
				// A panicking handler that wrote nothing answers 500 upstream.
				if ww.Status() == 0 {
					status = http.StatusInternalServerError
				}
				m.observeHTTP(r, status, start)
				panic(rec)
			}
			m.observeHTTP(r, status, start)
		}()
		next.ServeHTTP(ww, r)
	})
}

func (m *Metrics) observeHTTP(r *http.Request, status int, start time.Time) {
	route := RouteOther
	if rc := chi.RouteContext(r.Context()); rc != nil {
		if p := rc.RoutePattern(); p != "" {
			route = p
		}
	}
	m.httpDuration.WithLabelValues(route, methodLabel(r.Method), statusClass(status)).
		Observe(time.Since(start).Seconds())
}

func methodLabel(m string) string {
	switch m {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut,
		http.MethodPatch, http.MethodDelete, http.MethodOptions:
		return m
	}
	return "OTHER"
}

func statusClass(status int) string {
	if status == StatusClientClosedRequest {
		return "499"
	}
	if status < 100 || status > 599 {
		return "other"
	}
	return strconv.Itoa(status/100) + "xx"
}
