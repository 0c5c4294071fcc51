package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/eventpayload"
	"github.com/idem-dev/idem/postgres/internal/dbsqlc"
)

// Resolve applies a person's resolution in one transaction: share the
// tenant's row, lock the record's row (SELECT … FOR UPDATE), idem.CheckResolve, change it, write
// the audit entry. The lock makes a concurrent worker's complete or
// checkpoint, a takeover and another resolution wait for the commit and
// then see the new token or the deleted row. It is the one place a
// resolution is written: whatever else must be stored with it (an outbox
// event) belongs in this transaction.
func (s *Store) Resolve(ctx context.Context, p idem.ResolveParams) (idem.Resolution, error) {
	if err := p.Validate(); err != nil {
		return idem.Resolution{}, err
	}
	var headers []byte
	if p.Action == idem.ResolveComplete {
		h, err := json.Marshal(p.Response.Headers)
		if err != nil {
			return idem.Resolution{}, fmt.Errorf("resolve key: encode headers: %w", err)
		}
		headers = h
	}
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return idem.Resolution{}, s.interpretError(err, "resolve key: begin")
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	q := s.q.WithTx(tx)
	now := s.clock()

	// The tenant's row before the record's, in the order deleting the
	// tenant locks them; without the tenant there is no record either.
	if _, err := q.ShareTenant(ctx, p.TenantID); err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return idem.Resolution{}, s.interpretError(err, "resolve key: share tenant")
	}
	locked, err := q.LockKey(ctx, dbsqlc.LockKeyParams{TenantID: p.TenantID, Key: p.Key, Now: now})
	var stored *idem.Record
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		return idem.Resolution{}, s.interpretError(err, "resolve key: lock record")
	default:
		rec, err := recordFromRow(locked.IdempotencyKey, locked.ObservedAt)
		if err != nil {
			return idem.Resolution{}, err
		}
		stored = &rec
	}
	var at time.Time
	if stored != nil {
		// Every statement of the transaction works at the instant the
		// decision was made.
		at = stored.ObservedAt
		now = pgtype.Timestamptz{Time: at, Valid: true}
	}
	if err := idem.CheckResolve(stored, p, at); err != nil {
		return idem.Resolution{}, err
	}

	var res idem.Resolution
	var newToken *int64
	switch p.Action {
	case idem.ResolveRelease:
		if _, err := q.ReleaseKey(ctx, dbsqlc.ReleaseKeyParams{TenantID: p.TenantID, Key: p.Key, FencingToken: p.FencingToken}); err != nil {
			return idem.Resolution{}, s.interpretError(err, "resolve key: delete record")
		}
		res.Record = *stored
	case idem.ResolveComplete:
		row, err := q.ResolveCompleteKey(ctx, dbsqlc.ResolveCompleteKeyParams{
			TenantID:             p.TenantID,
			Key:                  p.Key,
			FencingToken:         p.FencingToken,
			ResponseStatus:       int32(p.Response.Status),
			ResponseHeaders:      headers,
			ResponseBody:         p.Response.Body,
			ResponseBodyEncoding: p.Response.BodyEncoding,
			ResponseBytes:        int64(p.Response.Size()),
			Now:                  now,
		})
		if err != nil {
			return idem.Resolution{}, s.interpretError(err, "resolve key: complete record")
		}
		res.Record = recordFromWriteRow(writeRow(row))
		resp := *p.Response
		res.Record.Response = &resp
		newToken = &res.Record.FencingToken
	case idem.ResolveReview:
		row, err := q.ReviewKey(ctx, dbsqlc.ReviewKeyParams{TenantID: p.TenantID, Key: p.Key, FencingToken: p.FencingToken, ReviewNote: p.Note, Now: now})
		if err != nil {
			return idem.Resolution{}, s.interpretError(err, "resolve key: flag record")
		}
		if res.Record, err = recordFromRow(row.IdempotencyKey, row.ObservedAt); err != nil {
			return idem.Resolution{}, err
		}
	}
	entry, err := q.InsertAudit(ctx, dbsqlc.InsertAuditParams{
		TenantID:        p.TenantID,
		Key:             p.Key,
		Action:          string(p.Action),
		FencingToken:    p.FencingToken,
		NewFencingToken: newToken,
		Note:            p.Note,
		ActorSubject:    p.Actor.Subject,
		ActorTenant:     p.Actor.Tenant,
		ActorScope:      p.Actor.Scope,
		CreatedAt:       now,
	})
	if err != nil {
		return idem.Resolution{}, s.interpretError(err, "resolve key: insert audit entry")
	}
	res.Audit = auditFromRow(entry)
	ev, err := eventpayload.ResolvedEvent(res.Record, p.Action, p.Actor, res.Audit.CreatedAt)
	if err != nil {
		return idem.Resolution{}, err
	}
	if err := s.enqueueEvent(ctx, q, ev); err != nil {
		return idem.Resolution{}, s.interpretError(err, "resolve key")
	}
	if err := tx.Commit(ctx); err != nil {
		return idem.Resolution{}, s.interpretError(err, "resolve key: commit")
	}
	return res, nil
}

// ListAudit lists audit entries newest first.
func (s *Store) ListAudit(ctx context.Context, p idem.ListAuditParams) ([]idem.AuditEntry, error) {
	arg := dbsqlc.ListAuditParams{TenantFilter: p.TenantID, KeyFilter: p.Key, AfterTime: cursorNewest, RowLimit: int32(p.Limit)}
	if p.After != nil {
		arg.AfterTime = pgtype.Timestamptz{Time: p.After.Time, Valid: true}
		arg.AfterID = p.After.ID
	}
	rows, err := s.q.ListAudit(ctx, arg)
	if err != nil {
		return nil, s.interpretError(err, "list audit")
	}
	return fromRows(rows, auditFromRow), nil
}
