package idem

import (
	"context"
	"encoding/json"
	"errors"
	"time"
)

// Store is the ledger's storage. Every decision on a key is made atomically
// by the database; a Store keeps nothing in memory that matters, so any
// number of service replicas may share one database.
//
// Every method that touches keys filters by tenant first: a tenant never sees
// or collides with another tenant's keys.
//
// Times come from the database clock (or from the test clock a backend was
// opened with). Every returned Record has ObservedAt set to that clock.
//
// Errors are *Error values; an unreachable database is CodeStoreUnavailable.
// Inputs are validated by callers (keys, settings, ids); a Store trusts them.
type Store interface {
	// Claim applies the claim state machine (DecideClaim) atomically.
	// It returns ErrRequestInFlight (with RetryAfter = lease left) or
	// ErrFingerprintMismatch for the rejecting rows.
	Claim(ctx context.Context, p ClaimParams) (ClaimResult, error)

	// Checkpoint saves a recovery point and renews the lease. It is accepted
	// while the token is current, even after the lease ran out, as long as
	// nobody took over. It returns ErrKeyNotFound, ErrLeaseLost, or
	// ErrAlreadyCompleted when the record is already completed. When the
	// new recovery data is bigger than the record's and the record would
	// grow past the tenant's quota (CheckpointParams.StorageQuotaBytes), it
	// renews the lease and the purge time only, keeps the recovery point and data the record
	// had, and returns the record with a storage_quota_exceeded error
	// (CheckpointNotStored).
	Checkpoint(ctx context.Context, p CheckpointParams) (Record, error)

	// Complete stores the response and marks the record completed; the
	// replay window starts now. It is accepted while the token is current,
	// even after the lease ran out. Completing again with the same token and
	// an equal response is a no-op that returns the stored record. It returns
	// ErrKeyNotFound, ErrLeaseLost, or ErrAlreadyCompleted when the stored
	// response differs; invalid_request, the record untouched, for params
	// CompleteParams.Validate refuses (a status outside 100–599).
	//
	// When the response does not fit the tenant's quota
	// (CompleteParams.StorageQuotaBytes), Complete completes the record
	// all the same, with UnstoredResponse(p.Response) in place of the
	// response, and returns that record together with a
	// storage_quota_exceeded error (ResponseNotStored): the work ran, so
	// the key must not become runnable again, and the caller must learn
	// that its answer is not kept. Completing it again with the same
	// response answers the same.
	Complete(ctx context.Context, p CompleteParams) (Record, error)

	// Release deletes an in-flight record whose token is current, so the next
	// claim starts afresh. It returns ErrKeyNotFound, ErrLeaseLost, or
	// ErrAlreadyCompleted when the record is completed (a stored response is
	// never thrown away by a release).
	Release(ctx context.Context, p ReleaseParams) error

	// Resolve applies a person's resolution of a record (see ResolveAction
	// and CheckResolve) and writes its audit entry in the same transaction:
	// a resolution is never stored without its audit entry, nor the other
	// way round. It returns CheckResolve's errors. Concurrent resolutions
	// and writes of one record are decided one after the other: at most one
	// release or completion applies. Params ResolveParams.Validate refuses
	// are invalid_request, the record untouched.
	Resolve(ctx context.Context, p ResolveParams) (Resolution, error)

	// ListAudit returns audit entries, newest first by (CreatedAt, ID), for
	// one key, one tenant or every tenant, paginated by keyset. Entries
	// outlive the record they name and go with their tenant.
	ListAudit(ctx context.Context, p ListAuditParams) ([]AuditEntry, error)

	// GetRecord returns the record with its response and recovery data. It
	// returns ErrKeyNotFound.
	GetRecord(ctx context.Context, p GetRecordParams) (Record, error)

	// ListRecords returns a tenant's records without responses and recovery
	// data (Response and RecoveryData are nil: a page stays small whatever
	// the records hold; GetRecord has them), newest first by (CreatedAt, Key), filtered by
	// API state and paginated by keyset.
	ListRecords(ctx context.Context, p ListRecordsParams) ([]Record, error)

	// ListOrphans returns orphaned records, oldest lease expiry first by
	// (LeaseExpiresAt, TenantID, Key), across all tenants or for one tenant,
	// without responses and recovery data.
	ListOrphans(ctx context.Context, p ListOrphansParams) ([]Record, error)

	// OrphanStats returns, per tenant that has orphans, their number and the
	// oldest lease expiry. It uses the partial index on in-flight leases and
	// never scans completed records.
	OrphanStats(ctx context.Context) ([]OrphanStat, error)

	// Reap deletes at most p.Limit records that are past PurgeAfter, and
	// returns what it deleted (without responses and recovery data). It never deletes an
	// in-flight record whose lease still runs, whatever its PurgeAfter, and
	// it keeps the records of disabled tenants like any others. Concurrent
	// callers on several replicas never delete the same record twice and
	// never block each other for long.
	Reap(ctx context.Context, p ReapParams) ([]Record, error)

	// CreateTenant creates a tenant. It returns ErrTenantExists.
	CreateTenant(ctx context.Context, p CreateTenantParams) (Tenant, error)
	// GetTenant returns a tenant, disabled or not. It returns
	// ErrTenantNotFound.
	GetTenant(ctx context.Context, p GetTenantParams) (Tenant, error)
	// ListTenants returns every tenant ordered by id.
	ListTenants(ctx context.Context) ([]Tenant, error)
	// UpdateTenant replaces a tenant's name, settings and disabled flag. It
	// returns ErrTenantNotFound. Disabling keeps every record.
	UpdateTenant(ctx context.Context, p UpdateTenantParams) (Tenant, error)
	// DeleteTenant deletes a tenant and all of its records at once; it is
	// the only way a tenant's records go before their purge time. It returns
	// ErrTenantNotFound.
	DeleteTenant(ctx context.Context, p DeleteTenantParams) error

	// Ping checks that the database can serve: that it answers, and where
	// an engine can keep answering reads while refusing writes (SQLite on
	// a full disk or a read-only file), that it takes a write. It returns
	// ErrStoreUnavailable otherwise; GET /readyz reports it.
	Ping(ctx context.Context) error
	// Close releases the store's connections.
	Close() error
}

// ErrNoLedger is what a store's Open returns, wrapped, when it was asked to
// open an existing ledger and the database holds none: a missing SQLite file
// (deleted, a volume not mounted) or a database without idem's tables. The
// server then refuses to start rather than begin an empty ledger, where every
// earlier key would run again and fencing tokens would restart at 1.
var ErrNoLedger = errors.New("no idem ledger in this database")

// CheckpointParams are the inputs of Store.Checkpoint.
type CheckpointParams struct {
	TenantID      string
	Key           string
	FencingToken  int64
	RecoveryPoint string
	// Data is the recovery data to save; nil keeps none.
	Data json.RawMessage
	// Lease is the renewed lease, counted from now.
	Lease time.Duration
	// StorageQuotaBytes is the tenant's storage_quota_bytes, checked in the
	// checkpoint's statement when its data is bigger than the record's
	// (see CompleteParams.StorageQuotaBytes). A checkpoint whose data does
	// not grow is never refused: a lease keeper's renewal, whose new point
	// is at most MaxRecoveryPointBytes, must not lose its lease to the
	// quota. 0 checks nothing.
	StorageQuotaBytes int64
}

// CompleteParams are the inputs of Store.Complete.
type CompleteParams struct {
	TenantID     string
	Key          string
	FencingToken int64
	Response     Response
	// StorageQuotaBytes is the tenant's storage_quota_bytes: the response
	// is stored only if the tenant's usage, read in the complete's own
	// statement or transaction, plus Response.Size() stays within it;
	// otherwise UnstoredResponse is stored in its place. Unlike a claim's
	// (Tenant.ClaimQuota) the check is made on every complete: its bytes
	// are up to max_response_bytes, not a claim's few dozen. 0 checks
	// nothing.
	StorageQuotaBytes int64
}

// Validate checks what every store refuses in a completion, whoever sent
// it: a status outside 100–599 (ValidateResponseStatus). It returns an
// invalid_request *Error, or nil; the record is left as it was.
func (p CompleteParams) Validate() error {
	return ValidateResponseStatus(p.Response.Status)
}

// ReleaseParams are the inputs of Store.Release.
type ReleaseParams struct {
	TenantID     string
	Key          string
	FencingToken int64
}

// GetRecordParams are the inputs of Store.GetRecord.
type GetRecordParams struct {
	TenantID string
	Key      string
}

// Cursor is a keyset position in a listing: the sort time and the identity
// of the last row returned.
type Cursor struct {
	Time     time.Time
	TenantID string
	Key      string
	// ID is the id of the last audit entry of an audit listing.
	ID int64
}

// ListRecordsParams are the inputs of Store.ListRecords.
type ListRecordsParams struct {
	TenantID string
	// State filters by API state; "" lists every state.
	State State
	// Completion filters by the completer's hold (unknown, review); ""
	// lists every record.
	Completion CompletionFilter
	Limit      int
	// After continues after the last row of a previous page: rows strictly
	// older than (After.Time, After.Key) by (CreatedAt, Key) descending.
	After *Cursor
}

// ListOrphansParams are the inputs of Store.ListOrphans.
type ListOrphansParams struct {
	// TenantID limits the list to one tenant; "" lists every tenant.
	TenantID string
	// Completion filters by the completer's hold (unknown, review); ""
	// lists every orphan. The completer's records in unknown and review
	// are orphans (their lease ended), held from retries.
	Completion CompletionFilter
	Limit      int
	// After continues after (After.Time, After.TenantID, After.Key) by
	// (LeaseExpiresAt, TenantID, Key) ascending.
	After *Cursor
}

// ListAuditParams are the inputs of Store.ListAudit.
type ListAuditParams struct {
	// TenantID limits the list to one tenant; "" lists every tenant.
	TenantID string
	// Key limits the list to one key of TenantID; "" lists every key.
	Key   string
	Limit int
	// After continues after (After.Time, After.ID) by (CreatedAt, ID)
	// descending.
	After *Cursor
}

// OrphanStat is the orphan summary of one tenant.
type OrphanStat struct {
	TenantID string
	Count    int64
	// OldestLeaseExpiry is the earliest lease expiry among the orphans.
	OldestLeaseExpiry time.Time
	// ObservedAt is the database clock when the stat was taken.
	ObservedAt time.Time
}

// ReapParams are the inputs of Store.Reap.
type ReapParams struct {
	Limit int
}

// CreateTenantParams are the inputs of Store.CreateTenant.
type CreateTenantParams struct {
	ID       string
	Name     string
	Settings Settings
}

// GetTenantParams are the inputs of Store.GetTenant.
type GetTenantParams struct {
	ID string
}

// UpdateTenantParams are the inputs of Store.UpdateTenant.
type UpdateTenantParams struct {
	ID       string
	Name     string
	Settings Settings
	Disabled bool
}

// DeleteTenantParams are the inputs of Store.DeleteTenant.
type DeleteTenantParams struct {
	ID string
}
