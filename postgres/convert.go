package postgres

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/postgres/internal/dbsqlc"
)

// listRow is the shape of every query that returns records without their
// responses and recovery data: the listing, orphan and reap queries select
// the same columns, so a listing stays small whatever the records hold.
type listRow = dbsqlc.ListKeysRow

// recordFromRow converts a whole record, response included, observed at
// observedAt.
func recordFromRow(k dbsqlc.IdempotencyKey, observedAt pgtype.Timestamptz) (idem.Record, error) {
	rec := recordFromWriteRow(writeRow{
		TenantID:               k.TenantID,
		Key:                    k.Key,
		State:                  k.State,
		Operation:              k.Operation,
		Fingerprint:            k.Fingerprint,
		FencingToken:           k.FencingToken,
		Attempt:                k.Attempt,
		LeaseExpiresAt:         k.LeaseExpiresAt,
		RecoveryPoint:          k.RecoveryPoint,
		ReplayWindowSeconds:    k.ReplayWindowSeconds,
		ReaperThresholdSeconds: k.ReaperThresholdSeconds,
		CreatedAt:              k.CreatedAt,
		UpdatedAt:              k.UpdatedAt,
		CompletedAt:            k.CompletedAt,
		ReplayUntil:            k.ReplayUntil,
		PurgeAfter:             k.PurgeAfter,
		ReviewNote:             k.ReviewNote,
		ReviewAt:               k.ReviewAt,
		RecoveryData:           k.RecoveryData,
		AttemptID:              k.AttemptID,
		ObservedAt:             observedAt,
	})
	rec.Completion = completionOf(k.CompleterState, k.CompleterID, k.CompleterAttempts, k.CompleterNextAt, k.CompleterDeadline)
	return withResponse(rec, k.ResponseStatus, k.ResponseHeaders, k.ResponseBody, k.ResponseBodyEncoding)
}

// withResponse adds a stored response (none when status is NULL) to rec.
func withResponse(rec idem.Record, status *int32, headers, body []byte, encoding *string) (idem.Record, error) {
	if status == nil {
		return rec, nil
	}
	resp := &idem.Response{Status: int(*status), Body: body}
	if encoding != nil {
		resp.BodyEncoding = *encoding
	}
	if err := json.Unmarshal(headers, &resp.Headers); err != nil {
		return idem.Record{}, fmt.Errorf("decode stored response headers of key '%s': %w", rec.Key, err)
	}
	rec.Response = resp
	return rec, nil
}

// cursorNewest and cursorOldest are the keyset cursors of a first page: a
// newest-first listing starts below +infinity, an oldest-first one above
// -infinity, so each listing is one statement whose cursor bounds its index
// scan (SQLite's store passes the largest and smallest integers).
var (
	cursorNewest = pgtype.Timestamptz{InfinityModifier: pgtype.Infinity, Valid: true}
	cursorOldest = pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true}
)

// writeRow is the shape the writes return (CheckpointKey; ClaimKey with
// columns more; CompleteKey only what its caller does not know,
// completedRow): a record without its response. After a claim the
// response is NULL; after a complete it is the one the caller just
// stored, so it is not read back (a large body would cross the wire
// twice).
type writeRow = dbsqlc.CheckpointKeyRow

// recordFromWriteRow converts a record without its response (recordFromRow
// adds a stored one; a complete, the one it was given).
func recordFromWriteRow(r writeRow) idem.Record {
	rec := recordFromListRow(listRow{
		TenantID:               r.TenantID,
		Key:                    r.Key,
		State:                  r.State,
		Operation:              r.Operation,
		Fingerprint:            r.Fingerprint,
		FencingToken:           r.FencingToken,
		Attempt:                r.Attempt,
		LeaseExpiresAt:         r.LeaseExpiresAt,
		RecoveryPoint:          r.RecoveryPoint,
		ReplayWindowSeconds:    r.ReplayWindowSeconds,
		ReaperThresholdSeconds: r.ReaperThresholdSeconds,
		CreatedAt:              r.CreatedAt,
		UpdatedAt:              r.UpdatedAt,
		CompletedAt:            r.CompletedAt,
		ReplayUntil:            r.ReplayUntil,
		PurgeAfter:             r.PurgeAfter,
		ReviewNote:             r.ReviewNote,
		ReviewAt:               r.ReviewAt,
		ObservedAt:             r.ObservedAt,
	})
	if r.RecoveryData != nil {
		rec.RecoveryData = json.RawMessage(r.RecoveryData)
	}
	if r.AttemptID != nil {
		rec.AttemptID = *r.AttemptID
	}
	return rec
}

// recordFromListRow converts a record without its response and recovery
// data.
func recordFromListRow(r listRow) idem.Record {
	rec := idem.Record{
		TenantID:        r.TenantID,
		Key:             r.Key,
		State:           idem.State(r.State),
		Operation:       r.Operation,
		Fingerprint:     r.Fingerprint,
		FencingToken:    r.FencingToken,
		Attempt:         int(r.Attempt),
		LeaseExpiresAt:  timeOf(r.LeaseExpiresAt),
		ReplayWindow:    time.Duration(r.ReplayWindowSeconds) * time.Second,
		ReaperThreshold: time.Duration(r.ReaperThresholdSeconds) * time.Second,
		CreatedAt:       timeOf(r.CreatedAt),
		UpdatedAt:       timeOf(r.UpdatedAt),
		CompletedAt:     timeOf(r.CompletedAt),
		ReplayUntil:     timeOf(r.ReplayUntil),
		PurgeAfter:      timeOf(r.PurgeAfter),
		ObservedAt:      timeOf(r.ObservedAt),
	}
	if r.RecoveryPoint != nil {
		rec.RecoveryPoint = *r.RecoveryPoint
	}
	if r.ReviewAt.Valid {
		rec.Review = &idem.Review{At: timeOf(r.ReviewAt)}
		if r.ReviewNote != nil {
			rec.Review.Note = *r.ReviewNote
		}
	}
	rec.Completion = completionOf(r.CompleterState, r.CompleterID, r.CompleterAttempts, r.CompleterNextAt, r.CompleterDeadline)
	return rec
}

// completionOf converts the completer's columns; nil when it never took
// the record or let it go.
func completionOf(state, id *string, attempts int32, next, deadline pgtype.Timestamptz) *idem.Completion {
	if state == nil {
		return nil
	}
	c := &idem.Completion{State: idem.CompletionState(*state), Attempts: int(attempts), NextAttemptAt: timeOf(next), Deadline: timeOf(deadline)}
	if id != nil {
		c.CompleterID = *id
	}
	return c
}

// auditFromRow converts a key_audit row.
func auditFromRow(a dbsqlc.KeyAudit) idem.AuditEntry {
	e := idem.AuditEntry{
		ID:           a.ID,
		TenantID:     a.TenantID,
		Key:          a.Key,
		Action:       idem.ResolveAction(a.Action),
		FencingToken: a.FencingToken,
		Note:         a.Note,
		Actor:        idem.Actor{Subject: a.ActorSubject, Tenant: a.ActorTenant, Scope: a.ActorScope},
		CreatedAt:    timeOf(a.CreatedAt),
	}
	if a.NewFencingToken != nil {
		e.NewFencingToken = *a.NewFencingToken
	}
	return e
}

// listRecords converts rows of any list-shaped query.
func listRecords[R ~struct {
	TenantID               string
	Key                    string
	State                  string
	Operation              string
	Fingerprint            string
	FencingToken           int64
	Attempt                int32
	LeaseExpiresAt         pgtype.Timestamptz
	RecoveryPoint          *string
	ReplayWindowSeconds    int32
	ReaperThresholdSeconds int32
	CreatedAt              pgtype.Timestamptz
	UpdatedAt              pgtype.Timestamptz
	CompletedAt            pgtype.Timestamptz
	ReplayUntil            pgtype.Timestamptz
	PurgeAfter             pgtype.Timestamptz
	ReviewNote             *string
	ReviewAt               pgtype.Timestamptz
	CompleterState         *string
	CompleterID            *string
	CompleterAttempts      int32
	CompleterNextAt        pgtype.Timestamptz
	CompleterDeadline      pgtype.Timestamptz
	ObservedAt             pgtype.Timestamptz
}](rows []R) []idem.Record {
	out := make([]idem.Record, 0, len(rows))
	for _, r := range rows {
		out = append(out, recordFromListRow(listRow(r)))
	}
	return out
}

// tenantFromRow converts a tenants row and the tenant's usage.
func tenantFromRow(t dbsqlc.Tenant, storedBytes int64) idem.Tenant {
	return idem.Tenant{
		ID:   t.ID,
		Name: t.Name,
		Settings: idem.Settings{
			ReplayWindowSeconds:    int(t.ReplayWindowSeconds),
			ReaperThresholdSeconds: int(t.ReaperThresholdSeconds),
			LeaseSecondsDefault:    int(t.LeaseSecondsDefault),
			LeaseSecondsMax:        int(t.LeaseSecondsMax),
			MaxResponseBytes:       int(t.MaxResponseBytes),
			RateLimitPerSecond:     int(t.RateLimitPerSecond),
			MaxWaitSeconds:         int(t.MaxWaitSeconds),
			StorageQuotaBytes:      t.StorageQuotaBytes,
			RetryBudgetPercent:     int(t.RetryBudgetPercent),
		},
		Disabled:    t.DisabledAt.Valid,
		CreatedAt:   timeOf(t.CreatedAt),
		UpdatedAt:   timeOf(t.UpdatedAt),
		StoredBytes: storedBytes,
	}
}

// timeOf returns the UTC instant of a timestamptz, or the zero time for NULL.
func timeOf(t pgtype.Timestamptz) time.Time {
	if !t.Valid {
		return time.Time{}
	}
	return t.Time.UTC()
}

// micros converts a duration to whole microseconds for interval arithmetic.
func micros(d time.Duration) int64 { return d.Microseconds() }

// seconds converts a duration to whole seconds for the settings columns.
func seconds(d time.Duration) int32 { return int32(d / time.Second) }

// nullIfEmpty returns nil for "", else a pointer to s: an optional text
// column.
func nullIfEmpty(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// fromRows converts the rows of a list query with the row's converter: the
// loop every List method would otherwise write again.
func fromRows[R, T any](rows []R, convert func(R) T) []T {
	out := make([]T, 0, len(rows))
	for _, r := range rows {
		out = append(out, convert(r))
	}
	return out
}
