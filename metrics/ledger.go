package metrics

import "github.com/prometheus/client_golang/prometheus"

// RegisterLedgerRollback registers the metrics of the rollback check
// (server's ledger guard) and returns the counter the guard increments on
// each rollback it finds itself:
//
//   - idem_ledger_rollback_detected: 1 while this replica refuses key
//     writes because the database went back in time (found here or
//     recorded by another replica, not yet acknowledged), 0 otherwise;
//   - idem_ledger_rollback_detections_total: the rollbacks this replica
//     found: the token source below a token it had seen issued.
//
// Either one is a page: acknowledged writes are gone, and keys completed
// before would run again if idem took claims.
func RegisterLedgerRollback(reg prometheus.Registerer, stopped func() bool) prometheus.Counter {
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: Namespace, Name: "ledger_rollback_detected",
		Help: "1 while this replica refuses key writes because the database went back in time (the fencing token source below a token already issued; acknowledge with `ledger acknowledge-rollback`), 0 otherwise.",
	}, func() float64 {
		if stopped() {
			return 1
		}
		return 0
	}))
	detections := prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: Namespace, Name: "ledger_rollback_detections_total",
		Help: "Times this replica found the database gone back in time: the fencing token source below a token it had seen issued.",
	})
	reg.MustRegister(detections)
	return detections
}

// RegisterDurability registers idem_store_durability{mode}: 1 for the
// mode the store's database was last seen in (single_node, synchronous,
// asynchronous, unknown), 0 for the others; all 0 until it was read.
func RegisterDurability(reg prometheus.Registerer, modes []string, current func() string) {
	for _, mode := range modes {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: Namespace, Name: "store_durability",
			Help:        "1 for what the store's database guarantees for an acknowledged write (single_node, synchronous: a synchronous standby confirms commits, asynchronous: standbys exist but none is synchronous, unknown: the role may not see them), 0 for the others.",
			ConstLabels: prometheus.Labels{"mode": mode},
		}, func() float64 {
			if current() == mode {
				return 1
			}
			return 0
		}))
	}
}

// RegisterOutages registers the store outage counters and returns them:
// idem_store_outages_total (outages begun: a store call found the store
// unavailable after one that did not) and idem_store_outage_seconds_total
// (the length of the outages ended).
func RegisterOutages(reg prometheus.Registerer) (outages, seconds prometheus.Counter) {
	outages = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: Namespace, Name: "store_outages_total",
		Help: "Store outages this replica saw begin: a key write, readiness or ledger check found the store unavailable after one that did not.",
	})
	seconds = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: Namespace, Name: "store_outage_seconds_total",
		Help: "Total length in seconds of the store outages this replica saw end.",
	})
	reg.MustRegister(outages, seconds)
	return outages, seconds
}

// RegisterListenReconnects registers idem_key_events_reconnects_total:
// how many times the store's listening connection (PostgreSQL
// LISTEN/NOTIFY, which wakes waiting claims) was lost and listened again.
func RegisterListenReconnects(reg prometheus.Registerer, reconnects func() int64) {
	reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Namespace: Namespace, Name: "key_events_reconnects_total",
		Help: "Times the store's listening connection (PostgreSQL LISTEN, which wakes waiting claims) was lost and listened again; every waiting claim is woken then.",
	}, func() float64 { return float64(reconnects()) }))
}
