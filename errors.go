package idem

import (
	"fmt"
	"time"

	"github.com/idem-dev/idem/client/errcode"
)

// Code is the stable, machine-readable name of an error. The one list of
// codes and their one table (status, title, retryability) is package
// errcode, in the SDK module, so that the API and the front doors (the
// gateway here, client/idemhttp in the SDK) answer from the same rows
// without the SDK importing the server; the HTTP layer (package api) maps
// each code to its row; clients match on it.
type Code = errcode.Code

// The error codes of the HTTP contract (errcode's, under the domain's
// names).
const (
	CodeInvalidRequest       = errcode.InvalidRequest
	CodeInvalidKey           = errcode.InvalidKey
	CodeUnauthenticated      = errcode.Unauthenticated
	CodeForbidden            = errcode.Forbidden
	CodeTenantUnknown        = errcode.TenantUnknown
	CodeKeyNotFound          = errcode.KeyNotFound
	CodeTenantNotFound       = errcode.TenantNotFound
	CodeRequestInFlight      = errcode.RequestInFlight
	CodeLeaseLost            = errcode.LeaseLost
	CodeAlreadyCompleted     = errcode.AlreadyCompleted
	CodeTenantExists         = errcode.TenantExists
	CodePayloadTooLarge      = errcode.PayloadTooLarge
	CodeUnsupportedMediaType = errcode.UnsupportedMediaType
	CodeFingerprintMismatch  = errcode.FingerprintMismatch
	CodeRateLimited          = errcode.RateLimited
	// CodeRetryBudgetExhausted: the request said it is a retry
	// (Idem-Attempt above 1) and the tenant's retries on this replica
	// already use its retry_budget_percent of the first attempts of the
	// same kind of call (a claim's of the claims) in the window. Decided
	// before any body read or store call, so the key is as it was. The problem says retryable (the same call later may pass)
	// but an SDK stops retrying the logical call at once and reports the
	// original cause: more retries are what the budget refuses.
	CodeRetryBudgetExhausted = errcode.RetryBudgetExhausted
	CodeStoreUnavailable     = errcode.StoreUnavailable
	// CodeServerBusy: the server holds as many request bodies as its
	// in-flight budget allows; retry after Retry-After.
	CodeServerBusy = errcode.ServerBusy
	// CodeStorageQuotaExceeded: the tenant's records store its
	// storage_quota_bytes or more, so a claim that would create a record is
	// refused before any work runs; it succeeds again once records are
	// released or purged. A complete or checkpoint whose bytes do not fit
	// gets it too, after the store kept what it must (UnstoredResponse,
	// CheckpointNotStored): the key is never made runnable again by it.
	CodeStorageQuotaExceeded = errcode.StorageQuotaExceeded
	// CodeInternal is any error without a code of its own; its details are
	// never shown to callers.
	CodeInternal = errcode.Internal
)

// FieldError names one invalid field of a request (errcode's, shared with
// the front doors and the SDK).
type FieldError = errcode.FieldError

// Error is the one error type of the domain. Stores, the tenant service and
// the HTTP layer return it; the HTTP layer turns it into problem+json.
type Error struct {
	Code Code
	// Detail is a human-readable sentence safe to show to the caller.
	Detail string
	// RetryAfter is the natural wait before the same request may succeed
	// (lease time left, rate limit refill); zero when there is none.
	RetryAfter time.Duration
	// Fields lists the invalid fields of an invalid_request.
	Fields []FieldError
	// Err is the underlying cause, for logs only.
	Err error
}

// Error implements error.
func (e *Error) Error() string {
	msg := string(e.Code)
	if e.Detail != "" {
		msg += ": " + e.Detail
	}
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

// Unwrap returns the underlying cause.
func (e *Error) Unwrap() error { return e.Err }

// Is makes errors.Is(err, ErrLeaseLost) and friends match any *Error with
// the same code.
func (e *Error) Is(target error) bool { return errcode.Match(e, target, (*Error).code) }

// code is the code of e, for errcode's Match and CodeOf.
func (e *Error) code() Code { return e.Code }

// Errorf returns an *Error with the given code and a formatted detail.
func Errorf(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Detail: fmt.Sprintf(format, args...)}
}

// StoreUnavailable returns the store_unavailable error a store gives when
// its database cannot be used (unreachable, busy, closed), with detail for
// the caller, cause for the logs and a Retry-After of one second.
func StoreUnavailable(detail string, cause error) *Error {
	return &Error{Code: CodeStoreUnavailable, Detail: detail, RetryAfter: time.Second, Err: cause}
}

// StorageQuotaExceeded returns the error of a claim refused because tenant
// stores used bytes, at or over its storage_quota_bytes (limit).
func StorageQuotaExceeded(tenant string, used, limit int64) *Error {
	return Errorf(CodeStorageQuotaExceeded,
		"tenant '%s' stores %d bytes, at or over its storage_quota_bytes (%d): no new key can be claimed until records are released or purged", tenant, used, limit)
}

// ResponseNotStored returns the error of a complete whose response (size
// bytes) did not fit the tenant's storage_quota_bytes (limit): the key is
// completed all the same, with UnstoredResponse in its place, so that a
// retry of the request is answered as not replayable, never run again.
func ResponseNotStored(tenant string, size int, limit int64) *Error {
	return Errorf(CodeStorageQuotaExceeded,
		"tenant '%s' has no room under its storage_quota_bytes (%d) for this response of %d bytes: the key is completed without it, and a claim of the key replays it as not replayable (%s)", tenant, limit, size, HeaderNotReplayable)
}

// CheckpointNotStored returns the error of a checkpoint whose recovery
// point and data (size bytes) did not fit the tenant's storage_quota_bytes
// (limit): the lease was renewed, the record keeps its earlier recovery
// point and data.
func CheckpointNotStored(tenant string, size int64, limit int64) *Error {
	return Errorf(CodeStorageQuotaExceeded,
		"tenant '%s' has no room under its storage_quota_bytes (%d) for this recovery point and data of %d bytes: the lease was renewed, and the record keeps its earlier recovery point and data", tenant, limit, size)
}

// ErrorCode returns the code of err, CodeInternal when err carries none, or
// "" for a nil error.
func ErrorCode(err error) Code { return errcode.CodeOf(err, (*Error).code, CodeInternal) }

// Sentinels for errors.Is. They match any *Error of the same code.
var (
	ErrInvalidRequest       = &Error{Code: CodeInvalidRequest}
	ErrInvalidKey           = &Error{Code: CodeInvalidKey}
	ErrKeyNotFound          = &Error{Code: CodeKeyNotFound}
	ErrTenantNotFound       = &Error{Code: CodeTenantNotFound}
	ErrTenantUnknown        = &Error{Code: CodeTenantUnknown}
	ErrRequestInFlight      = &Error{Code: CodeRequestInFlight}
	ErrLeaseLost            = &Error{Code: CodeLeaseLost}
	ErrAlreadyCompleted     = &Error{Code: CodeAlreadyCompleted}
	ErrTenantExists         = &Error{Code: CodeTenantExists}
	ErrFingerprintMismatch  = &Error{Code: CodeFingerprintMismatch}
	ErrStoreUnavailable     = &Error{Code: CodeStoreUnavailable}
	ErrStorageQuotaExceeded = &Error{Code: CodeStorageQuotaExceeded}
)
