// Package storemw is the store middleware: the store deadline, the tenant
// share of the database connections and the store metrics, put around a
// driver once, in one order, by Wrap. The server and the gateway both wrap
// their driver with it, so every call they make — the API's, the
// gateway's, the background jobs', the webhook side's — goes through the
// same layers in the same order.
package storemw

import (
	"context"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/metrics"
)

// Options say which layers Wrap puts around a driver; the zero value puts
// none.
type Options struct {
	// Timeout bounds every call (WithDeadline; IDEM_STORE_TIMEOUT), the
	// wait for the tenant's share included. 0 sets no deadline.
	Timeout time.Duration
	// TenantShare is the part of the driver's pool each tenant's calls may
	// always have (WithTenantShare, StoreShareOf; IDEM_DB_TENANT_SHARE).
	// 0, a share of the whole pool (1), or a driver whose pool has no
	// bound holds no tenant to a share.
	TenantShare float64
	// Metrics, when not nil, times every call
	// (idem_store_operation_duration_seconds, Instrument) and counts the
	// calls that waited for their tenant's share
	// (idem_tenant_store_share_waits_total).
	Metrics *metrics.Metrics
}

// Wrap puts the store middleware around d, in this order from the caller
// inwards:
//
//	metrics → deadline → tenant share → driver
//
// The metrics are outermost so that they time what the caller waited —
// the wait for the tenant's share included — and count a call that ran
// out of time as unavailable, after the deadline made it
// store_unavailable, rather than as whatever error the driver gave. The
// deadline is outside the share so that it bounds the wait for the share
// as well as the call: a tenant whose calls are stuck makes its next call
// wait at most the store deadline. The share is innermost, next to the
// connections it apportions.
//
// The webhook side (Driver.Webhooks) gets the same layers in the same
// order, sharing the tenant's slots with its other calls: they hold the
// same connections. The other capabilities (KeyEvents, PoolStats,
// SerialWrites) are the driver's own: a waiter's subscription is not a
// store call, and the pool is the driver's.
func Wrap(d idem.Driver, o Options) *Store {
	var s idem.Store = d
	var ws idem.WebhookStore
	if w := d.Webhooks(); w != nil {
		ws = w
	}
	if pool := int(d.PoolStats().MaxConns); pool > 0 && o.TenantShare > 0 {
		var observe func(string, error)
		if o.Metrics != nil {
			observe = o.Metrics.ObserveShareWait
		}
		s = WithTenantShare(s, pool, StoreShareOf(pool, o.TenantShare), d.SerialWrites(), observe)
		if ws != nil {
			ws = WebhooksWithTenantShare(s, ws)
		}
	}
	s = WithDeadline(s, o.Timeout)
	s = Instrument(s, o.Metrics)
	if ws != nil {
		ws = InstrumentWebhooks(WebhookWithDeadline(ws, o.Timeout), o.Metrics)
	}
	return &Store{Store: s, driver: d, webhooks: ws}
}

// Store is a driver wrapped by Wrap. It is an idem.Driver itself, so a
// front end given one (the gateway on the server's store, in tests) finds
// the capabilities where it finds them on a bare driver; wrapping it again
// adds the layers again.
type Store struct {
	// Store is the wrapped calls; Close closes the driver.
	idem.Store
	driver   idem.Driver
	webhooks idem.WebhookStore
}

var _ idem.Driver = (*Store)(nil)

// Webhooks returns the driver's webhook side, wrapped like its other
// calls (nil when the driver keeps none).
func (s *Store) Webhooks() idem.WebhookStore { return s.webhooks }

// Completers returns the driver's completer side unwrapped: the completer
// job bounds each of its calls itself (jobs.CompleterConfig.StoreTimeout),
// and its picks are no tenant's request to share out.
func (s *Store) Completers() idem.CompleterStore { return s.driver.Completers() }

// KeyEvents returns the driver's own notification source: its Subscribe
// and Watch are not held to the deadline or the share (the claims a
// waiter makes are).
func (s *Store) KeyEvents() idem.KeyEvents { return s.driver.KeyEvents() }

// PoolStats returns the driver's pool statistics.
func (s *Store) PoolStats() idem.PoolStats { return s.driver.PoolStats() }

// SerialWrites reports the driver's.
func (s *Store) SerialWrites() bool { return s.driver.SerialWrites() }

// Ledger returns the driver's token source and rollback record: the ledger
// guard reads it on a schedule of its own and bounds each read itself.
func (s *Store) Ledger() idem.LedgerRollbacks { return s.driver.Ledger() }

// Listener returns the driver's listening connection of key events.
func (s *Store) Listener() idem.Listener { return s.driver.Listener() }

// Durability reports the driver's, bounded by ctx (the server's watch
// gives each read the store deadline).
func (s *Store) Durability(ctx context.Context) (idem.Durability, error) {
	return s.driver.Durability(ctx)
}
