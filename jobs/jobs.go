// Package jobs runs the service's background work: the reaper, which
// deletes records past their purge time in bounded batches and logs every
// orphan it deletes, and the orphan watch, which keeps the per-tenant orphan
// count and oldest-orphan age gauges of package metrics current. (The
// dashboard reads orphans from the API, not from here.)
//
// Both are safe with several replicas running at once: the store guarantees
// that concurrent Reap calls never delete the same record twice, and that
// concurrent orphan watches report (key.orphaned webhook) each orphan once.
package jobs

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/internal/defaults"
	"github.com/idem-dev/idem/metrics"
)

// Defaults used for zero Config fields.
const (
	DefaultReapInterval        = 30 * time.Second
	DefaultReapBatchSize       = 500
	DefaultReapPause           = 2.0
	DefaultOrphanWatchInterval = 15 * time.Second
)

// Config tunes the background jobs. Zero fields take the defaults, but for
// ReapPause. It is server.Config.Jobs as it is: the settings IDEM_REAP_* and
// IDEM_ORPHAN_WATCH_INTERVAL.
type Config struct {
	// ReapInterval is the pause between reaper passes.
	ReapInterval time.Duration
	// ReapBatchSize bounds how many records one Store.Reap call deletes, so
	// a backlog never holds a large lock; a pass repeats batches until one
	// comes back short.
	ReapBatchSize int
	// ReapPause paces a pass through a backlog: after each full batch the
	// reaper rests ReapPause times as long as that batch took before it
	// starts the next, so it keeps its database connection (and the
	// database's CPU and WAL) busy at most 1/(1+ReapPause) of the time and
	// a large purge cannot crowd out the claims and completes on the hot
	// path. The pause follows the batch's own time, so it shrinks on a
	// fast database and grows on a loaded one. 0 (or below) turns pacing
	// off: batches back to back, for draining a backlog fast in a quiet
	// hour (IDEM_REAP_PAUSE=0). The server starts from DefaultReapPause.
	ReapPause float64
	// OrphanWatchInterval is the pause between orphan watches.
	OrphanWatchInterval time.Duration
}

func (c Config) withDefaults() Config {
	defaults.Set(&c.ReapInterval, DefaultReapInterval)
	defaults.Set(&c.ReapBatchSize, DefaultReapBatchSize)
	defaults.Set(&c.OrphanWatchInterval, DefaultOrphanWatchInterval)
	return c
}

// Runner runs the reaper and the orphan watch.
type Runner struct {
	store  idem.Driver
	cfg    Config
	logger *slog.Logger
	m      *metrics.Metrics
	// now and sleep time the reaper's batches and pause between them;
	// tests replace them.
	now   func() time.Time
	sleep func(context.Context, time.Duration)
}

// New returns a Runner over store. The orphan watch queues key.orphaned
// through the store's webhook outbox and sets the completer's gauges from
// its completer side, where the store has them. logger nil discards logs;
// m nil records no metrics.
func New(store idem.Driver, cfg Config, logger *slog.Logger, m *metrics.Metrics) *Runner {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Runner{
		store:  store,
		cfg:    cfg.withDefaults(),
		logger: logger.With("component", "jobs"),
		m:      m,
		now:    time.Now,
		sleep:  sleepCtx,
	}
}

// sleepCtx waits for d or until ctx is done.
func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// Config returns the runner's configuration with defaults applied.
func (r *Runner) Config() Config { return r.cfg }

// Run runs the reaper and the orphan watch, each once right away and then
// on its interval, until ctx is done. Failures of a pass are logged and
// counted, never fatal. It returns nil once ctx is done and both loops have
// stopped.
func (r *Runner) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	wg.Go(func() {
		loop(ctx, r.cfg.ReapInterval, func() {
			if _, err := r.ReapOnce(ctx); err != nil && ctx.Err() == nil {
				r.logger.Error("reaper pass failed", "err", err)
			}
		})
	})
	wg.Go(func() {
		loop(ctx, r.cfg.OrphanWatchInterval, func() {
			if err := r.WatchOnce(ctx); err != nil && ctx.Err() == nil {
				r.logger.Error("orphan watch failed", "err", err)
			}
		})
	})
	wg.Wait()
	return nil
}

func loop(ctx context.Context, every time.Duration, f func()) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		if ctx.Err() != nil {
			return
		}
		f()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// ReapResult summarises one reaper pass.
type ReapResult struct {
	// Deleted is the number of records deleted.
	Deleted int
	// Orphans is the number of deleted records that were orphans.
	Orphans int
	// Batches is the number of Store.Reap calls made.
	Batches int
	// ByState counts the deleted records by API state at deletion.
	ByState map[idem.State]int
}

// ReapOnce runs one reaper pass: Store.Reap in batches of ReapBatchSize
// until a batch comes back short, resting after each full batch as
// Config.ReapPause says. Every deleted orphan is logged at warn
// level with tenant, key, operation, attempt, recovery_point, age (time
// since its lease expired) and created_at. It returns what it deleted so
// far together with any error.
func (r *Runner) ReapOnce(ctx context.Context) (ReapResult, error) {
	res := ReapResult{ByState: map[idem.State]int{}}
	for {
		if err := ctx.Err(); err != nil {
			// Shutting down is not a failed pass.
			return res, fmt.Errorf("reap: %w", err)
		}
		start := r.now()
		batch, err := r.store.Reap(ctx, idem.ReapParams{Limit: r.cfg.ReapBatchSize})
		took := r.now().Sub(start)
		res.Batches++
		if err != nil {
			if ctx.Err() == nil {
				r.m.ObserveReaperRun(err)
			}
			return res, fmt.Errorf("reap batch %d: %w", res.Batches, err)
		}
		r.m.ObserveReaped(batch)
		for _, rec := range batch {
			state := rec.APIState()
			res.ByState[state]++
			res.Deleted++
			if state == idem.StateOrphaned {
				res.Orphans++
				r.logOrphan(ctx, rec)
			}
		}
		if len(batch) < r.cfg.ReapBatchSize {
			break
		}
		if r.cfg.ReapPause > 0 {
			r.sleep(ctx, time.Duration(float64(took)*r.cfg.ReapPause))
		}
	}
	r.m.ObserveReaperRun(nil)
	if res.Deleted > 0 {
		r.logger.Info("reaper pass", "deleted", res.Deleted, "orphans", res.Orphans, "batches", res.Batches)
	}
	return res, nil
}

func (r *Runner) logOrphan(ctx context.Context, rec idem.Record) {
	r.logger.LogAttrs(ctx, slog.LevelWarn, "reaper deleted orphan",
		slog.String("tenant", rec.TenantID),
		slog.String("key", rec.Key),
		slog.String("operation", rec.Operation),
		slog.Int("attempt", rec.Attempt),
		slog.String("recovery_point", rec.RecoveryPoint),
		slog.Duration("age", max(rec.ObservedAt.Sub(rec.LeaseExpiresAt), 0)),
		slog.Time("lease_expired_at", rec.LeaseExpiresAt),
		slog.Time("created_at", rec.CreatedAt),
	)
}

// orphanEventBatch bounds the orphans one EmitOrphanEvents call reports.
const orphanEventBatch = 500

// WatchOnce reads Store.OrphanStats and sets the orphan gauges from it, the
// storage gauges from Store.ListTenants, the completer's gauges
// (idem_orphans_by_state) from CompletionStats, and when the store keeps a
// webhook outbox, queues key.orphaned for every orphan not
// yet reported for its current fencing token (each is reported once: the
// store marks the record in the transaction that queues the event).
func (r *Runner) WatchOnce(ctx context.Context) error {
	stats, err := r.store.OrphanStats(ctx)
	if err != nil {
		return fmt.Errorf("orphan stats: %w", err)
	}
	r.m.SetOrphans(stats)
	// The storage gauges ride on the same watch: one read of every tenant
	// with its usage (a sum of its counter rows), however many records.
	tenants, err := r.store.ListTenants(ctx)
	if err != nil {
		return fmt.Errorf("list tenants: %w", err)
	}
	r.m.SetStorage(tenants)
	if cs := r.store.Completers(); cs != nil {
		cstats, err := cs.CompletionStats(ctx)
		if err != nil {
			return fmt.Errorf("completion stats: %w", err)
		}
		r.m.SetCompletions(cstats)
	}
	ws := r.store.Webhooks()
	if ws == nil {
		return nil
	}
	for {
		n, err := ws.EmitOrphanEvents(ctx, idem.EmitOrphanEventsParams{Limit: orphanEventBatch})
		if err != nil {
			return fmt.Errorf("emit orphan events: %w", err)
		}
		if n < orphanEventBatch {
			return nil
		}
	}
}
