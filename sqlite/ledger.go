package sqlite

import (
	"context"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/sqlite/internal/dbsqlc"
)

var _ idem.LedgerRollbacks = (*Store)(nil)

// LedgerState implements idem.LedgerRollbacks: the fencing counter row and
// the open rollbacks, in one statement. It is a read: it takes no writer
// slot, so the periodic check never queues behind the writes.
func (s *Store) LedgerState(ctx context.Context) (idem.LedgerState, error) {
	if err := s.checkFile("read the fencing token source"); err != nil {
		return idem.LedgerState{}, err
	}
	row, err := s.q.LedgerState(ctx)
	if err != nil {
		return idem.LedgerState{}, s.interpretError(err, "read the fencing token source")
	}
	return idem.LedgerState{SourceToken: row.SourceToken, OpenRollbacks: int(row.OpenRollbacks), OpenSeenToken: row.OpenSeenToken}, nil
}

// RecordLedgerRollback implements idem.LedgerRollbacks.
func (s *Store) RecordLedgerRollback(ctx context.Context, replica string, seen, source int64) (idem.LedgerRollback, error) {
	var out idem.LedgerRollback
	err := s.inTx(ctx, "record a ledger rollback", func(q *dbsqlc.Queries, now time.Time) error {
		row, err := q.InsertLedgerRollback(ctx, dbsqlc.InsertLedgerRollbackParams{
			DetectedAt: micros(now), Replica: replica, SeenToken: seen, SourceToken: source,
		})
		out = rollbackFromRow(row)
		return err
	})
	return out, err
}

// AcknowledgeLedgerRollbacks implements idem.LedgerRollbacks, in one
// transaction with the counter's move.
func (s *Store) AcknowledgeLedgerRollbacks(ctx context.Context, by string) ([]idem.LedgerRollback, int64, error) {
	var acked []idem.LedgerRollback
	var source int64
	err := s.inTx(ctx, "acknowledge ledger rollbacks", func(q *dbsqlc.Queries, now time.Time) error {
		rows, err := q.AcknowledgeLedgerRollbacks(ctx, dbsqlc.AcknowledgeLedgerRollbacksParams{AcknowledgedAt: microsPtr(now), AcknowledgedBy: &by})
		if err != nil {
			return err
		}
		var seen int64
		for _, r := range rows {
			acked = append(acked, rollbackFromRow(r))
			seen = max(seen, r.SeenToken)
		}
		source, err = q.AdvanceFencingCounter(ctx, seen)
		return err
	})
	if err != nil {
		return nil, 0, err
	}
	return acked, source, nil
}

func rollbackFromRow(r dbsqlc.LedgerRollback) idem.LedgerRollback {
	out := idem.LedgerRollback{
		ID: r.ID, DetectedAt: timeOf(r.DetectedAt), Replica: r.Replica,
		SeenToken: r.SeenToken, SourceToken: r.SourceToken, AcknowledgedAt: timeOrZero(r.AcknowledgedAt),
	}
	if r.AcknowledgedBy != nil {
		out.AcknowledgedBy = *r.AcknowledgedBy
	}
	return out
}
