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
	"github.com/idem-dev/idem/eventpayload"
	"github.com/idem-dev/idem/sqlite/internal/dbsqlc"
)

// Claim applies the claim state machine. A claim that leaves the record as
// it is (keptAnswer: a replay, request_in_flight, fingerprint_mismatch) is
// answered from one read beside the writer, without the writer slot or a
// write transaction. Every other claim runs in one IMMEDIATE transaction:
// read the row, idem.DecideClaim, then create, take over, recover, replay
// or refuse, decided again on the row as the transaction reads it.
func (s *Store) Claim(ctx context.Context, p idem.ClaimParams) (idem.ClaimResult, error) {
	if res, ok, err := s.keptAnswer(ctx, p); ok {
		return res, err
	}
	var res idem.ClaimResult
	err := s.inTx(ctx, "claim key", func(q *dbsqlc.Queries, now time.Time) error {
		stored, err := getKey(ctx, q, p.TenantID, p.Key, now)
		if err != nil {
			return err
		}
		action := idem.DecideClaim(stored, p, now)
		if err := idem.ClaimError(action, stored, now); err != nil {
			return err
		}
		if action == idem.ActionCreate && p.StorageQuotaBytes > 0 {
			used, err := q.TenantStoredBytes(ctx, p.TenantID)
			if err != nil {
				return fmt.Errorf("read the tenant's usage: %w", err)
			}
			if used >= p.StorageQuotaBytes {
				return idem.StorageQuotaExceeded(p.TenantID, used, p.StorageQuotaBytes)
			}
		}
		res.Action = action
		switch action {
		case idem.ActionReplay:
			res.Record = *stored
			return nil
		case idem.ActionRecover:
			res.Record, err = renewAttemptLease(ctx, q, p, now)
		case idem.ActionTakeover:
			res.Record, err = takeover(ctx, q, p, now)
		default:
			res.Record, err = create(ctx, q, p, now)
		}
		return err
	})
	return res, err
}

// keptAnswer answers a claim from one read when the claim would leave the
// record as it is: completed within its replay window (a replay or a
// fingerprint mismatch) or in flight with its lease running (refused, or
// the caller's own attempt, which the write path recovers). A completed
// record is immutable until its window ends, so the read's answer is the
// answer at the read's instant; a record in flight can only change by a
// write, which the read either saw or precedes. ok is false when the claim
// needs the write path. Like every write, it first checks that the path
// still names the opened file.
func (s *Store) keptAnswer(ctx context.Context, p idem.ClaimParams) (res idem.ClaimResult, ok bool, err error) {
	if err := s.checkFile("claim key"); err != nil {
		return idem.ClaimResult{}, true, err
	}
	now := s.clock()
	stored, err := getKey(ctx, s.q, p.TenantID, p.Key, now)
	if err != nil {
		return idem.ClaimResult{}, true, s.interpretError(err, "claim key")
	}
	if stored == nil {
		return idem.ClaimResult{}, false, nil
	}
	switch action := idem.DecideClaim(stored, p, now); action {
	case idem.ActionReplay:
		return idem.ClaimResult{Action: action, Record: *stored}, true, nil
	case idem.ActionRejectInFlight:
		return idem.ClaimResult{}, true, idem.ClaimError(action, stored, now)
	case idem.ActionRejectMismatch:
		if st := stored.StateAt(now); st == idem.StateCompleted || st == idem.StateInFlight {
			return idem.ClaimResult{}, true, idem.ClaimError(action, stored, now)
		}
	}
	return idem.ClaimResult{}, false, nil
}

// create inserts a fresh in-flight record, overwriting an expired one.
func create(ctx context.Context, q *dbsqlc.Queries, p idem.ClaimParams, now time.Time) (idem.Record, error) {
	token, err := q.NextFencingToken(ctx)
	if err != nil {
		return idem.Record{}, fmt.Errorf("next fencing token: %w", err)
	}
	row, err := q.CreateKey(ctx, dbsqlc.CreateKeyParams{
		TenantID:               p.TenantID,
		Key:                    p.Key,
		Operation:              p.Operation,
		Fingerprint:            p.Fingerprint,
		AttemptID:              nullIfEmpty(p.AttemptID),
		FencingToken:           token,
		LeaseExpiresAt:         microsPtr(now.Add(p.Lease)),
		ReplayWindowSeconds:    seconds(p.ReplayWindow),
		ReaperThresholdSeconds: seconds(p.ReaperThreshold),
		Now:                    micros(now),
		StoredBytes:            idem.ClaimBytes(p.Key, p.Operation, p.Fingerprint),
	})
	if sqliteCode(err) == sqlitelib.SQLITE_CONSTRAINT_FOREIGNKEY {
		return idem.Record{}, idem.TenantUnknown(p.TenantID, err)
	}
	if err != nil {
		return idem.Record{}, fmt.Errorf("insert record: %w", err)
	}
	return recordFromRow(row, now)
}

// renewAttemptLease hands a recovered attempt back with its lease renewed
// from now; the purge follows the lease (in the query).
func renewAttemptLease(ctx context.Context, q *dbsqlc.Queries, p idem.ClaimParams, now time.Time) (idem.Record, error) {
	row, err := q.RenewAttemptLease(ctx, dbsqlc.RenewAttemptLeaseParams{
		TenantID:       p.TenantID,
		Key:            p.Key,
		LeaseExpiresAt: microsPtr(now.Add(p.Lease)),
		Now:            micros(now),
	})
	if err != nil {
		return idem.Record{}, fmt.Errorf("renew the recovered lease: %w", err)
	}
	return recordFromRow(row, now)
}

// takeover hands an orphaned record to the claim: attempt+1, a new token, a
// new lease, the recovery point kept.
func takeover(ctx context.Context, q *dbsqlc.Queries, p idem.ClaimParams, now time.Time) (idem.Record, error) {
	token, err := q.NextFencingToken(ctx)
	if err != nil {
		return idem.Record{}, fmt.Errorf("next fencing token: %w", err)
	}
	row, err := q.TakeoverKey(ctx, dbsqlc.TakeoverKeyParams{
		TenantID:       p.TenantID,
		Key:            p.Key,
		FencingToken:   token,
		AttemptID:      nullIfEmpty(p.AttemptID),
		LeaseExpiresAt: microsPtr(now.Add(p.Lease)),
		Now:            micros(now),
	})
	if err != nil {
		return idem.Record{}, fmt.Errorf("take over record: %w", err)
	}
	return recordFromRow(row, now)
}

// Checkpoint saves a recovery point and renews the lease while the token is
// current and the record in flight. It also postpones the purge (in the
// query), so the reaper never deletes a record that is still being worked
// on.
func (s *Store) Checkpoint(ctx context.Context, p idem.CheckpointParams) (idem.Record, error) {
	var rec idem.Record
	var refusal error
	err := s.inTx(ctx, "checkpoint key", func(q *dbsqlc.Queries, now time.Time) error {
		stored, err := getKey(ctx, q, p.TenantID, p.Key, now)
		if err != nil {
			return err
		}
		if refusal = idem.CheckWrite(stored, p.FencingToken); refusal != nil {
			return queueLeaseLost(ctx, q, stored, "checkpoint", p.FencingToken, refusal, now)
		}
		point, data := &p.RecoveryPoint, []byte(p.Data)
		size := idem.RecoveryBytes(p.RecoveryPoint, p.Data)
		grow := size - idem.RecoveryBytes(stored.RecoveryPoint, stored.RecoveryData)
		if len(p.Data) <= len(stored.RecoveryData) {
			// The data does not grow: a lease keeper's renewal, whose
			// point (at most 128 bytes) may be new, always fits.
			grow = 0
		}
		if fits, err := fitsQuota(ctx, q, p.TenantID, grow, p.StorageQuotaBytes); err != nil {
			return err
		} else if !fits {
			// No room: renew the lease only, keep the earlier point and
			// data (one writer at a time: the usage read is exact).
			point, data = nil, stored.RecoveryData
			if stored.RecoveryPoint != "" {
				point = &stored.RecoveryPoint
			}
			size = idem.RecoveryBytes(stored.RecoveryPoint, stored.RecoveryData)
			refusal = idem.CheckpointNotStored(p.TenantID, idem.RecoveryBytes(p.RecoveryPoint, p.Data), p.StorageQuotaBytes)
		}
		row, err := q.CheckpointKey(ctx, dbsqlc.CheckpointKeyParams{
			TenantID:       p.TenantID,
			Key:            p.Key,
			RecoveryPoint:  point,
			RecoveryData:   data,
			RecoveryBytes:  size,
			LeaseExpiresAt: microsPtr(now.Add(p.Lease)),
			Now:            micros(now),
		})
		if err != nil {
			return fmt.Errorf("update record: %w", err)
		}
		rec, err = recordFromRow(row, now)
		return err
	})
	if err == nil && refusal != nil {
		if errors.Is(refusal, idem.ErrStorageQuotaExceeded) {
			return rec, refusal // the lease was renewed
		}
		return idem.Record{}, refusal
	}
	return rec, err
}

// fitsQuota reports whether the tenant's usage, read in the write's
// transaction, has room for grow more bytes under quota. A write that does
// not grow the record, and a quota of 0, always fit (nothing is read).
func fitsQuota(ctx context.Context, q *dbsqlc.Queries, tenantID string, grow, quota int64) (bool, error) {
	if quota == 0 || grow <= 0 {
		return true, nil
	}
	used, err := q.TenantStoredBytes(ctx, tenantID)
	if err != nil {
		return false, fmt.Errorf("read the tenant's usage: %w", err)
	}
	return used+grow <= quota, nil
}

// Complete stores the response while the token is current, even after the
// lease ran out. Completing again with the current token and an equal
// response returns the stored record.
func (s *Store) Complete(ctx context.Context, p idem.CompleteParams) (idem.Record, error) {
	if err := p.Validate(); err != nil {
		return idem.Record{}, err
	}
	headers, err := json.Marshal(p.Response.Headers)
	if err != nil {
		return idem.Record{}, fmt.Errorf("complete key: encode headers: %w", err)
	}
	var rec idem.Record
	var refusal error
	err = s.inTx(ctx, "complete key", func(q *dbsqlc.Queries, now time.Time) error {
		stored, err := getKey(ctx, q, p.TenantID, p.Key, now)
		if err != nil {
			return err
		}
		var repeat bool
		if repeat, refusal = idem.CheckComplete(stored, p.FencingToken, p.Response); refusal != nil {
			return queueLeaseLost(ctx, q, stored, "complete", p.FencingToken, refusal, now)
		}
		if repeat {
			rec = *stored
			if idem.IsUnstored(stored.Response, p.Response) {
				refusal = idem.ResponseNotStored(p.TenantID, p.Response.Size(), p.StorageQuotaBytes)
			}
			return nil
		}
		rec, refusal, err = completeInTx(ctx, q, stored, p, headers, now)
		return err
	})
	if err == nil && refusal != nil && !errors.Is(refusal, idem.ErrStorageQuotaExceeded) {
		return idem.Record{}, refusal
	}
	if err == nil {
		s.events.Publish(p.TenantID, p.Key)
		// A response without room is answered storage_quota_exceeded with
		// the record completed in its place (idem.Store.Complete).
		return rec, refusal
	}
	return rec, err
}

// completeInTx stores the response of a complete that stored (read in the
// same transaction) and p's checks allowed: the caller's response, or the
// unstored one when it does not fit the quota (refusal then says so).
func completeInTx(ctx context.Context, q *dbsqlc.Queries, stored *idem.Record, p idem.CompleteParams, headers []byte, now time.Time) (rec idem.Record, refusal error, err error) {
	resp, unstored := p.Response, idem.UnstoredResponse(p.Response)
	// A response no bigger than the unstored one is stored whatever the
	// usage: storing it costs less.
	grow := int64(resp.Size())
	if grow <= int64(unstored.Size()) {
		grow = 0
	}
	if fits, err := fitsQuota(ctx, q, p.TenantID, grow, p.StorageQuotaBytes); err != nil {
		return idem.Record{}, nil, err
	} else if !fits {
		// Completed all the same (the work ran), without the response.
		resp = unstored
		if headers, err = json.Marshal(resp.Headers); err != nil {
			return idem.Record{}, nil, fmt.Errorf("encode headers: %w", err)
		}
		refusal = idem.ResponseNotStored(p.TenantID, p.Response.Size(), p.StorageQuotaBytes)
	}
	status := int64(resp.Status)
	headersText := string(headers)
	row, err := q.CompleteKey(ctx, dbsqlc.CompleteKeyParams{
		TenantID:             p.TenantID,
		Key:                  p.Key,
		ResponseStatus:       &status,
		ResponseHeaders:      &headersText,
		ResponseBody:         resp.Body,
		ResponseBodyEncoding: &resp.BodyEncoding,
		ResponseBytes:        int64(resp.Size()),
		Now:                  micros(now),
	})
	if err != nil {
		return idem.Record{}, nil, fmt.Errorf("update record: %w", err)
	}
	rec, err = recordFromRow(row, now)
	keepEmptyBody(&rec, resp.Body != nil)
	return rec, refusal, err
}

// keepEmptyBody gives a stored empty response body back as an empty, non-nil
// slice: the driver reads a zero-length BLOB as nil, like NULL.
func keepEmptyBody(rec *idem.Record, hasBody bool) {
	if hasBody && rec.Response != nil && rec.Response.Body == nil {
		rec.Response.Body = []byte{}
	}
}

// Release deletes the in-flight record while the token is current.
func (s *Store) Release(ctx context.Context, p idem.ReleaseParams) error {
	var refusal error
	err := s.inTx(ctx, "release key", func(q *dbsqlc.Queries, now time.Time) error {
		stored, err := getKey(ctx, q, p.TenantID, p.Key, now)
		if err != nil {
			return err
		}
		if refusal = idem.CheckWrite(stored, p.FencingToken); refusal != nil {
			return queueLeaseLost(ctx, q, stored, "release", p.FencingToken, refusal, now)
		}
		if _, err := q.ReleaseKey(ctx, dbsqlc.ReleaseKeyParams{TenantID: p.TenantID, Key: p.Key, FencingToken: p.FencingToken}); err != nil {
			return fmt.Errorf("delete record: %w", err)
		}
		return nil
	})
	if err == nil && refusal == nil {
		s.events.Publish(p.TenantID, p.Key)
	}
	if err == nil {
		return refusal
	}
	return err
}

// queueLeaseLost queues key.lease_lost when a token-guarded write is
// refused with lease_lost, in the refusing transaction (which changes
// nothing else), so the refusal is answered only once its event is stored.
// Other refusals queue nothing.
func queueLeaseLost(ctx context.Context, q *dbsqlc.Queries, stored *idem.Record, write string, token int64, verdict error, now time.Time) error {
	if stored == nil || !errors.Is(verdict, idem.ErrLeaseLost) {
		return nil
	}
	ev, err := eventpayload.LeaseLostEvent(*stored, write, token, now)
	if err != nil {
		return err
	}
	return enqueueEvent(ctx, q, ev, now)
}

// getKey reads a record observed at now; nil when absent.
func getKey(ctx context.Context, q *dbsqlc.Queries, tenantID, key string, now time.Time) (*idem.Record, error) {
	row, err := q.GetKey(ctx, dbsqlc.GetKeyParams{TenantID: tenantID, Key: key})
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read key: %w", err)
	}
	rec, err := recordFromRow(row.IdempotencyKey, now)
	if err != nil {
		return nil, err
	}
	keepEmptyBody(&rec, row.HasResponseBody != 0)
	return &rec, nil
}

// GetRecord returns the record with its response.
func (s *Store) GetRecord(ctx context.Context, p idem.GetRecordParams) (idem.Record, error) {
	stored, err := getKey(ctx, s.q, p.TenantID, p.Key, s.clock())
	if err != nil {
		return idem.Record{}, s.interpretError(err, "get key")
	}
	if stored == nil {
		return idem.Record{}, idem.KeyNotFound(p.Key)
	}
	return *stored, nil
}

// ListRecords lists a tenant's records without responses, newest first.
func (s *Store) ListRecords(ctx context.Context, p idem.ListRecordsParams) ([]idem.Record, error) {
	now := s.clock()
	arg := dbsqlc.ListKeysParams{
		TenantID:         p.TenantID,
		AfterTime:        cursorNewest,
		StateFilter:      string(p.State),
		Now:              micros(now),
		CompletionFilter: string(p.Completion),
		RowLimit:         int64(p.Limit),
	}
	if p.After != nil {
		arg.AfterTime, arg.AfterKey = micros(p.After.Time), p.After.Key
	}
	rows, err := s.q.ListKeys(ctx, arg)
	if err != nil {
		return nil, s.interpretError(err, "list keys")
	}
	return listRecords(rows, now), nil
}

// ListOrphans lists orphaned records, oldest lease expiry first.
func (s *Store) ListOrphans(ctx context.Context, p idem.ListOrphansParams) ([]idem.Record, error) {
	now := s.clock()
	arg := dbsqlc.ListOrphanKeysParams{
		Now:              micros(now),
		TenantFilter:     p.TenantID,
		CompletionFilter: string(p.Completion),
		AfterTime:        cursorOldest,
		RowLimit:         int64(p.Limit),
	}
	if p.After != nil {
		arg.AfterTime, arg.AfterTenantID, arg.AfterKey = micros(p.After.Time), p.After.TenantID, p.After.Key
	}
	rows, err := s.q.ListOrphanKeys(ctx, arg)
	if err != nil {
		return nil, s.interpretError(err, "list orphans")
	}
	return listRecords(rows, now), nil
}

// OrphanStats returns the orphan count and oldest lease expiry per tenant,
// ordered by tenant id.
func (s *Store) OrphanStats(ctx context.Context) ([]idem.OrphanStat, error) {
	now := s.clock()
	rows, err := s.q.OrphanStats(ctx, micros(now))
	if err != nil {
		return nil, s.interpretError(err, "orphan stats")
	}
	out := make([]idem.OrphanStat, 0, len(rows))
	for _, r := range rows {
		out = append(out, idem.OrphanStat{
			TenantID:          r.TenantID,
			Count:             r.Orphans,
			OldestLeaseExpiry: timeOf(r.OldestLeaseExpiry),
			ObservedAt:        now,
		})
	}
	return out, nil
}

// Reap deletes one batch of at most p.Limit records past purge_after (never
// an in-flight one whose lease still runs) in one short statement, and
// returns them without responses. SQLite serializes writers, so concurrent
// reapers never delete a record twice.
//
// Every in-flight record it deletes is reported as key.reaped_in_flight in
// the same transaction.
func (s *Store) Reap(ctx context.Context, p idem.ReapParams) ([]idem.Record, error) {
	var out []idem.Record
	err := s.inTx(ctx, "reap keys", func(q *dbsqlc.Queries, now time.Time) error {
		rows, err := q.ReapKeys(ctx, dbsqlc.ReapKeysParams{Now: micros(now), RowLimit: int64(p.Limit)})
		if err != nil {
			return err
		}
		out = listRecords(rows, now)
		return queueReaped(ctx, q, out, now)
	})
	if err != nil {
		return nil, err
	}
	for _, r := range out {
		s.events.Publish(r.TenantID, r.Key)
	}
	return out, nil
}

// queueReaped queues key.reaped_in_flight for each in-flight record among
// reaped, through the reaper's transaction.
func queueReaped(ctx context.Context, q *dbsqlc.Queries, reaped []idem.Record, now time.Time) error {
	for _, rec := range reaped {
		if rec.State != idem.StateInFlight {
			continue
		}
		ev, err := eventpayload.RecordEvent(idem.EventKeyReapedInFlight, rec, now)
		if err != nil {
			return err
		}
		if err := enqueueEvent(ctx, q, ev, now); err != nil {
			return err
		}
	}
	return nil
}
