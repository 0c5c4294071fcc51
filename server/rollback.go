package server

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/metrics"
)

// errLedgerRolledBack is what every key write and the readiness check
// answer while the guard has stopped the replica.
var errLedgerRolledBack = &idem.Error{
	Code: idem.CodeStoreUnavailable,
	Detail: "the ledger's database went back in time and lost acknowledged writes (a failover to a standby that was behind, " +
		"or an older copy restored); idem takes no key writes until an operator acknowledges it",
	RetryAfter: 30 * time.Second,
}

// ledgerGuard stops the replica when the database went back in time.
//
// Fencing tokens come from one source that only grows (PostgreSQL's
// fencing_tokens sequence, SQLite's counter row), so the source's value is
// always at least every token it issued. The guard keeps the highest token
// this replica has seen a claim return (an atomic max, so claims that
// return out of order change nothing) and reads the source every
// IDEM_LEDGER_CHECK_INTERVAL, and before the first claim or readiness
// check after the store was unreachable (the pool reconnecting after a
// failover): a source below a token it issued is a database that lost
// acknowledged writes. Comparing each new token with the highest seen
// would not do: two concurrent claims on one replica may return their
// tokens in either order.
//
// On finding it the guard stops at once (key writes and GET /readyz answer
// 503 store_unavailable), logs it at error level, counts it and writes a
// ledger_rollbacks row into the database it found rolled back, so every
// other replica, and this one after a restart, stops too. The row stays
// open until an operator runs `ledger acknowledge-rollback`, which also
// moves the source past every token the rows name; the guard then finds
// the source at or above what it has seen, and no open row, and takes
// writes again.
//
// Its limits: a replica that saw none of the lost tokens (started after
// the rollback) cannot tell alone; PostgreSQL logs a sequence 32 values
// ahead in its WAL, so a standby that missed fewer than about 32 tokens
// comes back with its sequence above them, and such a small loss goes
// unseen (its tokens are not issued again); claims between the rollback
// and the next check (one interval, when no connection broke) are taken.
type ledgerGuard struct {
	idem.Driver
	src     idem.LedgerRollbacks
	replica string
	timeout time.Duration
	logger  *slog.Logger
	// detections counts the rollbacks this replica found itself.
	detections prometheus.Counter
	// outage logs and counts the store's outages from the calls passed.
	outage *outageLog

	// seen is the highest fencing token this replica has seen issued.
	seen atomic.Int64
	// stopped is set while the replica refuses key writes.
	stopped atomic.Bool
	// suspect is set when the store was unreachable since the last check
	// (and before the first): the next claim or ping checks first. fails
	// counts the calls that found it unreachable, so a check clears
	// suspect only if none failed after it began.
	suspect atomic.Bool
	fails   atomic.Int64
	// turn serialises checks, a slot of one: a request waiting for its
	// turn (behind a check the frozen store keeps waiting) still ends when
	// its caller goes away. found is the seen token of the rollback this
	// replica found last (0 none), so one rollback is counted once.
	turn  chan struct{}
	found int64
}

// newLedgerGuard wraps store with the rollback check of src, and registers
// its metrics on reg.
func newLedgerGuard(store idem.Driver, src idem.LedgerRollbacks, cfg Config, logger *slog.Logger, reg prometheus.Registerer) *ledgerGuard {
	g := &ledgerGuard{Driver: store, turn: make(chan struct{}, 1), src: src, replica: replicaName(cfg), timeout: cfg.StoreTimeout, logger: logger}
	g.suspect.Store(true)
	g.detections = metrics.RegisterLedgerRollback(reg, g.stopped.Load)
	g.outage = newOutageLog(logger, reg)
	return g
}

// replicaName names this replica in a rollback record: host, process and
// listen address.
func replicaName(cfg Config) string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown-host"
	}
	return fmt.Sprintf("%s pid %d %s", host, os.Getpid(), cfg.Addr)
}

// Run checks every interval until ctx is done.
func (g *ledgerGuard) Run(ctx context.Context, interval time.Duration) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			if err := g.check(ctx); err != nil && ctx.Err() == nil {
				g.logger.Debug("ledger rollback check: the store does not answer", "error", err)
			}
		}
	}
}

// observe raises the highest token seen to token.
func (g *ledgerGuard) observe(token int64) {
	for {
		cur := g.seen.Load()
		if token <= cur || g.seen.CompareAndSwap(cur, token) {
			return
		}
	}
}

// check reads the token source and the open rollbacks and sets stopped.
// On an error it changes nothing but marks the store suspect.
func (g *ledgerGuard) check(ctx context.Context) error {
	select {
	case g.turn <- struct{}{}:
	case <-ctx.Done():
		g.suspect.Store(true)
		return idem.StoreUnavailable("the ledger check did not get its turn", ctx.Err())
	}
	defer func() { <-g.turn }()
	ctx, cancel := context.WithTimeout(ctx, g.timeout)
	defer cancel()
	// The highest token seen is read before the source: every token seen
	// by then was issued before the read, so the source is at least it.
	// Read after, it could hold a token issued after the read.
	seen := g.seen.Load()
	fails := g.fails.Load()
	st, err := g.src.LedgerState(ctx)
	g.outage.observe(err)
	if err != nil {
		g.suspect.Store(true)
		return err
	}
	was := g.stopped.Load()
	if st.SourceToken < seen && st.OpenSeenToken < seen {
		g.stopped.Store(true)
		if g.found != seen {
			g.found = seen
			g.detections.Inc()
			g.logger.Error("LEDGER ROLLBACK DETECTED: the database went back in time and lost acknowledged writes; "+
				"refusing key writes (503 store_unavailable) until an operator checks and runs `ledger acknowledge-rollback --yes`",
				"seen_token", seen, "source_token", st.SourceToken, "tokens_lost", seen-st.SourceToken, "replica", g.replica)
		}
		rec, err := g.src.RecordLedgerRollback(ctx, g.replica, seen, st.SourceToken)
		if err != nil {
			g.suspect.Store(true)
			return fmt.Errorf("record the ledger rollback: %w", err)
		}
		g.logger.Error("ledger rollback recorded in the database: every replica refuses key writes until it is acknowledged",
			"rollback_id", rec.ID, "seen_token", rec.SeenToken, "source_token", rec.SourceToken)
		g.clearSuspect(fails)
		return nil
	}
	stop := st.SourceToken < seen || st.OpenRollbacks > 0
	g.stopped.Store(stop)
	g.clearSuspect(fails)
	switch {
	case stop && !was:
		g.logger.Error("the database records a ledger rollback not yet acknowledged: refusing key writes (503 store_unavailable) "+
			"until an operator runs `ledger acknowledge-rollback --yes`",
			"open_rollbacks", st.OpenRollbacks, "seen_token", seen, "source_token", st.SourceToken)
	case !stop && was:
		g.logger.Warn("ledger rollback acknowledged: taking key writes again", "source_token", st.SourceToken, "seen_token", seen)
	}
	return nil
}

// clearSuspect clears suspect after a check that began when fails calls
// had failed, unless one failed since: its store may have come back
// rolled back after the check's read.
func (g *ledgerGuard) clearSuspect(fails int64) {
	if g.fails.Load() != fails {
		return
	}
	g.suspect.Store(false)
	if g.fails.Load() != fails {
		g.suspect.Store(true)
	}
}

// admit runs the check first when the store is suspect, and refuses while
// stopped.
func (g *ledgerGuard) admit(ctx context.Context) error {
	if g.suspect.Load() {
		if err := g.check(ctx); err != nil {
			if idem.ErrorCode(err) == idem.CodeStoreUnavailable {
				return err
			}
			return idem.StoreUnavailable("the store does not answer", err)
		}
	}
	if g.stopped.Load() {
		return errLedgerRolledBack
	}
	return nil
}

// after marks the store suspect when a call found it unreachable, and
// tells the outage log.
func (g *ledgerGuard) after(err error) {
	g.outage.observe(err)
	if idem.ErrorCode(err) == idem.CodeStoreUnavailable {
		g.fails.Add(1)
		g.suspect.Store(true)
	}
}

// refuse is admit for the writes that issue no token: no check first, only
// the stop.
func (g *ledgerGuard) refuse() error {
	if g.stopped.Load() {
		return errLedgerRolledBack
	}
	return nil
}

// Claim implements idem.Store: checked first after an outage, refused
// while stopped; the token it returns raises the highest seen.
func (g *ledgerGuard) Claim(ctx context.Context, p idem.ClaimParams) (idem.ClaimResult, error) {
	if err := g.admit(ctx); err != nil {
		return idem.ClaimResult{}, err
	}
	res, err := g.Driver.Claim(ctx, p)
	g.after(err)
	if err == nil {
		g.observe(res.Record.FencingToken)
	}
	return res, err
}

// Checkpoint implements idem.Store, refused while stopped.
func (g *ledgerGuard) Checkpoint(ctx context.Context, p idem.CheckpointParams) (idem.Record, error) {
	if err := g.refuse(); err != nil {
		return idem.Record{}, err
	}
	rec, err := g.Driver.Checkpoint(ctx, p)
	g.after(err)
	return rec, err
}

// Complete implements idem.Store, refused while stopped.
func (g *ledgerGuard) Complete(ctx context.Context, p idem.CompleteParams) (idem.Record, error) {
	if err := g.refuse(); err != nil {
		return idem.Record{}, err
	}
	rec, err := g.Driver.Complete(ctx, p)
	g.after(err)
	return rec, err
}

// Release implements idem.Store, refused while stopped.
func (g *ledgerGuard) Release(ctx context.Context, p idem.ReleaseParams) error {
	if err := g.refuse(); err != nil {
		return err
	}
	err := g.Driver.Release(ctx, p)
	g.after(err)
	return err
}

// Resolve implements idem.Store: checked first after an outage, refused
// while stopped (a resolution may issue a token).
func (g *ledgerGuard) Resolve(ctx context.Context, p idem.ResolveParams) (idem.Resolution, error) {
	if err := g.admit(ctx); err != nil {
		return idem.Resolution{}, err
	}
	res, err := g.Driver.Resolve(ctx, p)
	g.after(err)
	if err == nil {
		g.observe(res.Audit.NewFencingToken)
	}
	return res, err
}

// Ping implements idem.Store: GET /readyz is 503 while stopped, and the
// first ping after an outage runs the check.
func (g *ledgerGuard) Ping(ctx context.Context) error {
	err := g.Driver.Ping(ctx)
	g.after(err)
	if err != nil {
		return err
	}
	return g.admit(ctx)
}

// LedgerStopped reports whether the replica refuses key writes because the
// database went back in time.
func (s *Server) LedgerStopped() bool { return s.ledger != nil && s.ledger.stopped.Load() }

// AcknowledgeLedgerRollback is `ledger acknowledge-rollback`: on the store
// named by cfg it marks every open rollback acknowledged by by and moves
// the token source past every token they name, so the replicas take
// writes again at their next check. It returns the rollbacks acknowledged
// and the source's value after.
func AcknowledgeLedgerRollback(ctx context.Context, store idem.Driver, by string) ([]idem.LedgerRollback, int64, error) {
	src := store.Ledger()
	if src == nil {
		return nil, 0, fmt.Errorf("this store keeps no ledger rollback records")
	}
	return src.AcknowledgeLedgerRollbacks(ctx, by)
}
