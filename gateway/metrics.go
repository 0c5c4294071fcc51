package gateway

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idem-dev/idem/client/frontdoor"
)

// gatewayMetrics are the per-route metrics of the gateway, all prefixed
// idem_gateway_.
type gatewayMetrics struct {
	requests      *prometheus.CounterVec
	upstream      *prometheus.HistogramVec
	added         *prometheus.HistogramVec
	storeFailures *prometheus.CounterVec
}

// newMetrics registers the gateway's metrics on reg (none when nil);
// inflight reads the request body and answer bytes held against the budget.
func newMetrics(reg prometheus.Registerer, inflight func() int64, cache func() frontdoor.ReplayCacheStats) *gatewayMetrics {
	buckets := []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}
	m := &gatewayMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "idem", Subsystem: "gateway", Name: "requests_total",
			Help: "Requests through the gateway by route pattern, outcome (passthrough, executed, takeover, replayed, not_replayable, in_flight, mismatch, refused, busy, store_unavailable, fail_open, upstream_unavailable, upstream_timeout, canceled) and status class.",
		}, []string{"route", "outcome", "status"}),
		upstream: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "idem", Subsystem: "gateway", Name: "upstream_seconds",
			Help: "Time the upstream took to answer (headers and the buffered body), by route.", Buckets: buckets,
		}, []string{"route"}),
		added: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "idem", Subsystem: "gateway", Name: "added_seconds",
			Help: "Time the gateway added to a request (total minus upstream time), by route and outcome.", Buckets: buckets,
		}, []string{"route", "outcome"}),
		storeFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "idem", Subsystem: "gateway", Name: "store_failures_total",
			Help: "Store writes that failed after the upstream was called (complete, release, renew), each attempt counted; a failed complete is tried again while the store is unavailable.",
		}, []string{"op"}),
	}
	if reg != nil {
		reg.MustRegister(m.requests, m.upstream, m.added, m.storeFailures,
			prometheus.NewGaugeFunc(prometheus.GaugeOpts(gatewayOpts("request_body_bytes_in_flight",
				"Protected request body bytes (each body counted 4 times its size) and answer bytes (the most each may store) held against the gateway's in-flight budget (IDEM_MAX_INFLIGHT_BYTES); past the budget requests get 503 server_busy.")), func() float64 { return float64(inflight()) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts(gatewayOpts("replay_cache_hits_total",
				"Replays answered from the gateway's replay cache, without a store call (counted in requests_total as replayed too). Starts again at a configuration reload.")), func() float64 { return float64(cache().Hits) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts(gatewayOpts("replay_cache_misses_total",
				"Protected requests the replay cache could not answer (no entry of exactly that request, or expired): claimed in the store. Starts again at a configuration reload.")), func() float64 { return float64(cache().Misses) }),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts(gatewayOpts("replay_cache_entries",
				"Completed answers held in the replay cache.")), func() float64 { return float64(cache().Entries) }),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts(gatewayOpts("replay_cache_bytes",
				"Bytes the replay cache's entries hold (bounded by replay_cache.max_bytes).")), func() float64 { return float64(cache().Bytes) }))
	}
	return m
}

// gatewayOpts names a metric idem_gateway_<name>.
func gatewayOpts(name, help string) prometheus.Opts {
	return prometheus.Opts{Namespace: "idem", Subsystem: "gateway", Name: name, Help: help}
}

func (m *gatewayMetrics) observe(x *exchange) {
	m.requests.WithLabelValues(x.route, x.outcome, statusClass(x.status)).Inc()
	if x.upstream > 0 {
		m.upstream.WithLabelValues(x.route).Observe(x.upstream.Seconds())
	}
	total := time.Since(x.start)
	m.added.WithLabelValues(x.route, x.outcome).Observe(max(total-x.upstream, 0).Seconds())
}

func statusClass(s int) string {
	switch {
	case s >= 500:
		return "5xx"
	case s >= 400:
		return "4xx"
	case s >= 300:
		return "3xx"
	case s >= 200:
		return "2xx"
	}
	return "1xx"
}
