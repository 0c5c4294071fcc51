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
//	idem_orphans_by_state{state}                           gauge     keys the completer holds or gave up on: resuming|unknown|review (completer.go), from the orphan watch
//	idem_oldest_orphan_by_state_age_seconds{state}         gauge     seconds since the completer last moved the oldest of them
//	idem_completer_attempts_total{outcome}                 counter   completer attempts: completed|not_done|unknown|review
//	idem_tenant_stored_bytes{tenant}                       gauge     bytes the tenant's records store (usage.stored_bytes), from the orphan watch
//	idem_tenant_storage_quota_bytes{tenant}                gauge     the tenant's storage_quota_bytes, from the orphan watch
//	idem_reaper_deleted_total{state}                       counter   records deleted by the reaper, by API state at deletion
//	idem_reaper_orphans_deleted_total{tenant}              counter   orphans deleted by the reaper (each is also logged)
//	idem_reaper_runs_total{result}                         counter   reaper passes: ok|error
//	idem_reaper_last_success_timestamp_seconds             gauge     unix time of the last successful reaper pass
//	idem_http_request_duration_seconds{route,method,status_class}  histogram status_class 1xx…5xx, or 499 when the client went away
//	idem_store_operation_duration_seconds{op,result}       histogram result ok|rejected|unavailable|canceled|error
//	idem_tenant_store_share_waits_total{tenant,result}     counter   store calls that found their tenant's share of the connections in use (IDEM_DB_TENANT_SHARE) and waited: result ok|unavailable|canceled
//	idem_attempts_total{tenant,attempt,cause}              counter   requests by Idem-Attempt: attempt first|retry; cause none (first) or the retry's cause (retrybudget.Causes)
//	idem_retries_refused_total{tenant,cause}               counter   retries refused by the tenant's retry budget (429 retry_budget_exhausted), by the cause they named
//	idem_retry_amplification_ratio{tenant}                 gauge     attempts per first attempt on this replica over the retry budget's window, at scrape time; absent for a tenant idle over it
//	idem_db_pool_*                                         gauges/counters of the database connection pool (pool.go)
//	idem_build_info{version,revision,go_version}           gauge     always 1
//	idem_ready                                             gauge     1 when the store answers a ping at scrape time
//
// plus the standard go_* and process_* collectors.
//
// # Cardinality
//
// Tenant labels are deliberate: a tenant is an account created by the
// operator, not a value a caller can mint. Still, only the first
// LimitTenants tenants (IDEM_METRICS_MAX_TENANTS, default 100) get their
// own series; the others share the label TenantOther, "(other)". One
// tenant label has at most SeriesPerTenant (50) series, so the
// tenant-labelled series stay below 50 × (limit + 1), 5,050 with the
// default, whether there are 100 or 10,000 tenants (TestTenantCardinality
// counts them). Keys, fingerprints and raw paths never become labels: the
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
	"runtime"
	"runtime/debug"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/retrybudget"
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
	reg                  prometheus.Registerer
	claims               *prometheus.CounterVec
	writes               *prometheus.CounterVec
	orphans              *prometheus.GaugeVec
	oldestOrphanAge      *prometheus.GaugeVec
	watchLastSuccess     prometheus.Gauge
	storedBytes          *prometheus.GaugeVec
	storageQuota         *prometheus.GaugeVec
	reaperDeleted        *prometheus.CounterVec
	reaperOrphansDeleted *prometheus.CounterVec
	reaperRuns           *prometheus.CounterVec
	reaperLastSuccess    prometheus.Gauge
	webhookAttempts      *prometheus.CounterVec
	completionKeys       *prometheus.GaugeVec
	completionOldestAge  *prometheus.GaugeVec
	completerAttempts    *prometheus.CounterVec
	shareWaits           *prometheus.CounterVec
	attempts             *prometheus.CounterVec
	refused              *prometheus.CounterVec
	httpDuration         *prometheus.HistogramVec
	storeDuration        *prometheus.HistogramVec

	// Children of the hot-path vectors, resolved once per label values.
	claimsBy  children[prometheus.Counter]
	writesBy  children[prometheus.Counter]
	sharesBy  children[prometheus.Counter]
	attemptBy children[prometheus.Counter]
	refusedBy children[prometheus.Counter]
	httpBy    children[prometheus.Observer]
	storeBy   children[prometheus.Observer]
	tenantsBy sync.Map // tenant id → its label (string), see tenantLabel

	buildInfo *prometheus.GaugeVec

	mu            sync.Mutex
	orphanTenants map[string]struct{} // tenant labels whose orphan gauges are set
	usageTenants  map[string]struct{} // tenant labels whose storage gauges are set
	maxTenants    int                 // tenants with their own series; see LimitTenants
	admitted      map[string]struct{} // tenants of the counters with their own series
}

// New creates the service's metrics and registers them on reg. It also
// registers the Go and process collectors unless reg already has them. It
// panics if the idem_ metrics are already registered on reg, like
// prometheus.MustRegister.
func New(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		reg: reg,
		claims: newCounterVec("claims_total",
			"Claims by tenant and outcome (created, replayed, in_flight, mismatch, takeover, error, canceled).",
			"tenant", "outcome"),
		writes: newCounterVec("key_writes_total",
			"Checkpoints, completes and releases by tenant, operation and result; result lease_lost counts stale fencing tokens refused, canceled the callers that went away.",
			"tenant", "op", "result"),
		orphans: newGaugeVec("orphans",
			"Orphaned keys (in flight with an expired lease) by tenant, as of the last orphan watch. Absent for tenants without orphans.",
			"tenant"),
		oldestOrphanAge: newGaugeVec("oldest_orphan_age_seconds",
			"Seconds since the lease of the tenant's oldest orphan expired, as of the last orphan watch.",
			"tenant"),
		watchLastSuccess: newGauge("orphan_watch_last_success_timestamp_seconds",
			"Unix time of the last successful orphan watch."),
		storedBytes: newGaugeVec("tenant_stored_bytes",
			"Bytes the tenant's records store, as storage_quota_bytes counts them (usage.stored_bytes), as of the last orphan watch.",
			"tenant"),
		storageQuota: newGaugeVec("tenant_storage_quota_bytes",
			"The tenant's storage_quota_bytes: at or over it, claims of new keys get 507 storage_quota_exceeded. As of the last orphan watch.",
			"tenant"),
		reaperDeleted: newCounterVec("reaper_deleted_total",
			"Records deleted by the reaper, by their API state at deletion (orphaned, expired, in_flight, completed).",
			"state"),
		reaperOrphansDeleted: newCounterVec("reaper_orphans_deleted_total",
			"Orphans deleted by the reaper, by tenant; each one is also logged for follow-up.",
			"tenant"),
		reaperRuns: newCounterVec("reaper_runs_total",
			"Reaper passes by result (ok, error).",
			"result"),
		reaperLastSuccess: newGauge("reaper_last_success_timestamp_seconds",
			"Unix time of the last successful reaper pass."),
		httpDuration: newHistogramVec("http_request_duration_seconds",
			"HTTP request duration by chi route pattern, method and status class (2xx … 5xx, or 499 when the client went away); unmatched routes are \"other\".",
			[]float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
			"route", "method", "status_class"),
		storeDuration: newHistogramVec("store_operation_duration_seconds",
			"Store operation duration by operation and result (ok, rejected, unavailable, canceled, error).",
			[]float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5},
			"op", "result"),
		shareWaits: newCounterVec("tenant_store_share_waits_total",
			"Store calls of a tenant that found its share of the database connections (IDEM_DB_TENANT_SHARE) in use and waited for one of its own calls to end, by result: ok (got its turn), unavailable (the store deadline ran out: 503 store_unavailable), canceled (the caller went away).",
			"tenant", "result"),
		attempts: newCounterVec("attempts_total",
			"Requests of a tenant by what their Idem-Attempt header says: attempt first or retry; cause none for a first attempt, else why the previous attempt failed (timeout, network, unavailable, throttled, server-error, in-flight, other). Refused retries included.",
			"tenant", "attempt", "cause"),
		refused: newCounterVec("retries_refused_total",
			"Retries refused by the tenant's retry budget on this replica (429 retry_budget_exhausted), by the cause they named.",
			"tenant", "cause"),
		webhookAttempts: newCounterVec("webhook_attempts_total",
			"Webhook delivery attempts by result (delivered, retry, gave_up).",
			"result"),
		completionKeys: newGaugeVec("orphans_by_state",
			"Keys the completer holds (resuming: an attempt runs; unknown: the next attempt is due later) or gave up on (review: a person must resolve them), all tenants, as of the last orphan watch. Every state is always present.",
			"state"),
		completionOldestAge: newGaugeVec("oldest_orphan_by_state_age_seconds",
			"Seconds since the completer last moved the oldest key in each state (0 when none), as of the last orphan watch.",
			"state"),
		completerAttempts: newCounterVec("completer_attempts_total",
			"Completer attempts on orphaned keys by outcome (completed, not_done, unknown, review).",
			"outcome"),
		buildInfo: newGaugeVec("build_info",
			"Always 1; its labels say which build runs: version, VCS revision and Go version.",
			"version", "revision", "go_version"),
		orphanTenants: map[string]struct{}{},
		usageTenants:  map[string]struct{}{},
		maxTenants:    DefaultMaxTenants,
		admitted:      map[string]struct{}{},
	}
	m.claimsBy = children[prometheus.Counter]{labels: 2, with: m.claims.WithLabelValues}
	m.writesBy = children[prometheus.Counter]{labels: 3, with: m.writes.WithLabelValues}
	m.sharesBy = children[prometheus.Counter]{labels: 2, with: m.shareWaits.WithLabelValues}
	m.attemptBy = children[prometheus.Counter]{labels: 3, with: m.attempts.WithLabelValues}
	m.refusedBy = children[prometheus.Counter]{labels: 2, with: m.refused.WithLabelValues}
	m.httpBy = children[prometheus.Observer]{labels: 3, with: m.httpDuration.WithLabelValues}
	m.storeBy = children[prometheus.Observer]{labels: 2, with: m.storeDuration.WithLabelValues}
	version, revision, goVersion := BuildInfo()
	m.buildInfo.WithLabelValues(version, revision, goVersion).Set(1)
	reg.MustRegister(
		m.claims, m.writes, m.orphans, m.oldestOrphanAge, m.watchLastSuccess, m.storedBytes, m.storageQuota,
		m.reaperDeleted, m.reaperOrphansDeleted, m.reaperRuns, m.reaperLastSuccess,
		m.webhookAttempts, m.shareWaits, m.attempts, m.refused, m.httpDuration, m.storeDuration, m.buildInfo,
		m.completionKeys, m.completionOldestAge, m.completerAttempts,
	)
	for _, st := range []idem.CompletionState{idem.CompletionResuming, idem.CompletionUnknown, idem.CompletionReview} {
		m.completionKeys.WithLabelValues(string(st)).Set(0)
		m.completionOldestAge.WithLabelValues(string(st)).Set(0)
	}
	registerOnce(reg, collectors.NewGoCollector())
	registerOnce(reg, collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// newCounterVec, newGaugeVec, newGauge and newHistogramVec make the idem_
// collectors of New: the namespace, a name, its help and its labels.
func newCounterVec(name, help string, labels ...string) *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: name, Help: help}, labels)
}

func newGaugeVec(name, help string, labels ...string) *prometheus.GaugeVec {
	return prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: Namespace, Name: name, Help: help}, labels)
}

func newGauge(name, help string) prometheus.Gauge {
	return prometheus.NewGauge(prometheus.GaugeOpts{Namespace: Namespace, Name: name, Help: help})
}

func newHistogramVec(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
	return prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: Namespace, Name: name, Help: help, Buckets: buckets}, labels)
}

// TenantOther is the tenant label shared by the tenants past the limit of
// LimitTenants. Parentheses make it a value no tenant id can take.
const TenantOther = "(other)"

// DefaultMaxTenants is how many tenants get their own series unless
// LimitTenants says otherwise (IDEM_METRICS_MAX_TENANTS).
const DefaultMaxTenants = 100

// LimitTenants sets how many tenants get their own tenant-labelled series;
// the others share TenantOther, so the tenant-labelled series stay below
// (n+1) × SeriesPerTenant however many tenants there are. For the counters
// the first n tenants seen since start keep their series for the life of
// the process (a counter that changed label would lose its history); the
// orphan gauges are re-ranked at every orphan watch, the n tenants with the
// most orphans first, and the storage gauges likewise by stored bytes. n = 0 puts every tenant in TenantOther. Call it
// before the first observation.
func (m *Metrics) LimitTenants(n int) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.maxTenants = max(n, 0)
}

// SeriesPerTenant is the most series one tenant label can have: 8 claim
// outcomes, 3 write operations × 6 results, 2 orphan gauges, 1 counter
// of reaped orphans, 3 results of waits for the tenant's store share,
// 2 storage gauges, 8 attempt kinds (first, and a retry of each of 7
// causes), 7 causes of refused retries and 1 amplification gauge.
const SeriesPerTenant = 8 + 3*6 + 2 + 1 + 3 + 2 + 8 + 7 + 1

// tenantLabel returns the tenant label of a counter observation: the tenant
// itself while it is among the admitted ones, TenantOther past the limit.
// A tenant's label never changes once given, so it is remembered: tenants
// are created by the operator, so the memo holds one entry per tenant.
func (m *Metrics) tenantLabel(tenant string) string {
	if l, ok := m.tenantsBy.Load(tenant); ok {
		return l.(string)
	}
	l := m.admit(tenant)
	m.tenantsBy.Store(tenant, l)
	return l
}

func (m *Metrics) admit(tenant string) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.admitted[tenant]; ok {
		return tenant
	}
	if len(m.admitted) < m.maxTenants {
		m.admitted[tenant] = struct{}{}
		return tenant
	}
	return TenantOther
}

// Version is the release version idem_build_info reports, set at build time
// with -ldflags "-X github.com/idem-dev/idem/metrics.Version=v1.2.3". Empty,
// the module version of the build info is used ("(devel)" for a local
// build).
var Version string

// Revision is the VCS revision idem_build_info reports, set at build time
// with -ldflags "-X github.com/idem-dev/idem/metrics.Revision=…" (make build
// does, and the Dockerfile through --build-arg REVISION, since the image
// build sees no .git). Empty, the revision Go recorded is used.
var Revision string

// BuildInfo returns the labels of idem_build_info: the version (Version or
// the main module's version), the VCS revision the binary was built from
// (Revision, or Go's vcs.revision with "-dirty" when the tree had changes;
// "unknown" without either) and the Go version.
func BuildInfo() (version, revision, goVersion string) {
	version, revision, goVersion = Version, "unknown", runtime.Version()
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		if version == "" {
			version = "unknown"
		}
		if Revision != "" {
			revision = Revision
		}
		return version, revision, goVersion
	}
	if version == "" {
		version = bi.Main.Version
	}
	if version == "" {
		version = "unknown"
	}
	dirty := false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			revision = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if dirty && revision != "unknown" {
		revision += "-dirty"
	}
	if Revision != "" {
		revision = Revision
	}
	if bi.GoVersion != "" {
		goVersion = bi.GoVersion
	}
	return version, revision, goVersion
}

// InflightBudget registers idem_request_body_bytes_in_flight, read from used
// at scrape time: how much of IDEM_MAX_INFLIGHT_BYTES the request bodies in
// flight and the stored bytes of answers being written hold, so an operator
// sees 503 server_busy coming. It implements
// api.Observer; the router calls it once.
func (m *Metrics) InflightBudget(used func() int64) {
	if m == nil {
		return
	}
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: Namespace, Name: "request_body_bytes_in_flight",
		Help: "Request body bytes, and stored bytes of answers being written, held against the in-flight budget (IDEM_MAX_INFLIGHT_BYTES), each counted 4 times its size.",
	}, func() float64 { return float64(used()) }))
}

// ObserveAttempt counts one request of tenant by its Idem-Attempt, and a
// retry the budget refused. It implements api.Observer.
func (m *Metrics) ObserveAttempt(tenant string, a retrybudget.Attempt, refused bool) {
	if m == nil {
		return
	}
	label := m.tenantLabel(tenant)
	kind := "first"
	if a.Retry() {
		kind = "retry"
	}
	m.attemptBy.get(label, kind, string(a.Cause)).Inc()
	if refused {
		m.refusedBy.get(label, string(a.Cause), "").Inc()
	}
}

// RetryBudget registers idem_retry_amplification_ratio, read from snapshot
// at scrape time: per tenant, the attempts that reached this replica
// (first attempts, retries admitted and refused) per first attempt over
// the retry budget's window. 1 is no retry at all; a tenant whose budget
// holds stays near 1 + retry_budget_percent/100 however hard its callers
// retry. Tenants past LimitTenants are summed under TenantOther. It
// implements api.Observer; the router calls it once.
func (m *Metrics) RetryBudget(snapshot func() []retrybudget.Stats) {
	if m == nil {
		return
	}
	m.reg.MustRegister(&amplification{m: m, snapshot: snapshot, desc: prometheus.NewDesc(
		prometheus.BuildFQName(Namespace, "", "retry_amplification_ratio"),
		"Attempts per first attempt of the tenant on this replica over the retry budget's window (first attempts, retries admitted and refused by the budget), at scrape time; absent for a tenant without requests in the window.",
		[]string{"tenant"}, nil)})
}

// amplification is the collector of idem_retry_amplification_ratio.
type amplification struct {
	m        *Metrics
	snapshot func() []retrybudget.Stats
	desc     *prometheus.Desc
}

func (a *amplification) Describe(ch chan<- *prometheus.Desc) { ch <- a.desc }

func (a *amplification) Collect(ch chan<- prometheus.Metric) {
	byLabel := map[string]retrybudget.Stats{}
	for _, s := range a.snapshot() {
		l := a.m.tenantLabel(s.Tenant)
		sum := byLabel[l]
		sum.First += s.First
		sum.Retries += s.Retries
		sum.Refused += s.Refused
		byLabel[l] = sum
	}
	for _, l := range slices.Sorted(maps.Keys(byLabel)) {
		ch <- prometheus.MustNewConstMetric(a.desc, prometheus.GaugeValue, byLabel[l].Amplification(), l)
	}
}

// ReadyTimeout bounds the store ping behind idem_ready, like GET /readyz.
const ReadyTimeout = 2 * time.Second

// RegisterReadiness registers idem_ready: 1 when ping (the store's Ping)
// answers within ReadyTimeout at scrape time, 0 otherwise; the same check as
// GET /readyz, so an alert can see a replica that runs but cannot reach its
// store without a separate HTTP probe.
func RegisterReadiness(reg prometheus.Registerer, ping func(context.Context) error) {
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: Namespace, Name: "ready",
		Help: "1 when the store answered a ping within 2 s at this scrape (what GET /readyz checks), 0 otherwise.",
	}, func() float64 {
		ctx, cancel := context.WithTimeout(context.Background(), ReadyTimeout)
		defer cancel()
		if ping(ctx) != nil {
			return 0
		}
		return 1
	}))
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
		case idem.CodeRequestInFlight, idem.CodeOutcomeUnknown, idem.CodeOutcomeReview:
			// The key is held: by a worker, or by the completer (its
			// first attempt died; idem_orphans_by_state counts those).
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
	m.claimsBy.get(m.tenantLabel(tenant), ClaimOutcome(action, err), "").Inc()
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
	m.writesBy.get(m.tenantLabel(tenant), op, WriteResult(err)).Inc()
}

// ObserveStoreCall records one store call of op that took took and ended
// with err on idem_store_operation_duration_seconds{op,result} (result:
// StoreResult). storemw.Instrument calls it for every call of a wrapped
// store. A nil m records nothing.
func (m *Metrics) ObserveStoreCall(op string, err error, took time.Duration) {
	if m == nil {
		return
	}
	m.storeBy.get(op, StoreResult(err), "").Observe(took.Seconds())
}

// StoreResult maps a store error to the result label of
// idem_store_operation_duration_seconds.
func StoreResult(err error) string {
	if errors.Is(err, context.Canceled) {
		return StoreCanceled
	}
	switch code := idem.ErrorCode(err); code {
	case "":
		return StoreOK
	case idem.CodeStoreUnavailable:
		return StoreUnavailable
	case idem.CodeInternal:
		return StoreError
	default:
		return StoreRejected
	}
}

// ObserveShareWait counts a store call of tenant that found its tenant's
// share of the connections in use and waited (storemw.WithTenantShare's
// observe): err nil once it got its turn, else the error it returned. An
// operator sees which tenant presses against its share, and whether its
// requests got 503 for it.
func (m *Metrics) ObserveShareWait(tenant string, err error) {
	if m == nil {
		return
	}
	m.sharesBy.get(m.tenantLabel(tenant), StoreResult(err), "").Inc()
}

// SetOrphans replaces the orphan gauges with stats, the result of
// idem.Store.OrphanStats. The age of a tenant's oldest orphan is measured on
// the database clock (ObservedAt minus OldestLeaseExpiry). Series of tenants
// missing from stats are deleted.
func (m *Metrics) SetOrphans(stats []idem.OrphanStat) {
	if m == nil {
		return
	}
	// The tenants with the most orphans get their own series; the rest
	// share TenantOther (their orphans summed, the oldest age of them all).
	live := make([]idem.OrphanStat, 0, len(stats))
	for _, s := range stats {
		if s.Count > 0 {
			live = append(live, s)
		}
	}
	type gauge struct {
		count int64
		age   time.Duration
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.orphanTenants = setTopTenants(m, live,
		func(s idem.OrphanStat) (string, int64) { return s.TenantID, int64(s.Count) },
		func(g gauge, s idem.OrphanStat) gauge {
			return gauge{g.count + int64(s.Count), max(g.age, s.ObservedAt.Sub(s.OldestLeaseExpiry))}
		},
		func(label string, g gauge) {
			m.orphans.WithLabelValues(label).Set(float64(g.count))
			m.oldestOrphanAge.WithLabelValues(label).Set(max(g.age, 0).Seconds())
		},
		func(label string) {
			m.orphans.DeleteLabelValues(label)
			m.oldestOrphanAge.DeleteLabelValues(label)
		},
		m.orphanTenants)
	m.watchLastSuccess.SetToCurrentTime()
}

// SetCompletions sets the completer's gauges (idem_orphans_by_state and
// its oldest age) from stats, the result of CompleterStore.CompletionStats:
// summed over tenants, ages on the database clock.
func (m *Metrics) SetCompletions(stats []idem.CompletionStat) {
	if m == nil {
		return
	}
	count := map[idem.CompletionState]int64{}
	age := map[idem.CompletionState]time.Duration{}
	for _, s := range stats {
		count[s.State] += s.Count
		age[s.State] = max(age[s.State], s.ObservedAt.Sub(s.Oldest))
	}
	for _, st := range []idem.CompletionState{idem.CompletionResuming, idem.CompletionUnknown, idem.CompletionReview} {
		m.completionKeys.WithLabelValues(string(st)).Set(float64(count[st]))
		m.completionOldestAge.WithLabelValues(string(st)).Set(max(age[st], 0).Seconds())
	}
}

// ObserveCompleterAttempt counts one completer attempt by outcome.
func (m *Metrics) ObserveCompleterAttempt(outcome idem.CompletionOutcome) {
	if m == nil {
		return
	}
	m.completerAttempts.WithLabelValues(string(outcome)).Inc()
}

// setTopTenants sets per-tenant gauges from items, ranked by the rank key
// says (highest first): the first maxTenants items under their own tenant
// label, the rest folded into TenantOther with merge; set writes a label's
// gauges and del deletes the series of a label set last time (prev) and
// missing now. It returns the labels set, for the next call. The caller
// holds m.mu.
func setTopTenants[T, G any](m *Metrics, items []T, key func(T) (tenant string, rank int64),
	merge func(G, T) G, set func(label string, g G), del func(label string), prev map[string]struct{}) map[string]struct{} {
	ranked := slices.Clone(items)
	sort.SliceStable(ranked, func(i, j int) bool {
		_, a := key(ranked[i])
		_, b := key(ranked[j])
		return a > b
	})
	byLabel := make(map[string]G, min(len(ranked), m.maxTenants+1))
	for i, it := range ranked {
		label, _ := key(it)
		if i >= m.maxTenants {
			label = TenantOther
		}
		byLabel[label] = merge(byLabel[label], it)
	}
	seen := make(map[string]struct{}, len(byLabel))
	for label, g := range byLabel {
		seen[label] = struct{}{}
		set(label, g)
	}
	for label := range prev {
		if _, ok := seen[label]; !ok {
			del(label)
		}
	}
	return seen
}

// SetStorage replaces the storage gauges with the usage and quota of
// tenants (idem.Store.ListTenants). The tenants storing the most get their
// own series; the rest share TenantOther (usage and quotas summed). Series
// of tenants no longer listed are deleted.
func (m *Metrics) SetStorage(tenants []idem.Tenant) {
	if m == nil {
		return
	}
	type gauge struct{ used, quota int64 }
	m.mu.Lock()
	defer m.mu.Unlock()
	m.usageTenants = setTopTenants(m, tenants,
		func(t idem.Tenant) (string, int64) { return t.ID, t.StoredBytes },
		func(g gauge, t idem.Tenant) gauge {
			return gauge{g.used + t.StoredBytes, g.quota + t.Settings.StorageQuotaBytes}
		},
		func(label string, g gauge) {
			m.storedBytes.WithLabelValues(label).Set(float64(g.used))
			m.storageQuota.WithLabelValues(label).Set(float64(g.quota))
		},
		func(label string) {
			m.storedBytes.DeleteLabelValues(label)
			m.storageQuota.DeleteLabelValues(label)
		},
		m.usageTenants)
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
			m.reaperOrphansDeleted.WithLabelValues(m.tenantLabel(r.TenantID)).Inc()
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

// ObserveWebhookAttempt counts one webhook delivery attempt by its result:
// "delivered", "retry" (failed, tried again later) or "gave_up" (failed
// past the maximum age).
func (m *Metrics) ObserveWebhookAttempt(result string) {
	if m == nil {
		return
	}
	m.webhookAttempts.WithLabelValues(result).Inc()
}

// ObserveHTTP records one request in idem_http_request_duration_seconds:
// route is the chi route pattern ("" or a request that matched no route is
// labelled "other"), status the status written. It implements
// api.Observer; the API router calls it from its access log middleware.
func (m *Metrics) ObserveHTTP(route, method string, status int, d time.Duration) {
	if m == nil {
		return
	}
	if route == "" {
		route = RouteOther
	}
	m.httpBy.get(route, methodLabel(method), statusClass(status)).Observe(d.Seconds())
}

// Middleware records idem_http_request_duration_seconds for a chi router
// other than the API's (which observes from its access log). Install it
// inside the router (r.Use) so the route pattern is known once the handler
// has run; requests that matched no route, or that ran outside a chi
// router, are labelled "other".
func (m *Metrics) Middleware(next http.Handler) http.Handler {
	if m == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		ww, ok := w.(middleware.WrapResponseWriter)
		if !ok {
			ww = middleware.NewWrapResponseWriter(w, r.ProtoMajor)
		}
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
	route := ""
	if rc := chi.RouteContext(r.Context()); rc != nil {
		route = rc.RoutePattern()
	}
	m.ObserveHTTP(route, r.Method, status, time.Since(start))
}

// children remembers the children of a metric vector (of labels label
// names, at most three; get's unused arguments are "") by their label
// values, so an observation on the hot path is one map read under a read
// lock instead of the vector's label checks, hashing and lookup. Every label
// value it sees comes from a bounded set (see Cardinality), and so does the
// map.
type children[T any] struct {
	labels int
	with   func(lvs ...string) T // the vector's WithLabelValues
	mu     sync.RWMutex
	m      map[[3]string]T
}

func (c *children[T]) get(a, b, z string) T {
	k := [3]string{a, b, z}
	c.mu.RLock()
	v, ok := c.m[k]
	c.mu.RUnlock()
	if ok {
		return v
	}
	v = c.with([]string{a, b, z}[:c.labels]...)
	c.mu.Lock()
	if c.m == nil {
		c.m = map[[3]string]T{}
	}
	c.m[k] = v
	c.mu.Unlock()
	return v
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
	return statusClasses[status/100-1]
}

var statusClasses = [...]string{"1xx", "2xx", "3xx", "4xx", "5xx"}
