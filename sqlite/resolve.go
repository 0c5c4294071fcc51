package sqlite

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/eventpayload"
	"github.com/idem-dev/idem/sqlite/internal/dbsqlc"
)

// Resolve applies a person's resolution in one IMMEDIATE transaction: read
// the record, idem.CheckResolve, change it, write the audit entry. It is
// the one place a resolution is written: whatever else must be stored with
// it (an outbox event) belongs in this transaction.
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
	var res idem.Resolution
	err := s.inTx(ctx, "resolve key", func(q *dbsqlc.Queries, now time.Time) error {
		stored, err := getKey(ctx, q, p.TenantID, p.Key, now)
		if err != nil {
			return err
		}
		if err := idem.CheckResolve(stored, p, now); err != nil {
			return err
		}
		var newToken *int64
		switch p.Action {
		case idem.ResolveRelease:
			if _, err := q.ReleaseKey(ctx, dbsqlc.ReleaseKeyParams{TenantID: p.TenantID, Key: p.Key, FencingToken: p.FencingToken}); err != nil {
				return fmt.Errorf("delete record: %w", err)
			}
			res.Record = *stored
		case idem.ResolveComplete:
			token, err := q.NextFencingToken(ctx)
			if err != nil {
				return fmt.Errorf("next fencing token: %w", err)
			}
			newToken = &token
			status := int64(p.Response.Status)
			headersText := string(headers)
			row, err := q.ResolveCompleteKey(ctx, dbsqlc.ResolveCompleteKeyParams{
				TenantID:             p.TenantID,
				Key:                  p.Key,
				NewFencingToken:      token,
				ResponseStatus:       &status,
				ResponseHeaders:      &headersText,
				ResponseBody:         p.Response.Body,
				ResponseBodyEncoding: &p.Response.BodyEncoding,
				ResponseBytes:        int64(p.Response.Size()),
				Now:                  micros(now),
			})
			if err != nil {
				return fmt.Errorf("update record: %w", err)
			}
			if res.Record, err = recordFromRow(row, now); err != nil {
				return err
			}
			keepEmptyBody(&res.Record, p.Response.Body != nil)
		case idem.ResolveReview:
			row, err := q.ReviewKey(ctx, dbsqlc.ReviewKeyParams{TenantID: p.TenantID, Key: p.Key, ReviewNote: &p.Note, Now: microsPtr(now)})
			if err != nil {
				return fmt.Errorf("update record: %w", err)
			}
			if res.Record, err = recordFromRow(row, now); err != nil {
				return err
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
			CreatedAt:       micros(now),
		})
		if err != nil {
			return fmt.Errorf("insert audit entry: %w", err)
		}
		res.Audit = auditFromRow(entry)
		ev, err := eventpayload.ResolvedEvent(res.Record, p.Action, p.Actor, now)
		if err != nil {
			return err
		}
		return enqueueEvent(ctx, q, ev, now)
	})
	if err == nil && p.Action != idem.ResolveReview {
		// Released or completed: claims waiting on the key claim again.
		s.events.Publish(p.TenantID, p.Key)
	}
	return res, err
}

// ListAudit lists audit entries newest first.
func (s *Store) ListAudit(ctx context.Context, p idem.ListAuditParams) ([]idem.AuditEntry, error) {
	arg := dbsqlc.ListAuditParams{
		TenantFilter: p.TenantID,
		KeyFilter:    p.Key,
		AfterTime:    cursorNewest,
		AfterID:      cursorNewest,
		RowLimit:     int64(p.Limit),
	}
	if p.After != nil {
		arg.AfterTime, arg.AfterID = micros(p.After.Time), p.After.ID
	}
	rows, err := s.q.ListAudit(ctx, arg)
	if err != nil {
		return nil, s.interpretError(err, "list audit")
	}
	return fromRows(rows, auditFromRow), nil
}
