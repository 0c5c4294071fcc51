package postgres

import (
	"context"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/postgres/internal/dbsqlc"
)

var _ idem.LedgerRollbacks = (*Store)(nil)

// LedgerState implements idem.LedgerRollbacks: the fencing_tokens
// sequence's last value (not transactional: every nextval already
// returned counts) and the open rollbacks, in one statement.
func (s *Store) LedgerState(ctx context.Context) (idem.LedgerState, error) {
	row, err := s.q.LedgerState(ctx)
	if err != nil {
		return idem.LedgerState{}, s.interpretError(err, "read the fencing token source")
	}
	return idem.LedgerState{SourceToken: row.SourceToken, OpenRollbacks: int(row.OpenRollbacks), OpenSeenToken: row.OpenSeenToken}, nil
}

// RecordLedgerRollback implements idem.LedgerRollbacks.
func (s *Store) RecordLedgerRollback(ctx context.Context, replica string, seen, source int64) (idem.LedgerRollback, error) {
	row, err := s.q.InsertLedgerRollback(ctx, dbsqlc.InsertLedgerRollbackParams{
		DetectedAt: s.clock(), Replica: replica, SeenToken: seen, SourceToken: source,
	})
	if err != nil {
		return idem.LedgerRollback{}, s.interpretError(err, "record a ledger rollback")
	}
	return rollbackFromRow(row), nil
}

// AcknowledgeLedgerRollbacks implements idem.LedgerRollbacks. The sequence
// moves with setval, which is not transactional: it stays moved if the
// acknowledgement fails after it, which only skips tokens.
func (s *Store) AcknowledgeLedgerRollbacks(ctx context.Context, by string) ([]idem.LedgerRollback, int64, error) {
	var acked []idem.LedgerRollback
	var source int64
	err := s.inTx(ctx, "acknowledge ledger rollbacks", func(q *dbsqlc.Queries) error {
		rows, err := q.AcknowledgeLedgerRollbacks(ctx, dbsqlc.AcknowledgeLedgerRollbacksParams{AcknowledgedAt: s.clock(), AcknowledgedBy: by})
		if err != nil {
			return err
		}
		var seen int64
		for _, r := range rows {
			acked = append(acked, rollbackFromRow(r))
			seen = max(seen, r.SeenToken)
		}
		if len(rows) == 0 {
			st, err := q.LedgerState(ctx)
			source = st.SourceToken
			return err
		}
		source, err = q.AdvanceFencingTokens(ctx, seen)
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
		SeenToken: r.SeenToken, SourceToken: r.SourceToken, AcknowledgedAt: timeOf(r.AcknowledgedAt),
	}
	if r.AcknowledgedBy != nil {
		out.AcknowledgedBy = *r.AcknowledgedBy
	}
	return out
}
