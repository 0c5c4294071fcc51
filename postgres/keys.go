package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/postgres/internal/dbsqlc"
)

// claimAttempts bounds the claim loop. Another round is needed only when the
// row changed between the upsert and the read that explains its refusal
// (released, reaped, or its lease ran out in between).
const claimAttempts = 8

// Claim applies the claim state machine in one statement (ClaimKey). A
// record the claim would not change, completed within its replay window or
// in flight with its lease running, comes back as the statement read it,
// unwritten, and idem.DecideClaim says what it means: a replay, the
// recovery of the caller's own attempt (same attempt id; its lease is then
// renewed), request_in_flight, or fingerprint_mismatch. Otherwise the
// statement creates or takes over the record. When it does neither (the
// record changed after the statement's snapshot, or the quota is full) the
// store reads the row and decides the same way.
func (s *Store) Claim(ctx context.Context, p idem.ClaimParams) (idem.ClaimResult, error) {
	if s.hints.completed(p.TenantID, p.Key, s.hintNow()) {
		if res, ok, err := s.claimCompleted(ctx, p); ok {
			return res, err
		}
	}
	for range claimAttempts {
		row, err := s.q.ClaimKey(ctx, dbsqlc.ClaimKeyParams{
			TenantID:               p.TenantID,
			Key:                    p.Key,
			Operation:              p.Operation,
			Fingerprint:            p.Fingerprint,
			AttemptID:              nullIfEmpty(p.AttemptID),
			LeaseUs:                micros(p.Lease),
			ReplayWindowSeconds:    seconds(p.ReplayWindow),
			ReaperThresholdSeconds: seconds(p.ReaperThreshold),
			StoredBytes:            idem.ClaimBytes(p.Key, p.Operation, p.Fingerprint),
			StorageQuotaBytes:      p.StorageQuotaBytes,
			Now:                    s.clock(),
		})
		var stored *idem.Record
		switch {
		case err == nil && row.Written:
			rec := recordFromWriteRow(claimedRow(row))
			action := idem.ActionTakeover
			if rec.Attempt == 1 {
				action = idem.ActionCreate
			}
			return idem.ClaimResult{Action: action, Record: rec}, nil
		case err == nil:
			kept := recordFromWriteRow(claimedRow(row))
			// the completer's hold decides what a claim of it answers
			// (outcome_unknown, outcome_review), as for a record read
			kept.Completion = completionOf(row.CompleterState, row.CompleterID, row.CompleterAttempts,
				row.CompleterNextAt, row.CompleterDeadline)
			rec, err := withResponse(kept,
				row.ResponseStatus, row.ResponseHeaders, row.ResponseBody, row.ResponseBodyEncoding)
			if err != nil {
				return idem.ClaimResult{}, err
			}
			stored = &rec
		case !errors.Is(err, pgx.ErrNoRows):
			return idem.ClaimResult{}, s.interpretError(err, "claim key")
		default:
			stored, err = s.getKey(ctx, p.TenantID, p.Key)
			if err != nil {
				return idem.ClaimResult{}, err
			}
		}

		action := idem.ActionCreate
		if stored != nil {
			action = idem.DecideClaim(stored, p, stored.ObservedAt)
		}
		switch action {
		case idem.ActionCreate, idem.ActionTakeover:
			// The tenant is unknown or being deleted, over the quota, or the
			// row was released, reaped, its window or lease ran out since
			// the statement's snapshot.
			if err := s.checkTenant(ctx, p.TenantID); err != nil {
				return idem.ClaimResult{}, err
			}
			if action == idem.ActionTakeover {
				continue
			}
			if err := s.checkQuota(ctx, p); err != nil {
				return idem.ClaimResult{}, err
			}
		case idem.ActionReplay:
			s.hints.remember(p.TenantID, p.Key, stored.ReplayUntil)
			return idem.ClaimResult{Action: action, Record: *stored}, nil
		case idem.ActionRecover:
			rec, err := s.renewAttemptLease(ctx, stored, p)
			if errors.Is(err, pgx.ErrNoRows) {
				continue // taken over, completed or released in between
			}
			if err != nil {
				return idem.ClaimResult{}, err
			}
			return idem.ClaimResult{Action: action, Record: rec}, nil
		case idem.ActionRejectInFlight, idem.ActionRejectMismatch, idem.ActionRejectUnknown, idem.ActionRejectReview:
			return idem.ClaimResult{}, idem.ClaimError(action, stored, stored.ObservedAt)
		}
	}
	return idem.ClaimResult{}, fmt.Errorf("claim key: %w", errContention)
}

// claimCompleted answers the claim of a key seen completed (s.hints) from
// a plain read when the record is still completed within its window: a
// replay, or fingerprint_mismatch. ok is false otherwise (the hint is
// dropped), and ClaimKey decides.
func (s *Store) claimCompleted(ctx context.Context, p idem.ClaimParams) (res idem.ClaimResult, ok bool, err error) {
	stored, err := s.getKey(ctx, p.TenantID, p.Key)
	if err != nil {
		return idem.ClaimResult{}, true, err
	}
	if stored != nil && stored.StateAt(stored.ObservedAt) == idem.StateCompleted {
		switch action := idem.DecideClaim(stored, p, stored.ObservedAt); action {
		case idem.ActionReplay:
			return idem.ClaimResult{Action: action, Record: *stored}, true, nil
		case idem.ActionRejectMismatch:
			return idem.ClaimResult{}, true, idem.ClaimError(action, stored, stored.ObservedAt)
		}
	}
	s.hints.forget(p.TenantID, p.Key)
	return idem.ClaimResult{}, false, nil
}

// claimedRow is ClaimKey's row without its response and written flag.
func claimedRow(r dbsqlc.ClaimKeyRow) writeRow {
	return writeRow{
		TenantID: r.TenantID, Key: r.Key, State: r.State, Operation: r.Operation,
		Fingerprint: r.Fingerprint, FencingToken: r.FencingToken, Attempt: r.Attempt,
		LeaseExpiresAt: r.LeaseExpiresAt, RecoveryPoint: r.RecoveryPoint,
		ReplayWindowSeconds: r.ReplayWindowSeconds, ReaperThresholdSeconds: r.ReaperThresholdSeconds,
		CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt, CompletedAt: r.CompletedAt,
		ReplayUntil: r.ReplayUntil, PurgeAfter: r.PurgeAfter, ReviewNote: r.ReviewNote,
		ReviewAt: r.ReviewAt, RecoveryData: r.RecoveryData, AttemptID: r.AttemptID,
		ObservedAt: r.ObservedAt,
	}
}

// checkTenant returns tenant_unknown when a claim may not create a record
// of the tenant (absent, or being deleted): why ClaimKey, which reads the
// tenant's row without locking it (migration 00016), wrote nothing.
func (s *Store) checkTenant(ctx context.Context, tenantID string) error {
	live, err := s.q.TenantLive(ctx, tenantID)
	if err != nil {
		return s.interpretError(err, "claim key: read the tenant")
	}
	if !live {
		return idem.TenantUnknown(tenantID, nil)
	}
	return nil
}

// checkQuota returns storage_quota_exceeded when the claim's tenant is at or
// over its quota: why ClaimKey created no record for an absent or expired
// key. Nil means the key changed since (another round decides).
func (s *Store) checkQuota(ctx context.Context, p idem.ClaimParams) error {
	if p.StorageQuotaBytes == 0 {
		return nil
	}
	used, err := s.q.TenantStoredBytes(ctx, p.TenantID)
	if err != nil {
		return s.interpretError(err, "claim key: read the tenant's usage")
	}
	if used >= p.StorageQuotaBytes {
		return idem.StorageQuotaExceeded(p.TenantID, used, p.StorageQuotaBytes)
	}
	return nil
}

// renewAttemptLease renews the lease of a recovered attempt from now, while
// it is still the stored one; pgx.ErrNoRows when the record changed.
func (s *Store) renewAttemptLease(ctx context.Context, stored *idem.Record, p idem.ClaimParams) (idem.Record, error) {
	row, err := s.q.RenewAttemptLease(ctx, dbsqlc.RenewAttemptLeaseParams{
		TenantID:     p.TenantID,
		Key:          p.Key,
		FencingToken: stored.FencingToken,
		AttemptID:    p.AttemptID,
		LeaseUs:      micros(p.Lease),
		Now:          s.clock(),
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return idem.Record{}, err
	}
	if err != nil {
		return idem.Record{}, s.interpretError(err, "claim key: renew the recovered lease")
	}
	return recordFromRow(row.IdempotencyKey, row.ObservedAt)
}

// Checkpoint saves a recovery point and renews the lease while the token is
// current and the record in flight.
func (s *Store) Checkpoint(ctx context.Context, p idem.CheckpointParams) (idem.Record, error) {
	row, err := s.q.CheckpointKey(ctx, dbsqlc.CheckpointKeyParams{
		TenantID:          p.TenantID,
		Key:               p.Key,
		FencingToken:      p.FencingToken,
		RecoveryPoint:     p.RecoveryPoint,
		RecoveryData:      p.Data,
		RecoveryBytes:     idem.RecoveryBytes(p.RecoveryPoint, p.Data),
		StorageQuotaBytes: p.StorageQuotaBytes,
		LeaseUs:           micros(p.Lease),
		Now:               s.clock(),
	})
	if errors.Is(err, pgx.ErrNoRows) {
		stored, err := s.getKey(ctx, p.TenantID, p.Key)
		if err != nil {
			return idem.Record{}, err
		}
		return idem.Record{}, refused(s.queueLeaseLost(ctx, stored, "checkpoint", p.FencingToken, idem.CheckWrite(stored, p.FencingToken)), "checkpoint")
	}
	if err != nil {
		return idem.Record{}, s.interpretError(err, "checkpoint key")
	}
	rec := recordFromWriteRow(writeRow(row))
	if size := idem.RecoveryBytes(p.RecoveryPoint, p.Data); idem.RecoveryBytes(rec.RecoveryPoint, rec.RecoveryData) != size {
		// No room under the quota: the lease was renewed, the earlier
		// point and data kept (CheckpointKey).
		return rec, idem.CheckpointNotStored(p.TenantID, size, p.StorageQuotaBytes)
	}
	return rec, nil
}

// Complete stores the response while the token is current and the record
// in flight. Completing again with the current token and an equal response
// returns the stored record.
func (s *Store) Complete(ctx context.Context, p idem.CompleteParams) (idem.Record, error) {
	if err := p.Validate(); err != nil {
		return idem.Record{}, err
	}
	args, unstored, err := completeArgs(p, s.clock())
	if err != nil {
		return idem.Record{}, fmt.Errorf("complete key: %w", err)
	}
	row, err := s.q.CompleteKey(ctx, args)
	if errors.Is(err, pgx.ErrNoRows) {
		stored, err := s.getKey(ctx, p.TenantID, p.Key)
		if err != nil {
			return idem.Record{}, err
		}
		repeat, err := idem.CheckComplete(stored, p.FencingToken, p.Response)
		if repeat && idem.IsUnstored(stored.Response, p.Response) {
			return *stored, idem.ResponseNotStored(p.TenantID, p.Response.Size(), p.StorageQuotaBytes)
		}
		if repeat {
			return *stored, nil
		}
		return idem.Record{}, refused(s.queueLeaseLost(ctx, stored, "complete", p.FencingToken, err), "complete")
	}
	if err != nil {
		return idem.Record{}, s.interpretError(err, "complete key")
	}
	rec := completedRecord(args, row, p.Response, unstored)
	if !row.Stored {
		// Completed without the response: no room under the quota.
		return rec, idem.ResponseNotStored(p.TenantID, p.Response.Size(), p.StorageQuotaBytes)
	}
	s.hints.remember(p.TenantID, p.Key, rec.ReplayUntil)
	return rec, nil
}

// completedRow is the record CompleteKey completed: the columns it returns,
// and what the caller passed (tenant, key, token) or the statement set
// (state completed, no lease, no review, updated and completed at the
// instant it returns), which it does not send back.
func completedRow(args dbsqlc.CompleteKeyParams, r dbsqlc.CompleteKeyRow) writeRow {
	return writeRow{
		TenantID: args.TenantID, Key: args.Key, State: string(idem.StateCompleted), Operation: r.Operation,
		Fingerprint: r.Fingerprint, FencingToken: args.FencingToken, Attempt: r.Attempt,
		RecoveryPoint: r.RecoveryPoint, ReplayWindowSeconds: r.ReplayWindowSeconds,
		ReaperThresholdSeconds: r.ReaperThresholdSeconds, CreatedAt: r.CreatedAt,
		UpdatedAt: r.ObservedAt, CompletedAt: r.ObservedAt, ReplayUntil: r.ReplayUntil,
		PurgeAfter: r.PurgeAfter, RecoveryData: r.RecoveryData, AttemptID: r.AttemptID,
		ObservedAt: r.ObservedAt,
	}
}

// completeArgs are CompleteKey's arguments for p's response, and the
// unstored response (idem.UnstoredResponse) the statement stores in its
// place when it does not fit the quota. Complete and the completer's
// finish (completeLocked) share them, as SQLite's share completeInTx.
func completeArgs(p idem.CompleteParams, now pgtype.Timestamptz) (dbsqlc.CompleteKeyParams, idem.Response, error) {
	headers, err := json.Marshal(p.Response.Headers)
	if err != nil {
		return dbsqlc.CompleteKeyParams{}, idem.Response{}, fmt.Errorf("encode headers: %w", err)
	}
	unstored := idem.UnstoredResponse(p.Response)
	unstoredHeaders, err := json.Marshal(unstored.Headers)
	if err != nil {
		return dbsqlc.CompleteKeyParams{}, idem.Response{}, fmt.Errorf("encode headers: %w", err)
	}
	return dbsqlc.CompleteKeyParams{
		TenantID:             p.TenantID,
		Key:                  p.Key,
		FencingToken:         p.FencingToken,
		ResponseStatus:       int32(p.Response.Status),
		ResponseHeaders:      headers,
		ResponseBody:         p.Response.Body,
		ResponseBodyEncoding: p.Response.BodyEncoding,
		ResponseBytes:        int64(p.Response.Size()),
		StorageQuotaBytes:    p.StorageQuotaBytes,
		UnstoredHeaders:      unstoredHeaders,
		UnstoredBytes:        int64(unstored.Size()),
		Now:                  now,
	}, unstored, nil
}

// completedRecord is the record CompleteKey completed, with the response
// it stored: resp, or unstored when it was not written (no room under the
// quota).
func completedRecord(args dbsqlc.CompleteKeyParams, row dbsqlc.CompleteKeyRow, resp, unstored idem.Response) idem.Record {
	rec := recordFromWriteRow(completedRow(args, row))
	if row.Stored {
		rec.Response = &resp
	} else {
		rec.Response = &unstored
	}
	return rec
}

// Release deletes the in-flight record while the token is current.
func (s *Store) Release(ctx context.Context, p idem.ReleaseParams) error {
	n, err := s.q.ReleaseKey(ctx, dbsqlc.ReleaseKeyParams{TenantID: p.TenantID, Key: p.Key, FencingToken: p.FencingToken})
	if err != nil {
		return s.interpretError(err, "release key")
	}
	if n == 0 {
		stored, err := s.getKey(ctx, p.TenantID, p.Key)
		if err != nil {
			return err
		}
		return refused(s.queueLeaseLost(ctx, stored, "release", p.FencingToken, idem.CheckWrite(stored, p.FencingToken)), "release")
	}
	return nil
}

// refused returns why a token-guarded write (op) did not apply, given the
// verdict of the domain rule on the row read after it: that verdict, or,
// when the rule would have let the write apply, a contention error. The row
// then changed between the two statements; tokens are never reused, so this
// only happens if the record was deleted and recreated, which hands out a
// new token. Report it rather than guess.
func refused(verdict error, op string) error {
	if verdict != nil {
		return verdict
	}
	return fmt.Errorf("%s key: %w", op, errContention)
}

// GetRecord returns the record with its response.
func (s *Store) GetRecord(ctx context.Context, p idem.GetRecordParams) (idem.Record, error) {
	stored, err := s.getKey(ctx, p.TenantID, p.Key)
	if err != nil {
		return idem.Record{}, err
	}
	if stored == nil {
		return idem.Record{}, idem.KeyNotFound(p.Key)
	}
	return *stored, nil
}

// getKey reads a record at the store's clock; nil when absent.
func (s *Store) getKey(ctx context.Context, tenantID, key string) (*idem.Record, error) {
	row, err := s.q.GetKey(ctx, dbsqlc.GetKeyParams{TenantID: tenantID, Key: key, Now: s.clock()})
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, s.interpretError(err, "read key")
	}
	rec, err := recordFromRow(row.IdempotencyKey, row.ObservedAt)
	if err != nil {
		return nil, err
	}
	return &rec, nil
}

// ListRecords lists a tenant's records without responses, newest first.
func (s *Store) ListRecords(ctx context.Context, p idem.ListRecordsParams) ([]idem.Record, error) {
	arg := dbsqlc.ListKeysParams{TenantID: p.TenantID, StateFilter: string(p.State), CompletionFilter: string(p.Completion), AfterTime: cursorNewest, RowLimit: int32(p.Limit), Now: s.clock()}
	if p.After != nil {
		arg.AfterTime = pgtype.Timestamptz{Time: p.After.Time, Valid: true}
		arg.AfterKey = p.After.Key
	}
	rows, err := s.q.ListKeys(ctx, arg)
	if err != nil {
		return nil, s.interpretError(err, "list keys")
	}
	return listRecords(rows), nil
}

// ListOrphans lists orphaned records, oldest lease expiry first.
func (s *Store) ListOrphans(ctx context.Context, p idem.ListOrphansParams) ([]idem.Record, error) {
	arg := dbsqlc.ListOrphanKeysParams{TenantFilter: p.TenantID, CompletionFilter: string(p.Completion), AfterTime: cursorOldest, RowLimit: int32(p.Limit), Now: s.clock()}
	if p.After != nil {
		arg.AfterTime = pgtype.Timestamptz{Time: p.After.Time, Valid: true}
		arg.AfterTenantID = p.After.TenantID
		arg.AfterKey = p.After.Key
	}
	rows, err := s.q.ListOrphanKeys(ctx, arg)
	if err != nil {
		return nil, s.interpretError(err, "list orphans")
	}
	return listRecords(rows), nil
}

// OrphanStats returns the orphan count and oldest lease expiry per tenant.
func (s *Store) OrphanStats(ctx context.Context) ([]idem.OrphanStat, error) {
	rows, err := s.q.OrphanStats(ctx, s.clock())
	if err != nil {
		return nil, s.interpretError(err, "orphan stats")
	}
	out := make([]idem.OrphanStat, 0, len(rows))
	for _, r := range rows {
		out = append(out, idem.OrphanStat{
			TenantID:          r.TenantID,
			Count:             r.Orphans,
			OldestLeaseExpiry: timeOf(r.OldestLeaseExpiry),
			ObservedAt:        timeOf(r.ObservedAt),
		})
	}
	return out, nil
}

// Reap deletes one batch of records past purge_after, and queues
// key.reaped_in_flight for each in-flight one in the same transaction.
func (s *Store) Reap(ctx context.Context, p idem.ReapParams) ([]idem.Record, error) {
	var out []idem.Record
	err := s.inTx(ctx, "reap keys", func(q *dbsqlc.Queries) error {
		rows, err := q.ReapKeys(ctx, dbsqlc.ReapKeysParams{Now: s.clock(), RowLimit: int32(p.Limit)})
		if err != nil {
			return err
		}
		out = listRecords(rows)
		return s.queueReaped(ctx, q, out)
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}
