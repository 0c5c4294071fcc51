package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idem-dev/idem"
)

// Database pool metrics, shared by both backends so dashboards need not
// care which one runs:
//
//	idem_db_pool_max_connections        gauge    configured maximum (0 = unlimited for database/sql)
//	idem_db_pool_open_connections       gauge    connections open (in use + idle)
//	idem_db_pool_in_use_connections     gauge    connections handed out
//	idem_db_pool_idle_connections       gauge    idle connections
//	idem_db_pool_waits_total            counter  acquisitions that had to wait for a connection
//	idem_db_pool_wait_seconds_total     counter  total time spent waiting for a connection
type poolSnapshot struct {
	max, open, inUse, idle float64
	waits, waitSeconds     float64
}

type poolCollector struct {
	snap                                   func() poolSnapshot
	max, open, inUse, idle, waits, waitSec *prometheus.Desc
}

func newPoolCollector(snap func() poolSnapshot) *poolCollector {
	d := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName(Namespace, "db_pool", name), help, nil, nil)
	}
	return &poolCollector{
		snap:    snap,
		max:     d("max_connections", "Maximum number of connections the pool may open (0 = unlimited)."),
		open:    d("open_connections", "Connections currently open, in use or idle."),
		inUse:   d("in_use_connections", "Connections currently in use."),
		idle:    d("idle_connections", "Connections currently idle."),
		waits:   d("waits_total", "Connection acquisitions that had to wait because the pool was exhausted."),
		waitSec: d("wait_seconds_total", "Total time spent waiting for a connection."),
	}
}

// Describe implements prometheus.Collector.
func (c *poolCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.max, c.open, c.inUse, c.idle, c.waits, c.waitSec} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *poolCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.snap()
	ch <- prometheus.MustNewConstMetric(c.max, prometheus.GaugeValue, s.max)
	ch <- prometheus.MustNewConstMetric(c.open, prometheus.GaugeValue, s.open)
	ch <- prometheus.MustNewConstMetric(c.inUse, prometheus.GaugeValue, s.inUse)
	ch <- prometheus.MustNewConstMetric(c.idle, prometheus.GaugeValue, s.idle)
	ch <- prometheus.MustNewConstMetric(c.waits, prometheus.CounterValue, s.waits)
	ch <- prometheus.MustNewConstMetric(c.waitSec, prometheus.CounterValue, s.waitSeconds)
}

// RegisterPool registers the idem_db_pool_* metrics of a store's pool on
// reg; stats is usually an idem.Driver's PoolStats. A nil
// m or stats registers nothing.
func (m *Metrics) RegisterPool(reg prometheus.Registerer, stats func() idem.PoolStats) {
	if m == nil || stats == nil {
		return
	}
	reg.MustRegister(newPoolCollector(func() poolSnapshot {
		s := stats()
		return poolSnapshot{
			max:         float64(s.MaxConns),
			open:        float64(s.OpenConns),
			inUse:       float64(s.InUseConns),
			idle:        float64(s.IdleConns),
			waits:       float64(s.Waits),
			waitSeconds: s.WaitTime.Seconds(),
		}
	}))
}
