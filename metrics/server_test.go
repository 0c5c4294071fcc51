package metrics_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem/server"
	"github.com/idem-dev/idem/testkit/servertest"
)

// TestRealServerMetrics drives the real server over HTTP and checks the
// values /metrics reports, and lints the whole exposition.
func TestRealServerMetrics(t *testing.T) {
	t.Parallel()
	srv := servertest.Start(t, servertest.Options{Tenants: []string{"acme"}})
	tok := srv.Token(t, "acme", "keys:write")

	call := func(path string, body any) (int, map[string]any) {
		t.Helper()
		b, err := json.Marshal(body)
		require.NoError(t, err)
		req, err := http.NewRequest(http.MethodPost, srv.URL()+path, bytes.NewReader(b))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+tok)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		var out map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&out)
		return resp.StatusCode, out
	}
	claim := map[string]any{"operation": "POST /v1/orders", "request": map[string]any{"n": 1}}
	st, c := call("/v1/keys/order-77/claim", claim)
	require.Equal(t, 201, st)
	st, _ = call("/v1/keys/order-77/claim", claim)
	require.Equal(t, 409, st)
	st, _ = call("/v1/keys/order-77/claim", map[string]any{"operation": "POST /v1/orders", "request": map[string]any{"n": 2}})
	require.Equal(t, 422, st)
	complete := map[string]any{"fencing_token": c["fencing_token"], "response": map[string]any{"status": 201, "body": "{}"}}
	st, _ = call("/v1/keys/order-77/complete", complete)
	require.Equal(t, 200, st)
	st, _ = call("/v1/keys/order-77/claim", claim)
	require.Equal(t, 200, st)
	stale := map[string]any{"fencing_token": 1 << 40, "response": map[string]any{"status": 201, "body": "{}"}}
	st, _ = call("/v1/keys/order-77/complete", stale)
	require.Equal(t, 409, st)

	resp, err := http.Get(srv.URL() + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode)
	text, err := io.ReadAll(resp.Body)
	require.NoError(t, err)

	value := func(series string) string {
		m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\S+)$`).FindSubmatch(text)
		if m == nil {
			return ""
		}
		return string(m[1])
	}
	require.Equal(t, "1", value(`idem_claims_total{outcome="created",tenant="acme"}`))
	require.Equal(t, "1", value(`idem_claims_total{outcome="in_flight",tenant="acme"}`))
	require.Equal(t, "1", value(`idem_claims_total{outcome="mismatch",tenant="acme"}`))
	require.Equal(t, "1", value(`idem_claims_total{outcome="replayed",tenant="acme"}`))
	require.Equal(t, "1", value(`idem_key_writes_total{op="complete",result="ok",tenant="acme"}`))
	require.Equal(t, "1", value(`idem_key_writes_total{op="complete",result="lease_lost",tenant="acme"}`))
	require.Equal(t, "2", value(`idem_http_request_duration_seconds_count{method="POST",route="/v1/keys/{key}/claim",status_class="2xx"}`))
	require.Equal(t, "2", value(`idem_http_request_duration_seconds_count{method="POST",route="/v1/keys/{key}/claim",status_class="4xx"}`))
	// Every claim reaches the store: created and replayed succeed, the
	// in-flight and mismatch answers are the store's rejections.
	require.Equal(t, "2", value(`idem_store_operation_duration_seconds_count{op="claim",result="ok"}`))
	require.Equal(t, "2", value(`idem_store_operation_duration_seconds_count{op="claim",result="rejected"}`))
	require.NotEmpty(t, value(`idem_db_pool_open_connections`))
	require.Regexp(t, `(?m)^go_goroutines `, string(text))
	require.Regexp(t, `(?m)^process_cpu_seconds_total `, string(text))
	require.NotContains(t, string(text), "order-77", "keys must never become label values")

	problems, err := promlint.New(bytes.NewReader(text)).Lint()
	require.NoError(t, err)
	require.Empty(t, problems)
}

// TestSeparateMetricsAddr: with IDEM_METRICS_ADDR the real server serves
// /metrics only there (with idem_build_info and idem_ready), the public
// address answers 404 for it, and the metrics address serves nothing else.
func TestSeparateMetricsAddr(t *testing.T) {
	t.Parallel()
	srv := servertest.Start(t, servertest.Options{Configure: func(c *server.Config) { c.MetricsAddr = "127.0.0.1:0" }})
	get := func(url string) (int, string) {
		t.Helper()
		resp, err := http.Get(url)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(b)
	}
	metricsURL := srv.Server().MetricsURL()
	require.NotEqual(t, srv.URL(), metricsURL)

	st, _ := get(srv.URL() + "/metrics")
	require.Equal(t, http.StatusNotFound, st, "the public address must not serve /metrics")
	st, _ = get(srv.URL() + "/healthz")
	require.Equal(t, http.StatusOK, st)

	st, body := get(metricsURL + "/metrics")
	require.Equal(t, http.StatusOK, st)
	require.Regexp(t, `(?m)^idem_build_info\{go_version="go[^"]+",revision="[^"]+",version="[^"]+"\} 1$`, body)
	require.Regexp(t, `(?m)^idem_ready 1$`, body)
	require.Regexp(t, `(?m)^idem_http_request_duration_seconds_count\{method="GET",route="other",status_class="4xx"\} 1$`, body, "the refused public request is counted as an unknown route")
	for _, path := range []string{"/healthz", "/v1/tenant", "/dashboard/"} {
		st, _ = get(metricsURL + path)
		require.Equal(t, http.StatusNotFound, st, path)
	}

	// Without the setting /metrics stays on the public address.
	plain := servertest.Start(t, servertest.Options{})
	require.Equal(t, plain.URL(), plain.Server().MetricsURL())
	st, _ = get(plain.URL() + "/metrics")
	require.Equal(t, http.StatusOK, st)
}
