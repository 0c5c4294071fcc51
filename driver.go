package idem

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// Driver is a Store as a backend opens it, with the capabilities the rest
// of the server builds on, asked for by method (River's style) rather than
// found by type assertion: a wrapper (storemw) that forwards the Store
// methods then cannot hide a capability by forgetting to forward it, and a
// new backend learns from the compiler what it must provide. Both backends
// implement every capability; the methods still say what an absent one
// looks like, so a test double can leave one out.
type Driver interface {
	Store

	// Webhooks returns the driver's webhook outbox and delivery log, or
	// nil when it keeps none (the server then refuses to start).
	Webhooks() WebhookStore
	// Completers returns the driver's completer side (completer.go), or
	// nil when it has none (the server then runs no completer).
	Completers() CompleterStore
	// KeyEvents returns the driver's notification source for claims
	// waiting on a key in flight, or nil when it has none (claims then
	// answer request_in_flight at once).
	KeyEvents() KeyEvents
	// PoolStats is a snapshot of the driver's connection pool, for the
	// idem_db_pool_* metrics and the tenant share's size; MaxConns 0 when
	// the pool has no bound, which turns the share off.
	PoolStats() PoolStats
	// SerialWrites reports whether the driver's writes take turns on a
	// single writer and wait for their turn without holding a connection
	// (SQLite), while its reads run beside the writer on the other
	// connections. The tenant share then gives a tenant's writes a share
	// of their own, so they cannot keep its reads from the connections.
	SerialWrites() bool
	// Ledger returns the driver's token source and its record of ledger
	// rollbacks (ledger.go), or nil when it cannot tell that its database
	// went back in time (the server then runs without the check).
	Ledger() LedgerRollbacks
	// Durability reports what the database guarantees for an acknowledged
	// write (durability.go); a driver that cannot tell answers
	// DurabilityUnknown.
	Durability(ctx context.Context) (Durability, error)
	// Listener returns the driver's listening connection of key events
	// when it has one that can be lost and come back (PostgreSQL's
	// LISTEN), so the server gives it its logger and counts its
	// reconnections; nil when it has none (SQLite's are in-process).
	Listener() Listener
}

// Listener is a driver's listening connection of key events
// (Driver.Listener).
type Listener interface {
	// SetLogger gives it the logger its losses and returns are logged to.
	SetLogger(*slog.Logger)
	// ListenReconnects counts its reconnections since the driver opened.
	ListenReconnects() int64
}

// PoolStats is a snapshot of a driver's connection pool (Driver.PoolStats).
// Both backends report the same fields, so the idem_db_pool_* metrics and
// the dashboards built on them need not care which store runs.
type PoolStats struct {
	// MaxConns is the most connections the pool may open (0 = unlimited).
	MaxConns int64
	// OpenConns counts the connections open, in use or idle.
	OpenConns int64
	// InUseConns and IdleConns split OpenConns.
	InUseConns int64
	IdleConns  int64
	// Waits counts the acquisitions that had to wait for a connection, and
	// WaitTime is how long they waited in total.
	Waits    int64
	WaitTime time.Duration
}

// KeyEvents is a driver's notification source (Driver.KeyEvents): it tells
// the claims that wait on a key in flight that the key may have changed —
// completed, released or deleted — so they claim again at once instead of
// polling.
//
// Events are hints, never decisions: a woken waiter claims again and the
// store decides, so a spurious or repeated event costs one claim, and a
// source that lost track (a dropped listening connection) wakes every
// waiter rather than risk missing one.
type KeyEvents interface {
	// Subscribe registers interest in (tenantID, key). It returns once the
	// subscription is live: a change committed after Subscribe returns is
	// signalled on the Subscription, by this replica or any other sharing
	// the database. It returns a store_unavailable *Error when the source
	// cannot listen now (the caller then answers without waiting).
	Subscribe(ctx context.Context, tenantID, key string) (*Subscription, error)

	// Watch asks that the next completion or deletion of (tenantID, key)
	// be signalled, and reports whether the key is in flight now. A
	// waiter calls it after a claim found the key in flight and sleeps
	// only when it reports true: a change committed after Watch returns
	// true is signalled to the subscriptions live at that moment. When it
	// reports false the key changed meanwhile and the waiter claims again
	// at once. (PostgreSQL flags the row, since it notifies only for
	// flagged rows; SQLite publishes every change and only reports true.)
	Watch(ctx context.Context, tenantID, key string) (bool, error)
}

// Subscription is one waiter's interest in one key. C receives a value
// (coalesced: at most one pending) whenever the key may have changed.
// Close it when done; closing twice is harmless.
type Subscription struct {
	// C is signalled when the key may have changed.
	C <-chan struct{}

	close func()
	once  sync.Once
}

// NewSubscription returns a Subscription signalled on c whose Close calls
// close once. It is for the sources that implement KeyEvents
// (keyevents.Broadcast), which own c and the bookkeeping close undoes.
func NewSubscription(c <-chan struct{}, close func()) *Subscription {
	return &Subscription{C: c, close: close}
}

// Close ends the subscription at once.
func (s *Subscription) Close() {
	s.once.Do(s.close)
}
