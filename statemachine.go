package idem

import (
	"errors"
	"time"
)

// The claim state machine is written once, here, in Go. The SQLite store runs
// it as is inside one BEGIN IMMEDIATE transaction. The PostgreSQL store runs
// the same table in SQL on purpose, as one atomic upsert (ClaimKey in
// db/queries/postgres/keys.sql: create, takeover and "expired counts as
// absent" in its ON CONFLICT ... WHERE), and calls DecideClaim only to
// explain a refusal (replay, in flight, mismatch) from the row it then reads.
// The storetest conformance suite keeps the SQL in step with DecideClaim:
// the Claim group (AbsentCreates, InFlightRejected,
// InFlightMismatchCheckedFirst, OrphanTakeover, OrphanBoundary,
// OrphanMismatch, CompletedReplay, CompletedMismatch, ExpiredCreatesAfresh,
// ExpiredBoundary, DatabaseClockLeaseExpiry) covers every row of the table
// and its boundaries, and the Concurrency group (ClaimRace, TakeoverRace)
// the atomicity; statemachine_test.go tests DecideClaim itself. A change to
// the table changes DecideClaim, ClaimKey and a storetest case together.

// ClaimAction is what the state machine decides for an incoming claim.
type ClaimAction int

// The outcomes of DecideClaim, one per row of the contract's claim table.
const (
	// ActionCreate: the key is absent or expired; create a fresh in-flight
	// record with attempt 1 and a new fencing token.
	ActionCreate ClaimAction = iota + 1
	// ActionTakeover: the key is orphaned and the claim matches; take it
	// over with attempt+1, a new fencing token, and the recovery point kept.
	ActionTakeover
	// ActionReplay: the key is completed within its replay window and the
	// claim matches; return the stored response.
	ActionReplay
	// ActionRejectInFlight: the key is in flight with a running lease.
	ActionRejectInFlight
	// ActionRejectMismatch: the key is live and was first used with another
	// fingerprint or operation.
	ActionRejectMismatch
	// ActionRecover: the key is in flight with a running lease that the
	// same request claimed under the same attempt id: the claim's own answer
	// was lost. The attempt is handed back as it is (same fencing token,
	// attempt and recovery point) with its lease renewed from now.
	ActionRecover
	// ActionRejectUnknown: the completer holds the key (completer.go): the
	// first attempt died and its outcome is being found out. A retry never
	// takes it over; it may come back at the next completer attempt.
	ActionRejectUnknown
	// ActionRejectReview: the completer flagged the key for review; only a
	// person's resolution moves it on.
	ActionRejectReview
)

// String returns the action's name.
func (a ClaimAction) String() string {
	switch a {
	case ActionCreate:
		return "create"
	case ActionTakeover:
		return "takeover"
	case ActionReplay:
		return "replay"
	case ActionRejectInFlight:
		return "reject_in_flight"
	case ActionRejectMismatch:
		return "reject_mismatch"
	case ActionRecover:
		return "recover"
	case ActionRejectUnknown:
		return "reject_unknown"
	case ActionRejectReview:
		return "reject_review"
	}
	return "unknown"
}

// ClaimParams are the inputs of Store.Claim. The durations come from the
// tenant's settings at the time of the claim.
type ClaimParams struct {
	TenantID    string
	Key         string
	Operation   string
	Fingerprint string
	// AttemptID is the client-chosen id of this attempt ("" for none): a
	// claim whose answer was lost, sent again with the same id, gets its own
	// lease back (ActionRecover) instead of request_in_flight.
	AttemptID string
	// Lease is how long the claim is protected.
	Lease time.Duration
	// ReplayWindow and ReaperThreshold are recorded on a created record.
	ReplayWindow    time.Duration
	ReaperThreshold time.Duration
	// StorageQuotaBytes is the quota the claim is checked against
	// (Tenant.ClaimQuota): a claim that would create a record (the key
	// absent or expired) while the tenant's records store that many bytes
	// or more is refused with storage_quota_exceeded. A takeover, recovery
	// or replay is never refused for it. 0 checks no quota.
	StorageQuotaBytes int64
}

// ClaimResult is the outcome of a successful claim.
type ClaimResult struct {
	// Action is ActionCreate, ActionTakeover, ActionRecover or ActionReplay.
	Action ClaimAction
	Record Record
}

// DecideClaim applies the claim state machine to the stored record (nil when
// absent) for the claim p at database instant now. Backends call it inside
// the transaction or statement that makes the decision atomic; it never
// touches storage itself.
//
// The fingerprint and operation are compared before the lease: a different
// request on a live key is a mismatch even while it is in flight. A running
// lease held under the claim's own attempt id is recovered, any other is
// request_in_flight; once the lease has run out, even the same attempt id
// takes over with a new fencing token.
func DecideClaim(stored *Record, p ClaimParams, now time.Time) ClaimAction {
	if stored == nil {
		return ActionCreate
	}
	state := stored.StateAt(now)
	if state == StateExpired {
		return ActionCreate
	}
	if stored.Operation != p.Operation || stored.Fingerprint != p.Fingerprint {
		return ActionRejectMismatch
	}
	if c := stored.Completion; c != nil && state != StateCompleted {
		// A key the completer held that a person flagged for review
		// meanwhile is no longer picked (CompleterStore.PickCompletions):
		// it waits for the person as one the completer gave up on.
		if c.State == CompletionReview || stored.Review != nil {
			return ActionRejectReview
		}
		return ActionRejectUnknown
	}
	switch state {
	case StateInFlight:
		if p.AttemptID != "" && stored.AttemptID == p.AttemptID {
			return ActionRecover
		}
		return ActionRejectInFlight
	case StateOrphaned:
		return ActionTakeover
	default:
		return ActionReplay
	}
}

// ClaimError returns the error for a rejecting action on the stored record
// observed at now, or nil for an action that succeeds.
func ClaimError(action ClaimAction, stored *Record, now time.Time) error {
	switch action {
	case ActionRejectInFlight:
		left := max(stored.LeaseExpiresAt.Sub(now), 0)
		return &Error{
			Code:       CodeRequestInFlight,
			Detail:     "key '" + stored.Key + "' is being processed by another request",
			RetryAfter: left,
		}
	case ActionRejectMismatch:
		return &Error{
			Code:   CodeFingerprintMismatch,
			Detail: "key '" + stored.Key + "' was first used with a different request",
		}
	case ActionRejectUnknown:
		return &Error{
			Code:       CodeOutcomeUnknown,
			Detail:     "key '" + stored.Key + "': its first attempt stopped without an answer and idem's completer is finding out what happened; retry after Retry-After (the next completer attempt)",
			RetryAfter: stored.Completion.RetryAt(*stored, now),
		}
	case ActionRejectReview:
		return &Error{
			Code:   CodeOutcomeReview,
			Detail: "key '" + stored.Key + "': the outcome of its first attempt is unknown and waits for a person's review; a retry is refused until the key is resolved (released or completed)",
		}
	}
	return nil
}

// KeyNotFound returns the key_not_found error for a read of key.
func KeyNotFound(key string) *Error {
	return Errorf(CodeKeyNotFound, "no record for key '%s'", key)
}

// CheckToken returns the error for a write (checkpoint, complete, release)
// that presents token on the stored record (nil when absent): ErrKeyNotFound,
// ErrLeaseLost, or nil when the token is the current one. What a current
// token may do on a completed record is up to each write.
func CheckToken(stored *Record, token int64) error {
	if stored == nil {
		return Errorf(CodeKeyNotFound, "no record for this key")
	}
	if stored.FencingToken != token {
		return &Error{
			Code:   CodeLeaseLost,
			Detail: "fencing token is not the current one for key '" + stored.Key + "'; another request took it over or it was released",
		}
	}
	return nil
}

// CheckWrite returns the error for a checkpoint or release that presents
// token on the stored record (nil when absent): CheckToken's errors, or
// ErrAlreadyCompleted when the token is current but the record is
// completed, since a stored response is never changed or thrown away. Nil
// means the write may apply.
func CheckWrite(stored *Record, token int64) error {
	if err := CheckToken(stored, token); err != nil {
		return err
	}
	if stored.State == StateCompleted {
		return &Error{Code: CodeAlreadyCompleted, Detail: "key '" + stored.Key + "' is already completed"}
	}
	return nil
}

// CheckComplete is CheckWrite for a complete that stores resp. Completing
// again with the current token and an equal response is a no-op: it
// returns repeat true and no error, and the caller answers with the stored
// record. So is completing again a record that holds UnstoredResponse(resp)
// (the first complete of resp found no room under the quota): the caller
// answers as the first time (IsUnstored). A different response on a
// completed record is ErrAlreadyCompleted.
func CheckComplete(stored *Record, token int64, resp Response) (repeat bool, err error) {
	err = CheckWrite(stored, token)
	if errors.Is(err, ErrAlreadyCompleted) && stored.Response != nil &&
		(stored.Response.Equal(resp) || IsUnstored(stored.Response, resp)) {
		return true, nil
	}
	return false, err
}
