// Package idem is the domain of the idem idempotency service: records and
// their states, the claim state machine and the rules of every write,
// tenants and their settings, the completer's and the webhooks' records,
// the errors of the HTTP contract, and the Store and Driver contracts every
// database backend implements.
//
// The package depends on the standard library and on two leaf packages of
// the SDK module that the server shares with it: client/errcode (the one
// list of error codes) and client/stdwebhooks (the secrets' format). The
// fingerprint of a request lives in package canon, the HTTP layer in
// package api, the backends in packages postgres and sqlite, and the
// conformance suite that every Store must pass in package storetest.
//
// idem does not promise exactly-once execution. It makes retries safe within
// the documented key scope (one tenant) and the tenant's replay window.
package idem

import (
	"bytes"
	"encoding/json"
	"maps"
	"slices"
	"strconv"
	"time"
)

// State is the state of a record as the API shows it. The database stores
// only StateInFlight and StateCompleted; StateOrphaned and StateExpired are
// derived from the lease and the replay window at a given instant (see
// Record.StateAt).
type State string

// The states of a record.
const (
	// StateInFlight is a claimed key whose lease is still running.
	StateInFlight State = "in_flight"
	// StateCompleted is a key with a stored response inside its replay window.
	StateCompleted State = "completed"
	// StateOrphaned is an in-flight key whose lease expired and that nobody
	// has taken over yet.
	StateOrphaned State = "orphaned"
	// StateExpired is a completed key past its replay window that the reaper
	// has not deleted yet. A claim treats it as absent.
	StateExpired State = "expired"
)

// Valid reports whether s is one of the four API states.
func (s State) Valid() bool {
	return slices.Contains([]State{StateInFlight, StateCompleted, StateOrphaned, StateExpired}, s)
}

// Record is what the service stores for one (tenant, key).
type Record struct {
	TenantID string
	Key      string
	// State is the stored state: StateInFlight or StateCompleted. Use StateAt
	// for the state the API shows.
	State       State
	Operation   string
	Fingerprint string
	// FencingToken is strictly increasing per (tenant, key) across every
	// claim and takeover.
	FencingToken int64
	// Attempt counts the claims of the current record: 1 on creation, +1 on
	// every takeover.
	Attempt int
	// AttemptID is the client-chosen id the current attempt claimed with; ""
	// when it sent none. A claim repeating it while the lease runs gets this
	// attempt back (ActionRecover) instead of request_in_flight.
	AttemptID string
	// LeaseExpiresAt is when the in-flight lease runs out; zero once
	// completed.
	LeaseExpiresAt time.Time
	// RecoveryPoint is the last checkpoint's phase name; empty if none.
	RecoveryPoint string
	// RecoveryData is the JSON saved with the last checkpoint; nil if none.
	RecoveryData json.RawMessage
	// Review is the review flag a person set (ResolveReview); nil when the
	// record is not flagged. A release or completion clears it.
	Review *Review
	// Completion is the completer's hold on the record (completer.go); nil
	// when the completer never took it. A completion or release clears it.
	Completion *Completion
	// Response is the stored response; nil until completed.
	Response *Response
	// ReplayWindow and ReaperThreshold are the tenant's settings at the time
	// the record was created; a later settings change does not alter them.
	ReplayWindow    time.Duration
	ReaperThreshold time.Duration
	CreatedAt       time.Time
	UpdatedAt       time.Time
	// CompletedAt is zero until completed.
	CompletedAt time.Time
	// ReplayUntil is CompletedAt + ReplayWindow; zero until completed.
	ReplayUntil time.Time
	// PurgeAfter is when the reaper may delete the record.
	PurgeAfter time.Time
	// ObservedAt is the database clock at the moment the record was read or
	// written. Derived values (StateAt, lease time left) use it so that every
	// replica agrees whatever its own clock says.
	ObservedAt time.Time
}

// Review is the review flag of a record.
type Review struct {
	Note string
	// At is the database clock when the flag was set.
	At time.Time
}

// StateAt returns the API state of the record at instant now.
func (r Record) StateAt(now time.Time) State {
	switch r.State {
	case StateInFlight:
		if !now.Before(r.LeaseExpiresAt) {
			return StateOrphaned
		}
		return StateInFlight
	case StateCompleted:
		if !now.Before(r.ReplayUntil) {
			return StateExpired
		}
		return StateCompleted
	}
	return r.State
}

// APIState returns the API state of the record at the instant it was
// observed.
func (r Record) APIState() State { return r.StateAt(r.ObservedAt) }

// LeaseLeft returns the lease time left at the instant the record was
// observed, or zero when the lease has run out or the record is completed.
func (r Record) LeaseLeft() time.Duration {
	if r.State != StateInFlight {
		return 0
	}
	return max(r.LeaseExpiresAt.Sub(r.ObservedAt), 0)
}

// StoredBytes is what the record counts against its tenant's
// storage_quota_bytes: the bytes of it the tenant chose, that is its key,
// operation, fingerprint, recovery point and recovery data, and its
// response's Size (body plus header names and values). Row and index
// overhead, timestamps, tokens, the attempt id and a person's review note
// are not counted. Stores keep this number on every record and its sum
// per tenant in the same transaction as every write that changes it.
func (r Record) StoredBytes() int64 {
	n := ClaimBytes(r.Key, r.Operation, r.Fingerprint) + RecoveryBytes(r.RecoveryPoint, r.RecoveryData)
	if r.Response != nil {
		n += int64(r.Response.Size())
	}
	return n
}

// ClaimBytes is what a record just created by a claim counts (see
// Record.StoredBytes).
func ClaimBytes(key, operation, fingerprint string) int64 {
	return int64(len(key) + len(operation) + len(fingerprint))
}

// RecoveryBytes is what a checkpoint's recovery point and data count (see
// Record.StoredBytes).
func RecoveryBytes(point string, data []byte) int64 {
	return int64(len(point) + len(data))
}

// Body encodings of a stored response.
const (
	BodyEncodingUTF8   = "utf8"
	BodyEncodingBase64 = "base64"
)

// Response is the full response of a completed request, stored verbatim and
// replayed as is.
type Response struct {
	Status  int
	Headers map[string]string
	// Body holds the decoded bytes of the body.
	Body []byte
	// BodyEncoding is how the body travels in JSON: BodyEncodingUTF8 or
	// BodyEncodingBase64, as the caller sent it.
	BodyEncoding string
}

// Equal reports whether two responses are the same: same status, same
// headers and the same body bytes. The body encoding does not take part.
func (r Response) Equal(o Response) bool {
	return r.Status == o.Status &&
		maps.Equal(r.Headers, o.Headers) &&
		bytes.Equal(r.Body, o.Body)
}

// Size is the number of bytes a response occupies, compared against the
// tenant's MaxResponseBytes: body bytes plus header names and values.
func (r Response) Size() int {
	n := len(r.Body)
	for k, v := range r.Headers {
		n += len(k) + len(v)
	}
	return n
}

// HeaderNotReplayable marks a stored response that is not the answer the
// request got (too large to store, a status idem cannot store, or no room
// under the tenant's quota): a front door that finds it answers a retry
// with 409 response_not_replayable instead of running the request again.
// It is the header client/frontdoor.HeaderNotReplayable names.
const HeaderNotReplayable = "Idem-Not-Replayable"

// UnstoredResponse is what a complete stores in place of resp when resp
// does not fit the tenant's storage quota: resp's status, no body, and
// HeaderNotReplayable saying why, so that the key stays completed (never
// run again) and a replay says its answer was not kept. It adds
// len(HeaderNotReplayable) plus its value, under 80 bytes, to the record.
func UnstoredResponse(resp Response) Response {
	return Response{
		Status: resp.Status,
		Headers: map[string]string{
			HeaderNotReplayable: "response of " + strconv.Itoa(resp.Size()) + " bytes not stored (storage quota)",
		},
		BodyEncoding: BodyEncodingUTF8,
	}
}

// IsUnstored reports whether stored is UnstoredResponse(resp): the
// complete of resp was stored without it for want of quota.
func IsUnstored(stored *Response, resp Response) bool {
	return stored != nil && stored.Equal(UnstoredResponse(resp))
}
