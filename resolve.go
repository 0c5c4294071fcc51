package idem

import (
	"fmt"
	"slices"
	"time"
	"unicode/utf8"
)

// Resolving an orphan: a person (a tenant admin for the tenant's own keys,
// an operator for any tenant) decides what happens to a record its worker
// left in flight. The rules live here once; both stores apply them inside
// the transaction that writes the resolution and its audit entry.
//
// Every resolution presents the record's current fencing token, read by the
// person from the record: a worker or a takeover that moved the record on
// since then makes the resolution fail with lease_lost instead of acting on
// a record the person never saw.
//
//   - ResolveRelease deletes the record, so the next retry of the key runs
//     the work again. The record must be orphaned (its lease ran out).
//   - ResolveComplete stores a response the person supplies (the work is
//     known to be done) and hands the record a new fencing token, so the
//     late worker, should it come back, is fenced off (lease_lost) and its
//     response never replaces the one stored. The record must be orphaned.
//   - ResolveReview flags the record for review with a note and changes
//     nothing else: it stays in flight or orphaned, a retry may still take
//     it over (the flag stays with the record), its worker may still
//     complete it. A release or completion, by a person or a worker, clears
//     the flag. It is allowed whether or not the lease still runs.

// ResolveAction is what a resolution does to a record.
type ResolveAction string

// The resolutions.
const (
	ResolveRelease  ResolveAction = "release"
	ResolveComplete ResolveAction = "complete"
	ResolveReview   ResolveAction = "review"
)

// Valid reports whether a is one of the three resolutions.
func (a ResolveAction) Valid() bool {
	return slices.Contains([]ResolveAction{ResolveRelease, ResolveComplete, ResolveReview}, a)
}

// MaxNoteBytes bounds the note of a resolution.
const MaxNoteBytes = 2000

// Actor is who acted, from the verified token: the audit log keeps it.
type Actor struct {
	// Subject is the token's sub claim ("" when it has none).
	Subject string
	// Tenant is the token's tenant ("" for an operator token without one).
	Tenant string
	// Scope is the scope the action was allowed by: "tenant:admin" or
	// "admin".
	Scope string
}

// ResolveParams are the inputs of Store.Resolve.
type ResolveParams struct {
	TenantID     string
	Key          string
	Action       ResolveAction
	FencingToken int64
	// Response is the response to store; required for ResolveComplete and
	// ignored otherwise.
	Response *Response
	// Note says why; required for ResolveReview, optional otherwise.
	Note  string
	Actor Actor
}

// Resolution is the outcome of Store.Resolve.
type Resolution struct {
	// Record is the record after the resolution; for ResolveRelease, the
	// record as it was when it was deleted.
	Record Record
	// Audit is the audit entry written with it.
	Audit AuditEntry
}

// AuditEntry is one resolution as the audit log keeps it.
type AuditEntry struct {
	// ID is unique and increasing in the order entries were written.
	ID       int64
	TenantID string
	Key      string
	Action   ResolveAction
	// FencingToken is the token the resolution presented (the record's
	// token at the time).
	FencingToken int64
	// NewFencingToken is the token a completion handed the record; 0 for
	// the other actions.
	NewFencingToken int64
	Note            string
	Actor           Actor
	// CreatedAt is the database clock when the resolution was written.
	CreatedAt time.Time
}

// ValidateNote checks the note of a resolution: at most MaxNoteBytes of
// UTF-8 without control characters other than newline and tab. It returns
// an invalid_request *Error naming "note", or nil.
func ValidateNote(note string) error {
	if len(note) > MaxNoteBytes {
		return invalidField("note", fmt.Sprintf("must be at most %d bytes", MaxNoteBytes))
	}
	if !utf8.ValidString(note) {
		return invalidField("note", "must be valid UTF-8")
	}
	for _, r := range note {
		if r != '\n' && r != '\t' && (r < 0x20 || r == 0x7F || r >= 0x80 && r <= 0x9F) {
			return invalidField("note", fmt.Sprintf("must not contain control characters other than newline and tab (found U+%04X)", r))
		}
	}
	return nil
}

// Validate checks what a store trusts: a known action, a note, a response
// for a completion, with a status idem can replay
// (ValidateResponseStatus). It returns an invalid_request *Error, or nil.
// Both stores call it before they touch the record.
func (p ResolveParams) Validate() error {
	if !p.Action.Valid() {
		return invalidField("action", `must be "release", "complete" or "review"`)
	}
	if err := ValidateNote(p.Note); err != nil {
		return err
	}
	if p.Action == ResolveReview && p.Note == "" {
		return invalidField("note", "is required to mark a record for review")
	}
	if p.Action == ResolveComplete && p.Response == nil {
		return invalidField("response", "is required to complete a record")
	}
	if p.Action != ResolveComplete && p.Response != nil {
		return invalidField("response", "is only sent to complete a record")
	}
	if p.Response != nil {
		return ValidateResponseStatus(p.Response.Status)
	}
	return nil
}

// CheckResolve returns the error for the resolution p on the stored record
// (nil when absent) observed at now: key_not_found, lease_lost for a token
// that is not the current one, already_completed, or request_in_flight
// (RetryAfter = lease left) for a release or completion while the lease
// still runs. Nil means the resolution may apply.
func CheckResolve(stored *Record, p ResolveParams, now time.Time) error {
	if err := CheckWrite(stored, p.FencingToken); err != nil {
		return err
	}
	if p.Action != ResolveReview && stored.StateAt(now) == StateInFlight {
		return &Error{
			Code:       CodeRequestInFlight,
			Detail:     "key '" + stored.Key + "' is not orphaned: its lease still runs; only an orphan may be released or completed by hand",
			RetryAfter: max(stored.LeaseExpiresAt.Sub(now), 0),
		}
	}
	return nil
}
