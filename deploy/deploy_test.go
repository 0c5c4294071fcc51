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
	"github.com/idem-dev/idem/metrics"
	"github.com/idem-dev/idem/sqlite"
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
	store := metrics.InstrumentStore(raw, m)
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
	// The panels the issue asks for.
	for _, want := range []string{
		"idem_orphans", "idem_oldest_orphan_age_seconds", "idem_claims_total",
		"histogram_quantile(0.5, sum by (le, route) (rate(idem_http_request_duration_seconds_bucket",
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
	require.Contains(t, alerts["IdemOrphansOlderThanLeaseMax"], "idem_oldest_orphan_age_seconds")
	require.Contains(t, alerts["IdemStoreUnavailable"], `result="unavailable"`)
	require.Contains(t, alerts["IdemNotReady"], "readyz")
	require.Contains(t, alerts["IdemHighMismatchRate"], `outcome="mismatch"`)
	require.Contains(t, alerts["IdemReaperStalled"], "idem_reaper_last_success_timestamp_seconds")
}
