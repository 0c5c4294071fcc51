package server

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/metrics"
)

// durabilityEvery is how often the store's durability is read again: a
// standby that leaves or a setting changed shows on the metric and in
// the log within it.
const durabilityEvery = time.Minute

// durabilityWatch reports what the store's database guarantees for an
// acknowledged write (single node, a synchronous standby, asynchronous
// replicas only): in the log at start and on each change — a warning when
// standbys exist but none is synchronous, since a failover to one of them
// may lose acknowledged writes — and on idem_store_durability.
type durabilityWatch struct {
	src     idem.Driver
	timeout time.Duration
	logger  *slog.Logger

	mu   sync.Mutex
	mode string // "" until read once
}

// newDurabilityWatch reads the durability of store once (bounded by
// IDEM_STORE_TIMEOUT; a failure is logged and retried by Run) and
// registers the metric; nil for a store that cannot say.
func newDurabilityWatch(ctx context.Context, store idem.Driver, cfg Config, logger *slog.Logger, reg prometheus.Registerer) *durabilityWatch {
	d := &durabilityWatch{src: store, timeout: cfg.StoreTimeout, logger: logger}
	metrics.RegisterDurability(reg, idem.DurabilityModes, d.current)
	d.check(ctx)
	return d
}

func (d *durabilityWatch) current() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.mode
}

// check reads the durability and logs it when it changed.
func (d *durabilityWatch) check(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, d.timeout)
	defer cancel()
	got, err := d.src.Durability(ctx)
	if err != nil {
		d.logger.Debug("read the store's durability", "error", err)
		return
	}
	d.mu.Lock()
	changed := got.Mode != d.mode
	d.mode = got.Mode
	d.mu.Unlock()
	if !changed {
		return
	}
	attrs := []any{"mode", got.Mode, "standbys", got.Standbys, "sync_standbys", got.SyncStandbys,
		"synchronous_commit", got.SynchronousCommit, "synchronous_standby_names", got.SynchronousStandbyNames}
	switch got.Mode {
	case idem.DurabilityAsynchronous:
		d.logger.Warn("store durability: standbys exist but none is synchronous: a failover to one may lose acknowledged writes "+
			"(keys completed would run again); require a synchronous standby (operating docs, High availability)", attrs...)
	case idem.DurabilityUnknown:
		d.logger.Warn("store durability: the database role may not see its standbys' state (grant pg_read_all_stats)", append(attrs, "hidden", got.Hidden)...)
	default:
		d.logger.Info("store durability", attrs...)
	}
}

// watchStore runs the store's watchers — the ledger rollback check and
// the durability report — until ctx is done.
func (s *Server) watchStore(ctx context.Context) error {
	var wg sync.WaitGroup
	if s.ledger != nil {
		wg.Add(1)
		go func() { defer wg.Done(); _ = s.ledger.Run(ctx, s.cfg.LedgerCheckInterval) }()
	}
	if s.durability != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := time.NewTicker(durabilityEvery)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
					s.durability.check(ctx)
				}
			}
		}()
	}
	wg.Wait()
	return ctx.Err()
}
