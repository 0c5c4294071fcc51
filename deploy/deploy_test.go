// Package deploy_test checks the Grafana dashboard and the Prometheus alert
// rules under deploy/ against the metrics the real metrics package exports.
package deploy_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/gateway"
	"github.com/idem-dev/idem/metrics"
	"github.com/idem-dev/idem/sqlite"
	"github.com/idem-dev/idem/storemw"
)

// exportedNames exercises every part of the metrics package on a fresh
// registry, over a real SQLite store and real HTTP requests, and returns
// the names of every series it exposes (histograms with their _bucket,
// _sum and _count series).
func exportedNames(t *testing.T) map[string]bool {
	t.Helper()
	ctx := context.Background()
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)

	raw, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "idem.db"), sqlite.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = raw.Close() })
	m.RegisterPool(reg, raw.PoolStats)
	metrics.RegisterReadiness(reg, raw.Ping)
	metrics.RegisterLedgerRollback(reg, func() bool { return false })
	metrics.RegisterDurability(reg, idem.DurabilityModes, func() string { return idem.DurabilitySingleNode })
	metrics.RegisterOutages(reg)
	metrics.RegisterListenReconnects(reg, func() int64 { return 0 })
	store := storemw.Wrap(raw, storemw.Options{Metrics: m})
	_, err = store.CreateTenant(ctx, idem.CreateTenantParams{ID: "acme", Name: "acme", Settings: idem.DefaultSettings()})
	require.NoError(t, err)
	_, err = store.Claim(ctx, idem.ClaimParams{TenantID: "acme", Key: "k", Operation: "op", Fingerprint: "fp",
		Lease: time.Second, ReplayWindow: time.Hour, ReaperThreshold: time.Hour})
	require.NoError(t, err)
	_, err = store.GetRecord(ctx, idem.GetRecordParams{TenantID: "acme", Key: "missing"})
	require.ErrorIs(t, err, idem.ErrKeyNotFound)

	m.ObserveClaim("acme", idem.ActionCreate, nil)
	m.ObserveClaim("acme", 0, idem.ErrFingerprintMismatch)
	m.ObserveWrite("acme", "complete", nil)
	now := time.Now()
	m.SetOrphans([]idem.OrphanStat{{TenantID: "acme", Count: 1, OldestLeaseExpiry: now.Add(-time.Minute), ObservedAt: now}})
	m.ObserveReaped([]idem.Record{{TenantID: "acme", Key: "o", State: idem.StateInFlight, LeaseExpiresAt: now.Add(-time.Hour), ObservedAt: now}})
	tenants, err := store.ListTenants(ctx)
	require.NoError(t, err)
	m.SetStorage(tenants)
	m.ObserveReaperRun(nil)
	m.ObserveReaperRun(errors.New("x"))

	r := chi.NewRouter()
	r.Use(m.Middleware)
	r.Get("/healthz", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	srv := httptest.NewServer(r)
	t.Cleanup(srv.Close)
	resp, err := srv.Client().Get(srv.URL + "/healthz")
	require.NoError(t, err)
	_ = resp.Body.Close()

	mfs, err := reg.Gather()
	require.NoError(t, err)
	names := map[string]bool{}
	for _, mf := range mfs {
		n := mf.GetName()
		names[n] = true
		if mf.GetType() == dto.MetricType_HISTOGRAM {
			names[n+"_bucket"], names[n+"_sum"], names[n+"_count"] = true, true, true
		}
	}
	return names
}

var metricRef = regexp.MustCompile(`\bidem_[a-z0-9_]+\b`)

func referenced(text string) []string {
	refs := metricRef.FindAllString(text, -1)
	slices.Sort(refs)
	return slices.Compact(refs)
}

func TestDashboardAndAlertsUseExportedMetrics(t *testing.T) {
	t.Parallel()
	names := exportedNames(t)
	for _, want := range []string{
		"idem_claims_total", "idem_key_writes_total", "idem_orphans", "idem_oldest_orphan_age_seconds",
		"idem_reaper_deleted_total", "idem_reaper_orphans_deleted_total", "idem_http_request_duration_seconds",
		"idem_store_operation_duration_seconds", "idem_db_pool_in_use_connections", "go_goroutines", "process_cpu_seconds_total",
	} {
		require.True(t, names[want], "metrics package does not export %s", want)
	}

	// The gateway's metrics, described by its real constructor (the
	// histograms with their series suffixes).
	described := registeredNames(t)
	for n := range described {
		if strings.HasPrefix(n, "idem_gateway_") {
			names[n] = true
			names[n+"_bucket"], names[n+"_sum"], names[n+"_count"] = true, true, true
		}
	}
	for _, file := range []string{"grafana/idem-dashboard.json", "prometheus/alerts.yml"} {
		raw, err := os.ReadFile(file)
		require.NoError(t, err)
		refs := referenced(string(raw))
		require.NotEmpty(t, refs, file)
		for _, ref := range refs {
			require.True(t, names[ref], "%s references %s, which the metrics package does not export", file, ref)
		}
	}
}

func TestGrafanaDashboardShape(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("grafana/idem-dashboard.json")
	require.NoError(t, err)
	var dash struct {
		Title  string `json:"title"`
		UID    string `json:"uid"`
		Panels []struct {
			ID      int    `json:"id"`
			Title   string `json:"title"`
			Type    string `json:"type"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	require.NoError(t, json.Unmarshal(raw, &dash))
	require.NotEmpty(t, dash.Title)
	require.NotEmpty(t, dash.UID)

	ids := map[int]bool{}
	var exprs []string
	for _, p := range dash.Panels {
		require.False(t, ids[p.ID], "duplicate panel id %d", p.ID)
		ids[p.ID] = true
		if p.Type == "row" {
			continue
		}
		require.NotEmpty(t, p.Targets, "panel %q has no query", p.Title)
		for _, tg := range p.Targets {
			require.NotEmpty(t, strings.TrimSpace(tg.Expr), "panel %q has an empty query", p.Title)
			require.Equal(t, strings.Count(tg.Expr, "("), strings.Count(tg.Expr, ")"), "unbalanced parentheses in %q", tg.Expr)
			exprs = append(exprs, tg.Expr)
		}
	}
	all := strings.Join(exprs, "\n")
	// HTTP latency panels show the API only: static routes (/docs/*,
	// /dashboard/*), /metrics and health checks would drown it.
	for _, e := range exprs {
		if strings.Contains(e, "idem_http_request_duration_seconds_bucket") {
			require.Contains(t, e, `idem_http_request_duration_seconds_bucket{route=~"/v1/.*"}`, "a latency panel includes non-API routes")
		}
	}
	// Panels for what the service exports beside the core: readiness,
	// builds, the gateway.
	for _, want := range []string{"idem_ready", "idem_build_info", "idem_gateway_requests_total", "idem_gateway_added_seconds_bucket", `result="lease_lost"`} {
		require.Contains(t, all, want)
	}
	// The panels the issue asks for.
	for _, want := range []string{
		"idem_orphans", "idem_oldest_orphan_age_seconds", "idem_claims_total",
		"histogram_quantile(0.5, sum by (le, route) (rate(idem_http_request_duration_seconds_bucket{route=~\"/v1/.*\"}",
		"histogram_quantile(0.95, sum by (le, route)", "histogram_quantile(0.99, sum by (le, route)",
		"idem_reaper_deleted_total", "idem_store_operation_duration_seconds_bucket",
	} {
		require.Contains(t, all, want)
	}
}

func TestAlertRulesShape(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("prometheus/alerts.yml")
	require.NoError(t, err)
	var rules struct {
		Groups []struct {
			Name  string `yaml:"name"`
			Rules []struct {
				Alert       string            `yaml:"alert"`
				Expr        string            `yaml:"expr"`
				For         string            `yaml:"for"`
				Labels      map[string]string `yaml:"labels"`
				Annotations map[string]string `yaml:"annotations"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	require.NoError(t, yaml.Unmarshal(raw, &rules))
	require.NotEmpty(t, rules.Groups)
	alerts := map[string]string{}
	for _, g := range rules.Groups {
		require.NotEmpty(t, g.Name)
		for _, r := range g.Rules {
			require.NotEmpty(t, r.Alert)
			require.NotEmpty(t, strings.TrimSpace(r.Expr), r.Alert)
			require.Equal(t, strings.Count(r.Expr, "("), strings.Count(r.Expr, ")"), "unbalanced parentheses in %s", r.Alert)
			require.Contains(t, []string{"warning", "critical"}, r.Labels["severity"], r.Alert)
			require.NotEmpty(t, r.Annotations["summary"], r.Alert)
			if r.For != "" {
				_, err := time.ParseDuration(r.For)
				require.NoError(t, err, r.Alert)
			}
			alerts[r.Alert] = r.Expr
		}
	}
	require.Contains(t, alerts["IdemOrphansAging"], "idem_oldest_orphan_age_seconds")
	require.Contains(t, alerts["IdemStoreUnavailable"], `result="unavailable"`)
	require.Contains(t, alerts["IdemNotReady"], "idem_ready", "it must be able to fire on what the compose stack scrapes")
	require.Contains(t, alerts["IdemHighMismatchRate"], `outcome="mismatch"`)
	require.Contains(t, alerts["IdemReaperStalled"], "idem_reaper_last_success_timestamp_seconds")
	require.Contains(t, alerts["IdemHigh5xxRate"], `status_class="5xx"`)
	require.Contains(t, alerts["IdemHighLatency"], "histogram_quantile")
	require.Contains(t, alerts["IdemLeaseLostSpike"], `result="lease_lost"`)

	// The operating docs name every alert, and the thresholds the docs give
	// are the rules' thresholds.
	docs, err := os.ReadFile("../web/docs/operating/index.html")
	require.NoError(t, err)
	for name := range alerts {
		require.Contains(t, string(docs), "<code>"+name+"</code>", "the operating docs do not describe alert %s", name)
	}
	for _, c := range []struct{ alert, expr, doc string }{
		{"IdemOrphansAging", "> 900", "more than 900 s (15 minutes) ago"},
		{"IdemReaperStalled", "> 600", "No successful reaper pass for more than 600 s"},
		{"IdemOrphanWatchStalled", "> 300", "No successful orphan watch for more than 300 s"},
		{"IdemHigh5xxRate", "> 0.01", "More than 1% of API requests"},
		{"IdemHighLatency", "> 0.5", "above 500 ms"},
		{"IdemLeaseLostSpike", "> 0.2", "more than 0.2 times per second"},
	} {
		require.Contains(t, alerts[c.alert], c.expr, c.alert)
		require.Contains(t, string(docs), c.doc, c.alert)
	}
}

// TestAlertRulesPromtool runs the unit tests of the alert rules with
// promtool (Debian's prometheus package, installed by
// scripts/install-test-deps) and checks that every alert is shown firing
// by at least one test. Without promtool it fails under make test
// (IDEM_REQUIRE_PROMTOOL=1) and skips elsewhere.
func TestAlertRulesPromtool(t *testing.T) {
	t.Parallel()
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("IDEM_REQUIRE_PROMTOOL") != "" {
			t.Fatalf("promtool not found (IDEM_REQUIRE_PROMTOOL is set): run scripts/install-test-deps (Debian package prometheus)")
		}
		t.Skip("promtool not found; install Debian's prometheus package (scripts/install-test-deps)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, args := range [][]string{
		{"check", "rules", "prometheus/alerts.yml"},
		{"test", "rules", "prometheus/alerts_test.yml"},
	} {
		out, err := exec.CommandContext(ctx, promtool, args...).CombinedOutput()
		require.NoError(t, err, "promtool %s:\n%s", strings.Join(args, " "), out)
	}

	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert string `yaml:"alert"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	raw, err := os.ReadFile("prometheus/alerts.yml")
	require.NoError(t, err)
	require.NoError(t, yaml.Unmarshal(raw, &rules))
	var tests struct {
		RuleFiles []string `yaml:"rule_files"`
		Tests     []struct {
			AlertRuleTest []struct {
				Alertname string           `yaml:"alertname"`
				ExpAlerts []map[string]any `yaml:"exp_alerts"`
			} `yaml:"alert_rule_test"`
		} `yaml:"tests"`
	}
	raw, err = os.ReadFile("prometheus/alerts_test.yml")
	require.NoError(t, err)
	require.NoError(t, yaml.Unmarshal(raw, &tests))
	require.Equal(t, []string{"alerts.yml"}, tests.RuleFiles, "the tests must load the shipped rules")
	fires := map[string]bool{}
	for _, tc := range tests.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				fires[a.Alertname] = true
			}
		}
	}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			require.True(t, fires[r.Alert], "no promtool test shows alert %s firing (prometheus/alerts_test.yml)", r.Alert)
		}
	}
}

// metricNames records the names of the metrics described by the collectors
// registered on it, whether or not they have series yet.
type metricNames map[string]bool

var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

func (n metricNames) Register(c prometheus.Collector) error {
	ch := make(chan *prometheus.Desc)
	go func() { c.Describe(ch); close(ch) }()
	for d := range ch {
		if m := fqName.FindStringSubmatch(d.String()); m != nil {
			n[m[1]] = true
		}
	}
	return nil
}

func (n metricNames) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		_ = n.Register(c)
	}
}

func (n metricNames) Unregister(prometheus.Collector) bool { return true }

// registeredNames returns the name of every metric the service and the
// gateway register: the service's metrics, the pool, the readiness gauge
// and the gateway's.
func registeredNames(t *testing.T) metricNames {
	t.Helper()
	ctx := context.Background()
	names := metricNames{}
	m := metrics.New(names)
	raw, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "idem.db"), sqlite.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = raw.Close() })
	m.RegisterPool(names, raw.PoolStats)
	metrics.RegisterReadiness(names, raw.Ping)
	metrics.RegisterLedgerRollback(names, func() bool { return false })
	metrics.RegisterDurability(names, idem.DurabilityModes, func() string { return idem.DurabilitySingleNode })
	metrics.RegisterOutages(names)
	metrics.RegisterListenReconnects(names, func() int64 { return 0 })
	_, err = gateway.New(gateway.Options{Store: raw, Tenant: "acme", Upstream: "http://127.0.0.1:1", Registerer: names})
	require.NoError(t, err)
	return names
}

// TestEveryMetricIsDocumented registers everything that exports metrics —
// the service's metrics, the pool, the readiness gauge and the gateway —
// and requires each idem_ name in the operating docs' metrics table.
func TestEveryMetricIsDocumented(t *testing.T) {
	t.Parallel()
	names := registeredNames(t)
	docs, err := os.ReadFile("../web/docs/operating/index.html")
	require.NoError(t, err)
	var idem []string
	for n := range names {
		if strings.HasPrefix(n, "idem_") {
			idem = append(idem, n)
		}
	}
	slices.Sort(idem)
	require.Contains(t, idem, "idem_db_pool_wait_seconds_total")
	require.Contains(t, idem, "idem_gateway_requests_total")
	require.Contains(t, idem, "idem_build_info")
	for _, n := range idem {
		require.Contains(t, string(docs), "<td><code>"+n+"</code></td>", "metric %s is not in the metrics table of web/docs/operating/index.html", n)
	}
}
