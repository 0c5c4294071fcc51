package sqlite

import (
	"encoding/json"
	"fmt"
	"math"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/sqlite/internal/dbsqlc"
)

// listRow is the shape of every query that returns records without their
// responses and recovery data: the listing, orphan and reap queries select
// the same columns, so a listing stays small whatever the records hold.
type listRow = dbsqlc.ListKeysRow

// recordFromRow converts a whole record, response included, observed at now.
func recordFromRow(k dbsqlc.IdempotencyKey, now time.Time) (idem.Record, error) {
	rec := recordFromListRow(listRow{
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
		CompleterState:         k.CompleterState,
		CompleterID:            k.CompleterID,
		CompleterAttempts:      k.CompleterAttempts,
		CompleterNextAt:        k.CompleterNextAt,
		CompleterDeadline:      k.CompleterDeadline,
	}, now)
	if k.RecoveryData != nil {
		rec.RecoveryData = json.RawMessage(k.RecoveryData)
	}
	if k.AttemptID != nil {
		rec.AttemptID = *k.AttemptID
	}
	if k.ResponseStatus == nil {
		return rec, nil
	}
	resp := &idem.Response{Status: int(*k.ResponseStatus), Body: k.ResponseBody}
	if k.ResponseBodyEncoding != nil {
		resp.BodyEncoding = *k.ResponseBodyEncoding
	}
	if k.ResponseHeaders != nil {
		if err := json.Unmarshal([]byte(*k.ResponseHeaders), &resp.Headers); err != nil {
			return idem.Record{}, fmt.Errorf("decode stored response headers of key '%s': %w", k.Key, err)
		}
	}
	rec.Response = resp
	return rec, nil
}

// recordFromListRow converts a record without its response and recovery
// data, observed at now.
func recordFromListRow(r listRow, now time.Time) idem.Record {
	rec := idem.Record{
		TenantID:        r.TenantID,
		Key:             r.Key,
		State:           idem.State(r.State),
		Operation:       r.Operation,
		Fingerprint:     r.Fingerprint,
		FencingToken:    r.FencingToken,
		Attempt:         int(r.Attempt),
		LeaseExpiresAt:  timeOrZero(r.LeaseExpiresAt),
		ReplayWindow:    time.Duration(r.ReplayWindowSeconds) * time.Second,
		ReaperThreshold: time.Duration(r.ReaperThresholdSeconds) * time.Second,
		CreatedAt:       timeOf(r.CreatedAt),
		UpdatedAt:       timeOf(r.UpdatedAt),
		CompletedAt:     timeOrZero(r.CompletedAt),
		ReplayUntil:     timeOrZero(r.ReplayUntil),
		PurgeAfter:      timeOf(r.PurgeAfter),
		ObservedAt:      now,
	}
	if r.RecoveryPoint != nil {
		rec.RecoveryPoint = *r.RecoveryPoint
	}
	if r.ReviewAt != nil {
		rec.Review = &idem.Review{At: timeOf(*r.ReviewAt)}
		if r.ReviewNote != nil {
			rec.Review.Note = *r.ReviewNote
		}
	}
	if r.CompleterState != nil {
		rec.Completion = &idem.Completion{
			State: idem.CompletionState(*r.CompleterState), Attempts: int(r.CompleterAttempts),
			NextAttemptAt: timeOrZero(r.CompleterNextAt), Deadline: timeOrZero(r.CompleterDeadline),
		}
		if r.CompleterID != nil {
			rec.Completion.CompleterID = *r.CompleterID
		}
	}
	return rec
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

// listRecords converts rows of any list-shaped query, observed at now.
func listRecords[R ~struct {
	TenantID               string
	Key                    string
	State                  string
	Operation              string
	Fingerprint            string
	FencingToken           int64
	Attempt                int64
	LeaseExpiresAt         *int64
	RecoveryPoint          *string
	ReplayWindowSeconds    int64
	ReaperThresholdSeconds int64
	CreatedAt              int64
	UpdatedAt              int64
	CompletedAt            *int64
	ReplayUntil            *int64
	PurgeAfter             int64
	ReviewNote             *string
	ReviewAt               *int64
	CompleterState         *string
	CompleterID            *string
	CompleterAttempts      int64
	CompleterNextAt        *int64
	CompleterDeadline      *int64
}](rows []R, now time.Time) []idem.Record {
	out := make([]idem.Record, 0, len(rows))
	for _, r := range rows {
		out = append(out, recordFromListRow(listRow(r), now))
	}
	return out
}

// tenantFromRow converts a tenants row.
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
		Disabled:    t.DisabledAt != nil,
		CreatedAt:   timeOf(t.CreatedAt),
		UpdatedAt:   timeOf(t.UpdatedAt),
		StoredBytes: storedBytes,
	}
}

// micros returns t as unix microseconds, the database's representation of
// an instant.
func micros(t time.Time) int64 { return t.UnixMicro() }

// microsPtr returns a pointer to t as unix microseconds.
func microsPtr(t time.Time) *int64 {
	us := micros(t)
	return &us
}

// timeOf returns the UTC instant of unix microseconds.
func timeOf(us int64) time.Time { return time.UnixMicro(us).UTC() }

// timeOrZero returns the instant of a nullable column, zero for NULL.
func timeOrZero(us *int64) time.Time {
	if us == nil {
		return time.Time{}
	}
	return timeOf(*us)
}

// seconds returns d in whole seconds.
func seconds(d time.Duration) int64 { return int64(d / time.Second) }

// First-page keyset positions: every row sorts after (before, for the
// newest-first listing) these.
const (
	cursorNewest = math.MaxInt64
	cursorOldest = math.MinInt64
)

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
