package metrics_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/metrics"
	"github.com/idem-dev/idem/retrybudget"
)

func TestObserverCountsOutcomes(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewPedanticRegistry()
	m := metrics.New(reg)

	m.ObserveClaim("acme", idem.ActionCreate, nil)
	m.ObserveClaim("acme", idem.ActionCreate, nil)
	m.ObserveClaim("acme", idem.ActionReplay, nil)
	m.ObserveClaim("acme", idem.ActionTakeover, nil)
	m.ObserveClaim("acme", 0, idem.Errorf(idem.CodeRequestInFlight, "busy"))
	m.ObserveClaim("beta", 0, idem.Errorf(idem.CodeFingerprintMismatch, "other"))
	m.ObserveClaim("beta", 0, errors.New("boom"))
	m.ObserveClaim("beta", 0, fmt.Errorf("claim key: %w", context.Canceled))

	m.ObserveWrite("acme", "complete", nil)
	m.ObserveWrite("acme", "complete", idem.Errorf(idem.CodeLeaseLost, "stale"))
	m.ObserveWrite("acme", "checkpoint", idem.Errorf(idem.CodeKeyNotFound, "gone"))
	m.ObserveWrite("acme", "release", idem.Errorf(idem.CodeAlreadyCompleted, "done"))
	m.ObserveWrite("acme", "bogus", nil)
	m.ObserveWrite("acme", "complete", fmt.Errorf("complete key: %w", context.Canceled))

	problems, err := testutil.GatherAndLint(reg)
	require.NoError(t, err)
	require.Empty(t, problems)

	expected := `
# HELP idem_claims_total Claims by tenant and outcome (created, replayed, in_flight, mismatch, takeover, error, canceled).
# TYPE idem_claims_total counter
idem_claims_total{outcome="created",tenant="acme"} 2
idem_claims_total{outcome="in_flight",tenant="acme"} 1
idem_claims_total{outcome="replayed",tenant="acme"} 1
idem_claims_total{outcome="takeover",tenant="acme"} 1
idem_claims_total{outcome="canceled",tenant="beta"} 1
idem_claims_total{outcome="error",tenant="beta"} 1
idem_claims_total{outcome="mismatch",tenant="beta"} 1
# HELP idem_key_writes_total Checkpoints, completes and releases by tenant, operation and result; result lease_lost counts stale fencing tokens refused, canceled the callers that went away.
# TYPE idem_key_writes_total counter
idem_key_writes_total{op="checkpoint",result="not_found",tenant="acme"} 1
idem_key_writes_total{op="complete",result="canceled",tenant="acme"} 1
idem_key_writes_total{op="complete",result="lease_lost",tenant="acme"} 1
idem_key_writes_total{op="complete",result="ok",tenant="acme"} 1
idem_key_writes_total{op="other",result="ok",tenant="acme"} 1
idem_key_writes_total{op="release",result="already_completed",tenant="acme"} 1
`
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(expected), "idem_claims_total", "idem_key_writes_total"))
}

func TestOrphanGaugesFollowSnapshot(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

	m.SetOrphans([]idem.OrphanStat{
		{TenantID: "acme", Count: 3, OldestLeaseExpiry: now.Add(-90 * time.Second), ObservedAt: now},
		{TenantID: "beta", Count: 1, OldestLeaseExpiry: now.Add(-2 * time.Second), ObservedAt: now},
	})
	require.Equal(t, 2, testutil.CollectAndCount(reg, "idem_orphans"))
	require.Equal(t, 3.0, gaugeValue(t, reg, "idem_orphans", "acme"))
	require.Equal(t, 90.0, gaugeValue(t, reg, "idem_oldest_orphan_age_seconds", "acme"))
	require.Equal(t, 2.0, gaugeValue(t, reg, "idem_oldest_orphan_age_seconds", "beta"))

	// beta's orphan is gone: its series disappear, acme's are updated.
	m.SetOrphans([]idem.OrphanStat{
		{TenantID: "acme", Count: 1, OldestLeaseExpiry: now.Add(-10 * time.Second), ObservedAt: now},
	})
	require.Equal(t, 1, testutil.CollectAndCount(reg, "idem_orphans"))
	require.Equal(t, 1, testutil.CollectAndCount(reg, "idem_oldest_orphan_age_seconds"))
	require.Equal(t, 1.0, gaugeValue(t, reg, "idem_orphans", "acme"))
	require.Equal(t, 10.0, gaugeValue(t, reg, "idem_oldest_orphan_age_seconds", "acme"))

	m.SetOrphans(nil)
	require.Zero(t, testutil.CollectAndCount(reg, "idem_orphans"))
	require.Empty(t, m.OrphanTenants())
	require.Equal(t, 1, testutil.CollectAndCount(reg, "idem_orphan_watch_last_success_timestamp_seconds"))
}

func TestReaperCounters(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	now := time.Now()
	m.ObserveReaped([]idem.Record{
		{TenantID: "acme", Key: "a", State: idem.StateInFlight, LeaseExpiresAt: now.Add(-time.Hour), ObservedAt: now},
		{TenantID: "acme", Key: "b", State: idem.StateInFlight, LeaseExpiresAt: now.Add(-time.Hour), ObservedAt: now},
		{TenantID: "beta", Key: "c", State: idem.StateCompleted, ReplayUntil: now.Add(-time.Hour), ObservedAt: now},
		{TenantID: "gone", Key: "d", State: idem.StateCompleted, ReplayUntil: now.Add(time.Hour), ObservedAt: now},
	})
	m.ObserveReaperRun(nil)
	m.ObserveReaperRun(errors.New("db down"))

	expected := `
# HELP idem_reaper_deleted_total Records deleted by the reaper, by their API state at deletion (orphaned, expired, in_flight, completed).
# TYPE idem_reaper_deleted_total counter
idem_reaper_deleted_total{state="completed"} 1
idem_reaper_deleted_total{state="expired"} 1
idem_reaper_deleted_total{state="orphaned"} 2
# HELP idem_reaper_orphans_deleted_total Orphans deleted by the reaper, by tenant; each one is also logged for follow-up.
# TYPE idem_reaper_orphans_deleted_total counter
idem_reaper_orphans_deleted_total{tenant="acme"} 2
# HELP idem_reaper_runs_total Reaper passes by result (ok, error).
# TYPE idem_reaper_runs_total counter
idem_reaper_runs_total{result="error"} 1
idem_reaper_runs_total{result="ok"} 1
`
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(expected),
		"idem_reaper_deleted_total", "idem_reaper_orphans_deleted_total", "idem_reaper_runs_total"))
}

// TestMiddlewareLabelsByRoutePattern sends real HTTP requests through a chi
// router on a loopback listener and checks that the histogram is labelled
// by route pattern, never by raw path.
func TestMiddlewareLabelsByRoutePattern(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)

	r := chi.NewRouter()
	r.Use(m.Middleware)
	r.Post("/v1/keys/{key}/claim", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusCreated) })
	r.Get("/v1/keys/{key}", func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "nope", http.StatusNotFound)
	})
	r.Get("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })
	r.Post("/v1/keys/{key}/complete", func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(metrics.StatusClientClosedRequest)
	})
	srv := httptest.NewServer(r)
	t.Cleanup(srv.Close)

	do := func(method, path string) int {
		req, err := http.NewRequest(method, srv.URL+path, nil)
		require.NoError(t, err)
		resp, err := srv.Client().Do(req)
		require.NoError(t, err)
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	require.Equal(t, 201, do("POST", "/v1/keys/order-1/claim"))
	require.Equal(t, 201, do("POST", "/v1/keys/order-2/claim"))
	require.Equal(t, 404, do("GET", "/v1/keys/order-3"))
	require.Equal(t, 200, do("GET", "/healthz"))
	require.Equal(t, 404, do("GET", "/no/such/path/123"))
	require.Equal(t, 499, do("POST", "/v1/keys/order-4/complete"))

	counts := histogramCounts(t, reg, "idem_http_request_duration_seconds")
	require.Equal(t, map[string]uint64{
		"/v1/keys/{key}/claim POST 2xx":    2,
		"/v1/keys/{key} GET 4xx":           1,
		"/healthz GET 2xx":                 1,
		"other GET 4xx":                    1,
		"/v1/keys/{key}/complete POST 499": 1,
	}, counts)

	problems, err := testutil.GatherAndLint(reg)
	require.NoError(t, err)
	require.Empty(t, problems)
}

func TestNilMetricsIsNoop(t *testing.T) {
	t.Parallel()
	var m *metrics.Metrics
	m.ObserveClaim("a", idem.ActionCreate, nil)
	m.ObserveWrite("a", "complete", nil)
	m.SetOrphans(nil)
	m.ObserveReaped(nil)
	m.ObserveReaperRun(nil)
	h := m.Middleware(http.NotFoundHandler())
	require.NotNil(t, h)
}

func TestOutcomeMapping(t *testing.T) {
	t.Parallel()
	require.Equal(t, "created", metrics.ClaimOutcome(idem.ActionCreate, nil))
	require.Equal(t, "in_flight", metrics.ClaimOutcome(0, &idem.Error{Code: idem.CodeRequestInFlight}))
	require.Equal(t, "in_flight", metrics.ClaimOutcome(0, &idem.Error{Code: idem.CodeOutcomeUnknown}), "held by the completer")
	require.Equal(t, "in_flight", metrics.ClaimOutcome(0, &idem.Error{Code: idem.CodeOutcomeReview}), "held for review")
	require.Equal(t, "error", metrics.ClaimOutcome(0, idem.Errorf(idem.CodeStoreUnavailable, "down")))
	require.Equal(t, "ok", metrics.StoreResult(nil))
	require.Equal(t, "rejected", metrics.StoreResult(idem.ErrKeyNotFound))
	require.Equal(t, "unavailable", metrics.StoreResult(idem.ErrStoreUnavailable))
	require.Equal(t, "error", metrics.StoreResult(errors.New("x")))
	canceled := fmt.Errorf("%w (%w)", &idem.Error{Code: idem.CodeInternal}, context.Canceled)
	require.Equal(t, "canceled", metrics.StoreResult(canceled))
	require.Equal(t, "canceled", metrics.ClaimOutcome(0, canceled))
	require.Equal(t, "canceled", metrics.WriteResult(canceled))
}

// gaugeValue returns the value of the series of name with tenant=tenant.
func gaugeValue(t *testing.T, g prometheus.Gatherer, name, tenant string) float64 {
	t.Helper()
	for _, mf := range gather(t, g, name) {
		for _, mt := range mf.GetMetric() {
			if label(mt, "tenant") == tenant {
				return mt.GetGauge().GetValue()
			}
		}
	}
	t.Fatalf("no %s series for tenant %q", name, tenant)
	return 0
}

// histogramCounts returns sample counts keyed by "route method status_class".
func histogramCounts(t *testing.T, g prometheus.Gatherer, name string) map[string]uint64 {
	t.Helper()
	out := map[string]uint64{}
	for _, mf := range gather(t, g, name) {
		for _, mt := range mf.GetMetric() {
			k := label(mt, "route") + " " + label(mt, "method") + " " + label(mt, "status_class")
			out[k] = mt.GetHistogram().GetSampleCount()
		}
	}
	return out
}

func gather(t *testing.T, g prometheus.Gatherer, name string) []*dto.MetricFamily {
	t.Helper()
	mfs, err := g.Gather()
	require.NoError(t, err)
	var out []*dto.MetricFamily
	for _, mf := range mfs {
		if mf.GetName() == name {
			out = append(out, mf)
		}
	}
	return out
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// TestTenantCardinality drives every claim outcome, every write result,
// every result of a wait for the store share, orphans, reaped orphans and
// stored bytes for 10,000 tenants and counts the
// tenant-labelled series: they stay at (limit+1) × SeriesPerTenant, the
// figure the operating docs give, and the tenants past the limit are
// counted, not lost, under TenantOther.
func TestTenantCardinality(t *testing.T) {
	t.Parallel()
	const tenants = 10000
	reg := prometheus.NewPedanticRegistry()
	m := metrics.New(reg)
	actions := []idem.ClaimAction{idem.ActionCreate, idem.ActionReplay, idem.ActionTakeover, idem.ActionRecover}
	claimErrs := []error{idem.Errorf(idem.CodeRequestInFlight, "busy"), idem.ErrFingerprintMismatch, errors.New("boom"), context.Canceled}
	writeErrs := []error{nil, idem.Errorf(idem.CodeLeaseLost, "stale"), idem.Errorf(idem.CodeAlreadyCompleted, "done"), idem.Errorf(idem.CodeKeyNotFound, "gone"), errors.New("boom"), context.Canceled}
	now := time.Now()
	var stats []idem.OrphanStat
	var reaped []idem.Record
	var listed []idem.Tenant
	var windows []retrybudget.Stats
	m.RetryBudget(func() []retrybudget.Stats { return windows })
	for i := range tenants {
		id := fmt.Sprintf("t%05d", i)
		for _, a := range actions {
			m.ObserveClaim(id, a, nil)
		}
		for _, err := range claimErrs {
			m.ObserveClaim(id, 0, err)
		}
		for _, op := range []string{"checkpoint", "complete", "release"} {
			for _, err := range writeErrs {
				m.ObserveWrite(id, op, err)
			}
		}
		for _, err := range []error{nil, idem.StoreUnavailable("share", context.DeadlineExceeded), context.Canceled} {
			m.ObserveShareWait(id, err)
		}
		m.ObserveAttempt(id, retrybudget.First, false)
		for _, c := range retrybudget.Causes {
			m.ObserveAttempt(id, retrybudget.Attempt{Number: 2, Cause: c}, true)
		}
		windows = append(windows, retrybudget.Stats{Tenant: id, First: 10, Retries: 1, Refused: 1})
		// Tenant i has i+1 orphans: the last ones have the most.
		stats = append(stats, idem.OrphanStat{TenantID: id, Count: int64(i + 1), OldestLeaseExpiry: now.Add(-time.Duration(i) * time.Second), ObservedAt: now})
		reaped = append(reaped, idem.Record{TenantID: id, Key: "k", State: idem.StateInFlight, LeaseExpiresAt: now.Add(-time.Hour), ObservedAt: now})
		// ... and stores i bytes: the same ones store the most.
		listed = append(listed, idem.Tenant{ID: id, StoredBytes: int64(i), Settings: idem.DefaultSettings()})
	}
	m.SetOrphans(stats)
	m.SetStorage(listed)
	m.ObserveReaped(reaped)

	count := func() (series int, labels map[string]bool) {
		mfs, err := reg.Gather()
		require.NoError(t, err)
		labels = map[string]bool{}
		for _, mf := range mfs {
			for _, metric := range mf.GetMetric() {
				for _, lp := range metric.GetLabel() {
					if lp.GetName() == "tenant" {
						series++
						labels[lp.GetValue()] = true
					}
				}
			}
		}
		return series, labels
	}
	series, labels := count()
	t.Logf("%d tenants, limit %d: %d tenant-labelled series (%d per tenant label)", tenants, metrics.DefaultMaxTenants, series, metrics.SeriesPerTenant)
	require.Equal(t, 50, metrics.SeriesPerTenant)
	require.Equal(t, (metrics.DefaultMaxTenants+1)*metrics.SeriesPerTenant, series, "every outcome of 100 tenants plus (other)")
	require.Len(t, labels, 2*metrics.DefaultMaxTenants+1, "the first 100 tenants in the counters, the 100 with most orphans and stored bytes in the gauges, and (other)")
	require.True(t, labels["t00000"], "the first tenant seen keeps its counters")
	require.True(t, labels["t09999"], "the tenant with the most orphans has its own gauges")
	require.True(t, labels[metrics.TenantOther])

	// Nothing is lost: the (other) bucket holds the rest.
	rest := float64(tenants - metrics.DefaultMaxTenants)
	v, ok := seriesValue(t, reg, "idem_claims_total", map[string]string{"tenant": metrics.TenantOther, "outcome": "created"})
	require.True(t, ok)
	require.Equal(t, rest, v)
	var otherOrphans float64
	for i := range tenants - metrics.DefaultMaxTenants {
		otherOrphans += float64(i + 1)
	}
	require.Equal(t, otherOrphans, tenantValue(t, reg, "idem_orphans", metrics.TenantOther))
	require.Equal(t, float64(tenants-metrics.DefaultMaxTenants-1), tenantValue(t, reg, "idem_oldest_orphan_age_seconds", metrics.TenantOther), "the oldest orphan of them all")

	// Limit 0: every tenant shares (other).
	reg0 := prometheus.NewPedanticRegistry()
	m0 := metrics.New(reg0)
	m0.LimitTenants(0)
	m0.ObserveClaim("acme", idem.ActionCreate, nil)
	m0.SetOrphans(stats[:3])
	require.Equal(t, float64(6), tenantValue(t, reg0, "idem_orphans", metrics.TenantOther))
	mfs, err := reg0.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		for _, metric := range mf.GetMetric() {
			for _, lp := range metric.GetLabel() {
				if lp.GetName() == "tenant" {
					require.Equal(t, metrics.TenantOther, lp.GetValue(), mf.GetName())
				}
			}
		}
	}
}

func tenantValue(t *testing.T, reg *prometheus.Registry, name, tenant string) float64 {
	t.Helper()
	v, ok := seriesValue(t, reg, name, map[string]string{"tenant": tenant})
	require.True(t, ok, "no series %s{tenant=%q}", name, tenant)
	return v
}

func seriesValue(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) (float64, bool) {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, metric := range mf.GetMetric() {
			got := map[string]string{}
			for _, lp := range metric.GetLabel() {
				got[lp.GetName()] = lp.GetValue()
			}
			for k, v := range labels {
				if got[k] != v {
					continue next
				}
			}
			switch {
			case metric.GetCounter() != nil:
				return metric.GetCounter().GetValue(), true
			case metric.GetGauge() != nil:
				return metric.GetGauge().GetValue(), true
			}
		}
	}
	return 0, false
}

func TestBuildInfo(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewPedanticRegistry()
	metrics.New(reg)
	version, revision, goVersion := metrics.BuildInfo()
	require.NotEmpty(t, version)
	require.NotEmpty(t, revision)
	require.Equal(t, runtime.Version(), goVersion)
	v, ok := seriesValue(t, reg, "idem_build_info", map[string]string{"version": version, "revision": revision, "go_version": goVersion})
	require.True(t, ok)
	require.Equal(t, 1.0, v)
}

// TestBuildInfoFromLdflags: Version and Revision, set by make build's
// -ldflags -X, win over the Go build info. Not parallel: it sets the
// package's variables, which the parallel tests read.
func TestBuildInfoFromLdflags(t *testing.T) {
	oldV, oldR := metrics.Version, metrics.Revision
	t.Cleanup(func() { metrics.Version, metrics.Revision = oldV, oldR })
	metrics.Version, metrics.Revision = "v1.2.3", "0123abcd"
	reg := prometheus.NewPedanticRegistry()
	metrics.New(reg)
	v, ok := seriesValue(t, reg, "idem_build_info", map[string]string{"version": "v1.2.3", "revision": "0123abcd", "go_version": runtime.Version()})
	require.True(t, ok)
	require.Equal(t, 1.0, v)
}
