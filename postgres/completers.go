package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/postgres/internal/dbsqlc"
)

var _ idem.CompleterStore = (*Store)(nil)

// Completers returns the store itself: it keeps the completers and their
// records in the ledger's database.
func (s *Store) Completers() idem.CompleterStore { return s }

func completerFromRow(r dbsqlc.Completer) idem.Completer {
	return idem.Completer{
		TenantID: r.TenantID, ID: r.ID, URL: r.Url, Secret: r.Secret,
		OperationPattern: r.OperationPattern, CreatedAt: timeOf(r.CreatedAt),
	}
}

// CreateCompleter stores a tenant's completer.
func (s *Store) CreateCompleter(ctx context.Context, c idem.Completer) (idem.Completer, error) {
	var out idem.Completer
	err := s.inTx(ctx, "create completer", func(q *dbsqlc.Queries) error {
		// The tenant's row lock puts creates of one tenant one after the
		// other, so each counts the completers the one before created.
		if _, err := q.LockTenantEndpoints(ctx, c.TenantID); errors.Is(err, pgx.ErrNoRows) {
			return idem.TenantUnknown(c.TenantID, err)
		} else if err != nil {
			return err
		}
		row, err := q.CreateCompleter(ctx, dbsqlc.CreateCompleterParams{
			TenantID: c.TenantID, ID: c.ID, Url: c.URL, Secret: c.Secret,
			OperationPattern: c.OperationPattern, Now: s.clock(), MaxCompleters: idem.MaxCompleters,
		})
		if errors.Is(err, pgx.ErrNoRows) {
			return idem.CompleterLimitReached()
		}
		if err != nil {
			return err
		}
		out = completerFromRow(row)
		return nil
	})
	return out, err
}

// GetCompleter reads one completer.
func (s *Store) GetCompleter(ctx context.Context, p idem.GetCompleterParams) (idem.Completer, error) {
	row, err := s.q.GetCompleter(ctx, dbsqlc.GetCompleterParams{TenantID: p.TenantID, ID: p.ID})
	if errors.Is(err, pgx.ErrNoRows) {
		return idem.Completer{}, idem.CompleterNotFound(p.ID)
	}
	if err != nil {
		return idem.Completer{}, s.interpretError(err, "get completer")
	}
	return completerFromRow(row), nil
}

// ListCompleters lists a tenant's completers, oldest first.
func (s *Store) ListCompleters(ctx context.Context, p idem.ListCompletersParams) ([]idem.Completer, error) {
	rows, err := s.q.ListCompleters(ctx, p.TenantID)
	if err != nil {
		return nil, s.interpretError(err, "list completers")
	}
	return fromRows(rows, completerFromRow), nil
}

// DeleteCompleter deletes one completer.
func (s *Store) DeleteCompleter(ctx context.Context, p idem.DeleteCompleterParams) error {
	n, err := s.q.DeleteCompleter(ctx, dbsqlc.DeleteCompleterParams{TenantID: p.TenantID, ID: p.ID})
	if err != nil {
		return s.interpretError(err, "delete completer")
	}
	if n == 0 {
		return idem.CompleterNotFound(p.ID)
	}
	return nil
}

// PickCompletions takes records over for the completer in one statement
// (PickCompletions in db/queries/postgres/completers.sql: FOR UPDATE SKIP
// LOCKED), then reads the completers of their tenants.
func (s *Store) PickCompletions(ctx context.Context, p idem.PickCompletionsParams) ([]idem.PickedCompletion, error) {
	rows, err := s.q.PickCompletions(ctx, dbsqlc.PickCompletionsParams{
		LeaseUs: micros(p.Lease), DeadlineUs: micros(p.Deadline), RowLimit: int32(p.Limit), Now: s.clock(),
		PerTenant: int64(p.PerTenantLimit()), SkipTenants: append([]string{}, p.SkipTenants...),
	})
	if err != nil {
		return nil, s.interpretError(err, "pick completions")
	}
	out := make([]idem.PickedCompletion, 0, len(rows))
	completers := map[string][]idem.Completer{}
	for _, r := range rows {
		rec, err := recordFromRow(r.IdempotencyKey, r.ObservedAt)
		if err != nil {
			return nil, err
		}
		cs, ok := completers[rec.TenantID]
		if !ok {
			// A failure here leaves the records taken: each goes back to
			// the completer once its lease ran out, as a dead replica's.
			if cs, err = s.ListCompleters(ctx, idem.ListCompletersParams{TenantID: rec.TenantID}); err != nil {
				return nil, err
			}
			completers[rec.TenantID] = cs
		}
		pc := idem.PickedCompletion{Record: rec}
		pc.Completer, pc.Matched = idem.PickCompleter(cs, rec.Operation)
		out = append(out, pc)
	}
	return out, nil
}

// FinishCompletion applies one attempt's outcome and its audit entry in
// one transaction: share the tenant's row, lock the record's, check, write
// (as Resolve does).
func (s *Store) FinishCompletion(ctx context.Context, p idem.FinishCompletionParams) (idem.Record, error) {
	if err := p.Validate(); err != nil {
		return idem.Record{}, err
	}
	var rec idem.Record
	err := s.inTx(ctx, "finish completion", func(q *dbsqlc.Queries) error {
		if _, err := q.ShareTenant(ctx, p.TenantID); err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("share tenant: %w", err)
		}
		locked, err := q.LockKey(ctx, dbsqlc.LockKeyParams{TenantID: p.TenantID, Key: p.Key, Now: s.clock()})
		var stored *idem.Record
		switch {
		case errors.Is(err, pgx.ErrNoRows):
		case err != nil:
			return fmt.Errorf("lock record: %w", err)
		default:
			r, err := recordFromRow(locked.IdempotencyKey, locked.ObservedAt)
			if err != nil {
				return err
			}
			stored = &r
		}
		if err := idem.CheckFinishCompletion(stored, p); err != nil {
			return err
		}
		now := pgtype.Timestamptz{Time: stored.ObservedAt, Valid: true}
		switch p.Outcome {
		case idem.OutcomeCompleted:
			if rec, err = s.completeLocked(ctx, q, p, now); err != nil {
				return err
			}
		case idem.OutcomeNotDone:
			if _, err := q.ReleaseKey(ctx, dbsqlc.ReleaseKeyParams{TenantID: p.TenantID, Key: p.Key, FencingToken: p.FencingToken}); err != nil {
				return fmt.Errorf("delete record: %w", err)
			}
			rec = *stored
		case idem.OutcomeUnknown:
			row, err := q.SetCompletionUnknown(ctx, dbsqlc.SetCompletionUnknownParams{
				TenantID: p.TenantID, Key: p.Key, FencingToken: p.FencingToken, Now: now,
				RetryUs: micros(p.NextAttemptAt(*stored, stored.ObservedAt).Sub(stored.ObservedAt)),
			})
			if err != nil {
				return fmt.Errorf("update record: %w", err)
			}
			if rec, err = recordFromRow(row.IdempotencyKey, row.ObservedAt); err != nil {
				return err
			}
		case idem.OutcomeReview:
			row, err := q.SetCompletionReview(ctx, dbsqlc.SetCompletionReviewParams{
				TenantID: p.TenantID, Key: p.Key, FencingToken: p.FencingToken, ReviewNote: p.Note, Now: now,
			})
			if err != nil {
				return fmt.Errorf("update record: %w", err)
			}
			if rec, err = recordFromRow(row.IdempotencyKey, row.ObservedAt); err != nil {
				return err
			}
		}
		actor := idem.CompleterActor(p.TenantID, p.CompleterID)
		if _, err := q.InsertAudit(ctx, dbsqlc.InsertAuditParams{
			TenantID: p.TenantID, Key: p.Key, Action: string(p.AuditAction()),
			FencingToken: p.FencingToken, Note: p.Note,
			ActorSubject: actor.Subject, ActorTenant: actor.Tenant, ActorScope: actor.Scope,
			CreatedAt: now,
		}); err != nil {
			return fmt.Errorf("insert audit entry: %w", err)
		}
		return nil
	})
	return rec, err
}

// completeLocked completes the locked record with the attempt's token as
// CompleteKey completes a worker's (the quota, the waiters' notification),
// inside the caller's transaction.
func (s *Store) completeLocked(ctx context.Context, q *dbsqlc.Queries, p idem.FinishCompletionParams, now pgtype.Timestamptz) (idem.Record, error) {
	args, unstored, err := completeArgs(idem.CompleteParams{
		TenantID: p.TenantID, Key: p.Key, FencingToken: p.FencingToken,
		Response: *p.Response, StorageQuotaBytes: p.StorageQuotaBytes,
	}, now)
	if err != nil {
		return idem.Record{}, err
	}
	row, err := q.CompleteKey(ctx, args)
	if err != nil {
		return idem.Record{}, fmt.Errorf("complete record: %w", err)
	}
	return completedRecord(args, row, *p.Response, unstored), nil
}

// CompletionStats counts the completer's records per tenant and state.
func (s *Store) CompletionStats(ctx context.Context) ([]idem.CompletionStat, error) {
	rows, err := s.q.CompletionStats(ctx, s.clock())
	if err != nil {
		return nil, s.interpretError(err, "completion stats")
	}
	out := make([]idem.CompletionStat, 0, len(rows))
	for _, r := range rows {
		out = append(out, idem.CompletionStat{
			TenantID: r.TenantID, State: idem.CompletionState(r.CompleterState),
			Count: r.Records, Oldest: timeOf(r.Oldest), ObservedAt: timeOf(r.ObservedAt),
		})
	}
	return out, nil
}
