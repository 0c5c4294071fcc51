package idem

import (
	"context"
	"time"
)

// LedgerState is what a store's fencing token source says now, for telling
// that the database went back in time (see LedgerRollbacks).
type LedgerState struct {
	// SourceToken is the token source's value: PostgreSQL's fencing_tokens
	// sequence, SQLite's counter row. It only grows, so it is at least
	// every token the source ever issued — unless the database lost writes
	// (a failover to a standby that was behind, an older copy restored).
	SourceToken int64
	// OpenRollbacks counts the recorded rollbacks not yet acknowledged,
	// and OpenSeenToken is the highest token they name (0 when none).
	OpenRollbacks int
	OpenSeenToken int64
}

// LedgerRollback is one recorded rollback: a replica saw token SeenToken
// issued and later found the source at SourceToken, below it.
type LedgerRollback struct {
	ID          int64
	DetectedAt  time.Time
	Replica     string
	SeenToken   int64
	SourceToken int64
	// AcknowledgedAt and AcknowledgedBy are zero until an operator
	// acknowledged the rollback.
	AcknowledgedAt time.Time
	AcknowledgedBy string
}

// LedgerRollbacks is a driver's token source and record of rollbacks
// (Driver.Ledger; both backends keep one), by which the server tells that
// its database went back in time. The server keeps the
// highest token it has seen issued and compares it with LedgerState's
// SourceToken; a source below a token it issued is a database that lost
// acknowledged writes. The record of it lives in the database itself, so
// every replica, and a replica started later, stops too.
type LedgerRollbacks interface {
	// LedgerState reads the token source and the open rollbacks.
	LedgerState(ctx context.Context) (LedgerState, error)
	// RecordLedgerRollback writes a rollback record.
	RecordLedgerRollback(ctx context.Context, replica string, seen, source int64) (LedgerRollback, error)
	// AcknowledgeLedgerRollbacks marks every open rollback acknowledged by
	// by and, in the same transaction, moves the token source to at least
	// their highest SeenToken, so no token handed out before the rollback
	// is handed out again. It returns the rollbacks it acknowledged (none
	// when there were none) and the source's value after.
	AcknowledgeLedgerRollbacks(ctx context.Context, by string) ([]LedgerRollback, int64, error)
}
