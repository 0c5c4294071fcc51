package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	sqlitelib "modernc.org/sqlite/lib"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/sqlite/internal/dbsqlc"
)

var _ idem.CompleterStore = (*Store)(nil)

// Completers returns the store itself: it keeps the completers and their
// records in the ledger's file.
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
	err := s.write(ctx, "create completer", func() error {
		row, err := s.q.CreateCompleter(ctx, dbsqlc.CreateCompleterParams{
			TenantID: c.TenantID, ID: c.ID, Url: c.URL, Secret: c.Secret,
			OperationPattern: c.OperationPattern, Now: micros(s.clock()), MaxCompleters: idem.MaxCompleters,
		})
		if sqliteCode(err) == sqlitelib.SQLITE_CONSTRAINT_FOREIGNKEY {
			return idem.TenantUnknown(c.TenantID, err)
		}
		if errors.Is(err, sql.ErrNoRows) {
			return idem.CompleterLimitReached()
		}
		out = completerFromRow(row)
		return err
	})
	return out, err
}

// GetCompleter reads one completer.
func (s *Store) GetCompleter(ctx context.Context, p idem.GetCompleterParams) (idem.Completer, error) {
	row, err := s.q.GetCompleter(ctx, dbsqlc.GetCompleterParams{TenantID: p.TenantID, ID: p.ID})
	if errors.Is(err, sql.ErrNoRows) {
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
	return s.write(ctx, "delete completer", func() error {
		n, err := s.q.DeleteCompleter(ctx, dbsqlc.DeleteCompleterParams{TenantID: p.TenantID, ID: p.ID})
		if err == nil && n == 0 {
			return idem.CompleterNotFound(p.ID)
		}
		return err
	})
}

// PickCompletions takes records over for the completer in one IMMEDIATE
// transaction: the single writer is what keeps two pickers (and a claim)
// from taking the same record.
func (s *Store) PickCompletions(ctx context.Context, p idem.PickCompletionsParams) ([]idem.PickedCompletion, error) {
	var out []idem.PickedCompletion
	err := s.inTx(ctx, "pick completions", func(q *dbsqlc.Queries, now time.Time) error {
		out = out[:0]
		skip, err := json.Marshal(append([]string{}, p.SkipTenants...))
		if err != nil {
			return fmt.Errorf("pick candidates: encode skipped tenants: %w", err)
		}
		cands, err := q.PickCompletionCandidates(ctx, dbsqlc.PickCompletionCandidatesParams{
			Now: micros(now), RowLimit: int64(p.Limit), PerTenant: int64(p.PerTenantLimit()),
			SkipTenants: string(skip),
		})
		if err != nil {
			return fmt.Errorf("pick candidates: %w", err)
		}
		completers := map[string][]idem.Completer{}
		for _, c := range cands {
			stored, err := getKey(ctx, q, c.TenantID, c.Key, now)
			if err != nil || stored == nil {
				return err
			}
			token, err := q.NextFencingToken(ctx)
			if err != nil {
				return fmt.Errorf("next fencing token: %w", err)
			}
			lease := now.Add(p.Lease)
			row, err := q.TakeCompletion(ctx, dbsqlc.TakeCompletionParams{
				TenantID: c.TenantID, Key: c.Key, FencingToken: token,
				LeaseExpiresAt: microsPtr(lease), Now: micros(now),
				DeadlineUs: p.Deadline.Microseconds(),
			})
			if err != nil {
				return fmt.Errorf("take record: %w", err)
			}
			rec, err := recordFromRow(row, now)
			if err != nil {
				return err
			}
			cs, ok := completers[c.TenantID]
			if !ok {
				rows, err := q.ListCompleters(ctx, c.TenantID)
				if err != nil {
					return fmt.Errorf("list completers: %w", err)
				}
				for _, r := range rows {
					cs = append(cs, completerFromRow(r))
				}
				completers[c.TenantID] = cs
			}
			pc := idem.PickedCompletion{Record: rec}
			pc.Completer, pc.Matched = idem.PickCompleter(cs, rec.Operation)
			out = append(out, pc)
		}
		return nil
	})
	return out, err
}

// FinishCompletion applies one attempt's outcome and its audit entry in
// one IMMEDIATE transaction.
func (s *Store) FinishCompletion(ctx context.Context, p idem.FinishCompletionParams) (idem.Record, error) {
	if err := p.Validate(); err != nil {
		return idem.Record{}, err
	}
	var headers []byte
	if p.Response != nil {
		h, err := json.Marshal(p.Response.Headers)
		if err != nil {
			return idem.Record{}, fmt.Errorf("finish completion: encode headers: %w", err)
		}
		headers = h
	}
	var rec idem.Record
	err := s.inTx(ctx, "finish completion", func(q *dbsqlc.Queries, now time.Time) error {
		stored, err := getKey(ctx, q, p.TenantID, p.Key, now)
		if err != nil {
			return err
		}
		if err := idem.CheckFinishCompletion(stored, p); err != nil {
			return err
		}
		var row dbsqlc.IdempotencyKey
		switch p.Outcome {
		case idem.OutcomeCompleted:
			// A response that does not fit the quota completes the key
			// without it, as a worker's complete would; the work ran.
			rec, _, err = completeInTx(ctx, q, stored, idem.CompleteParams{
				TenantID: p.TenantID, Key: p.Key, FencingToken: p.FencingToken,
				Response: *p.Response, StorageQuotaBytes: p.StorageQuotaBytes,
			}, headers, now)
			if err != nil {
				return err
			}
		case idem.OutcomeNotDone:
			if _, err := q.ReleaseKey(ctx, dbsqlc.ReleaseKeyParams{TenantID: p.TenantID, Key: p.Key, FencingToken: p.FencingToken}); err != nil {
				return fmt.Errorf("delete record: %w", err)
			}
			rec = *stored
		case idem.OutcomeUnknown:
			row, err = q.SetCompletionUnknown(ctx, dbsqlc.SetCompletionUnknownParams{
				TenantID: p.TenantID, Key: p.Key, NextAt: microsPtr(p.NextAttemptAt(*stored, now)), Now: microsPtr(now),
			})
		case idem.OutcomeReview:
			row, err = q.SetCompletionReview(ctx, dbsqlc.SetCompletionReviewParams{
				TenantID: p.TenantID, Key: p.Key, ReviewNote: &p.Note, Now: microsPtr(now),
			})
		}
		if err != nil {
			return fmt.Errorf("update record: %w", err)
		}
		if p.Outcome == idem.OutcomeUnknown || p.Outcome == idem.OutcomeReview {
			if rec, err = recordFromRow(row, now); err != nil {
				return err
			}
		}
		actor := idem.CompleterActor(p.TenantID, p.CompleterID)
		if _, err := q.InsertAudit(ctx, dbsqlc.InsertAuditParams{
			TenantID: p.TenantID, Key: p.Key, Action: string(p.AuditAction()),
			FencingToken: p.FencingToken, Note: p.Note,
			ActorSubject: actor.Subject, ActorTenant: actor.Tenant, ActorScope: actor.Scope,
			CreatedAt: micros(now),
		}); err != nil {
			return fmt.Errorf("insert audit entry: %w", err)
		}
		return nil
	})
	if err == nil && (p.Outcome == idem.OutcomeCompleted || p.Outcome == idem.OutcomeNotDone) {
		s.events.Publish(p.TenantID, p.Key)
	}
	return rec, err
}

// CompletionStats counts the completer's records per tenant and state.
func (s *Store) CompletionStats(ctx context.Context) ([]idem.CompletionStat, error) {
	now := s.clock()
	rows, err := s.q.CompletionStats(ctx)
	if err != nil {
		return nil, s.interpretError(err, "completion stats")
	}
	out := make([]idem.CompletionStat, 0, len(rows))
	for _, r := range rows {
		out = append(out, idem.CompletionStat{
			TenantID: r.TenantID, State: idem.CompletionState(r.CompleterState),
			Count: r.Records, Oldest: timeOf(r.Oldest), ObservedAt: now,
		})
	}
	return out, nil
}
