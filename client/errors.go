package client

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/idem-dev/idem/client/errcode"
)

// Code is the stable, machine-readable name of an error of the idem HTTP
// contract (the "code" member of a problem+json body).
type Code string

// The error codes of the idem HTTP contract, version 1: errcode's codes
// (the one list, shared with the server) under the SDK's type.
const (
	CodeInvalidRequest      = Code(errcode.InvalidRequest)
	CodeInvalidKey          = Code(errcode.InvalidKey)
	CodeUnauthenticated     = Code(errcode.Unauthenticated)
	CodeForbidden           = Code(errcode.Forbidden)
	CodeNotFound            = Code(errcode.NotFound)
	CodeMethodNotAllowed    = Code(errcode.MethodNotAllowed)
	CodeTenantUnknown       = Code(errcode.TenantUnknown)
	CodeKeyNotFound         = Code(errcode.KeyNotFound)
	CodeTenantNotFound      = Code(errcode.TenantNotFound)
	CodeWebhookNotFound     = Code(errcode.WebhookNotFound)
	CodeWebhookDisabled     = Code(errcode.WebhookDisabled)
	CodeWebhookLimitReached = Code(errcode.WebhookLimitReached)
	CodeRequestInFlight     = Code(errcode.RequestInFlight)
	// CodeOutcomeUnknown: the key's first attempt died and idem's
	// completer holds it while it finds out what happened; retryable after
	// Retry-After (the next completer attempt).
	CodeOutcomeUnknown = Code(errcode.OutcomeUnknown)
	// CodeOutcomeReview: the completer gave up on the key; not retryable
	// until a person resolves it.
	CodeOutcomeReview         = Code(errcode.OutcomeReview)
	CodeCompleterNotFound     = Code(errcode.CompleterNotFound)
	CodeCompleterLimitReached = Code(errcode.CompleterLimitReached)
	CodeLeaseLost             = Code(errcode.LeaseLost)
	CodeAlreadyCompleted      = Code(errcode.AlreadyCompleted)
	CodeTenantExists          = Code(errcode.TenantExists)
	CodePayloadTooLarge       = Code(errcode.PayloadTooLarge)
	CodeUnsupportedMediaType  = Code(errcode.UnsupportedMediaType)
	CodeFingerprintMismatch   = Code(errcode.FingerprintMismatch)
	CodeRateLimited           = Code(errcode.RateLimited)
	CodeStoreUnavailable      = Code(errcode.StoreUnavailable)
	// CodeRetryBudgetExhausted (429): the tenant's fleet retry budget
	// refused this retry. The client stops retrying the call at once and
	// returns an error carrying the cause of the attempt before (see
	// BudgetExhaustedError).
	CodeRetryBudgetExhausted = Code(errcode.RetryBudgetExhausted)
	// CodeServerBusy (503, retried like store_unavailable): the server
	// held as many request bodies as its in-flight budget allows and did
	// not read this one.
	CodeServerBusy = Code(errcode.ServerBusy)
	// CodeStorageQuotaExceeded (507, never retried): the tenant's records
	// store its storage_quota_bytes or more, so a claim of a new key was
	// refused before anything ran. Only releases, the reaper's purge or a
	// higher quota free it; keys already claimed still complete.
	CodeStorageQuotaExceeded = Code(errcode.StorageQuotaExceeded)
	// CodeInternal is a server error without a code of its own.
	CodeInternal = Code(errcode.Internal)
	// CodeUnknown is given to an HTTP error whose body is not a problem+json
	// document with a code (a proxy's 502 page, for example).
	CodeUnknown Code = "unknown"
)

// FieldError names one invalid field of an invalid_request problem
// (errcode's, shared with the front doors and the server).
type FieldError = errcode.FieldError

// Error is an error answer of the idem service: the RFC 9457 problem
// details plus the HTTP status, the Retry-After header and the request id.
// Match it by code with errors.Is (errors.Is(err, ErrLeaseLost)) and reach
// the details with errors.As.
type Error struct {
	// Status is the HTTP status code.
	Status int
	// Code is the contract's machine-readable code (CodeUnknown when the
	// body carried none).
	Code Code
	// Type, Title and Detail are the problem details members.
	Type   string
	Title  string
	Detail string
	// Retryable is the problem's "retryable" member: whether the same
	// request may be sent again unchanged.
	Retryable bool
	// RetryAfter is the Retry-After header (seconds or HTTP-date), zero when
	// absent.
	RetryAfter time.Duration
	// RequestID is the X-Request-Id response header, when the server sent
	// one; quote it when reporting a problem.
	RequestID string
	// Fields lists the invalid fields of an invalid_request.
	Fields []FieldError
	// WaitApplied is how long the server held a claim that asked to wait
	// (Request.Wait) before this answer, from Preference-Applied; zero
	// when it held none (it may refuse to: its waiter limit, a shutdown).
	WaitApplied time.Duration
	// FleetBudgetSpent is true when the answer carried Idem-Retry-Budget:
	// exhausted: the tenant's fleet retry budget is spent, so the client
	// sent no retry of the call (it returned a *FleetBudgetError), unless
	// the call finishes a claim (checkpoint, complete, release), which the
	// budget does not cover.
	FleetBudgetSpent bool
}

// Error implements error.
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("idem: ")
	if e.Status != 0 {
		fmt.Fprintf(&b, "%d ", e.Status)
	}
	b.WriteString(string(e.Code))
	if e.Detail != "" {
		b.WriteString(": ")
		b.WriteString(e.Detail)
	} else if e.Title != "" {
		b.WriteString(": ")
		b.WriteString(e.Title)
	}
	if e.RequestID != "" {
		b.WriteString(" (request id ")
		b.WriteString(e.RequestID)
		b.WriteString(")")
	}
	return b.String()
}

// Is reports whether target is an *Error with the same code, so that the
// sentinels (ErrLeaseLost, ErrRequestInFlight, ...) match any error of
// their code.
func (e *Error) Is(target error) bool { return errcode.Match(e, target, (*Error).code) }

// code is the code of e, for errcode's Match and CodeOf.
func (e *Error) code() Code { return e.Code }

// Sentinels for errors.Is; each matches any *Error of its code.
var (
	ErrInvalidRequest       = &Error{Code: CodeInvalidRequest}
	ErrInvalidKey           = &Error{Code: CodeInvalidKey}
	ErrUnauthenticated      = &Error{Code: CodeUnauthenticated}
	ErrForbidden            = &Error{Code: CodeForbidden}
	ErrTenantUnknown        = &Error{Code: CodeTenantUnknown}
	ErrKeyNotFound          = &Error{Code: CodeKeyNotFound}
	ErrTenantNotFound       = &Error{Code: CodeTenantNotFound}
	ErrRequestInFlight      = &Error{Code: CodeRequestInFlight}
	ErrLeaseLost            = &Error{Code: CodeLeaseLost}
	ErrAlreadyCompleted     = &Error{Code: CodeAlreadyCompleted}
	ErrTenantExists         = &Error{Code: CodeTenantExists}
	ErrPayloadTooLarge      = &Error{Code: CodePayloadTooLarge}
	ErrUnsupportedMediaType = &Error{Code: CodeUnsupportedMediaType}
	ErrFingerprintMismatch  = &Error{Code: CodeFingerprintMismatch}
	ErrRateLimited          = &Error{Code: CodeRateLimited}
	ErrStoreUnavailable     = &Error{Code: CodeStoreUnavailable}
	ErrServerBusy           = &Error{Code: CodeServerBusy}
	ErrStorageQuotaExceeded = &Error{Code: CodeStorageQuotaExceeded}
	ErrInternal             = &Error{Code: CodeInternal}
)

// ErrNoSideEffect is the sentinel a function run by Do wraps into its error
// to declare that it left no side effect (it failed before touching
// anything external). Do then releases the key, so that the next attempt
// with the same key starts afresh, and returns the function's error.
var ErrNoSideEffect = errors.New("idem: the attempt left no side effect")

// ErrRetryBudgetExhausted is wrapped into the error of a call that stopped
// retrying because the client-wide retry budget was empty. The error of the
// last attempt is wrapped as well.
var ErrRetryBudgetExhausted = errors.New("idem: client retry budget exhausted")

// ErrDeadlineTooClose is wrapped into the error of a call that stopped
// retrying because the time left before the context's deadline could not fit
// the next wait plus a minimal attempt. The error of the last attempt is
// wrapped as well.
var ErrDeadlineTooClose = errors.New("idem: no time left for another attempt before the deadline")

// ErrInvalidAnswer is wrapped into the error of a call whose 2xx answer the
// client cannot interpret: not JSON, or a claim answer without what acting
// on it needs (a fencing token and state, a stored response to replay).
// Such an answer is not retried, and Do does not run its function on it:
// it comes from something that is not an idem server speaking the
// contract (a misrouted proxy, say), and guessing could run the work twice
// or replay a response that was never stored.
var ErrInvalidAnswer = errors.New("idem: the service's answer cannot be interpreted")

// ErrorCode returns the code of err: the Code of an *Error in its chain,
// "" for nil, and CodeUnknown for any other error (a network error, say).
func ErrorCode(err error) Code { return errcode.CodeOf(err, (*Error).code, CodeUnknown) }
