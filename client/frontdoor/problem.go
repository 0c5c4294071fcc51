package frontdoor

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/idem-dev/idem/client/errcode"
)

// Code is the machine-readable name of a front-door refusal: a code of the
// one list (package errcode), which the idem API answers with too.
type Code = errcode.Code

// The codes a front door answers with (docs/frontdoor.md rule 7;
// retry_budget_exhausted is in budget.go, rule 9).
// upstream_unavailable, upstream_timeout and server_busy come from the
// gateway only.
const (
	CodeKeyMissing            = errcode.KeyMissing
	CodeInvalidKey            = errcode.InvalidKey
	CodeInvalidRequest        = errcode.InvalidRequest
	CodePayloadTooLarge       = errcode.PayloadTooLarge
	CodeRequestInFlight       = errcode.RequestInFlight
	CodeFingerprintMismatch   = errcode.FingerprintMismatch
	CodeStoreUnavailable      = errcode.StoreUnavailable
	CodeUpstreamUnavailable   = errcode.UpstreamUnavailable
	CodeUpstreamTimeout       = errcode.UpstreamTimeout
	CodeResponseNotReplayable = errcode.ResponseNotReplayable
	// CodeServerBusy: the gateway holds as many request bodies in memory
	// as its budget allows; retry after Retry-After.
	CodeServerBusy = errcode.ServerBusy
	// CodeStorageQuotaExceeded: idem refused the claim of a new key because
	// the tenant stores its storage_quota_bytes or more. Nothing was
	// claimed or run; a retry cannot succeed until the tenant's usage
	// falls (records purged or released) or its quota is raised, so it is
	// not retryable and not store_unavailable (the store is up).
	CodeStorageQuotaExceeded = errcode.StorageQuotaExceeded
	// CodeTenantUnknown: idem refused the front door's claim because the
	// front door's own tenant (the gateway's --tenant, the middleware's
	// token's) does not exist or is disabled. The store is up and refused,
	// so it is no store failure (a fail_open route does not pass the
	// request through) and a retry cannot succeed until an operator
	// enables the tenant: not retryable.
	CodeTenantUnknown = errcode.TenantUnknown
)

// Problems are the rows of the one error table (package errcode) a front
// door answers with, with the front doors' titles. Only request_in_flight,
// store_unavailable and server_busy are retryable unchanged (after
// Retry-After). An upstream error released the key when the request never
// reached the upstream (the client may retry it, with no promise that it
// succeeds); once the upstream had the request, the gateway stores the
// error like a 5xx and a retry gets it replayed.
var Problems = errcode.Of(errcode.FrontDoor)

// StorageQuotaDetail is the detail of CodeStorageQuotaExceeded, the same
// in every front door: the caller learns that nothing ran and that a
// retry with the same key waits on the tenant's usage, not on time.
const StorageQuotaDetail = "the tenant's storage quota is used up: the request was not processed and nothing was stored; it cannot succeed until the tenant's stored records are purged or its storage quota is raised"

// TenantUnknownDetail is the detail of CodeTenantUnknown, the same in
// every front door (the gateway and the middleware): the tenant the front
// door claims in is the operator's to enable, so the caller learns that
// nothing ran and that a retry waits on an operator, not on time.
const TenantUnknownDetail = "the idempotency service refused this service's tenant (it does not exist or is disabled): the request was not processed; it cannot succeed until an operator enables the tenant"

// NotReplayableDetail is the detail of CodeResponseNotReplayable, the same
// in every front door and for either reason a record is not replayable (a
// response too large to store, or a status outside 100-599: Unstorable):
// it names both, so it never says "too large" of an answer that was not.
// The record's HeaderNotReplayable value says which, for operators.
const NotReplayableDetail = "the request was completed, but its response could not be stored (too large, or a status outside 100-599) and cannot be replayed"

// MismatchDetail is the detail of CodeFingerprintMismatch, the same in
// every front door: it names what the fingerprint covers, so a caller can
// find what changed between its first request and this one.
const MismatchDetail = "the idempotency key was first used with a different request (method, route, query or body)"

// FieldError names one invalid part of a request (errcode's, shared with
// the idem API and the SDK).
type FieldError = errcode.FieldError

// Error is a refusal of a front door; WriteProblem turns it into an RFC
// 9457 problem body.
type Error struct {
	Code Code
	// Detail is a sentence safe to show the caller.
	Detail string
	// RetryAfter is sent as Retry-After (whole seconds, at least 1) for the
	// retryable codes; zero then means one second.
	RetryAfter time.Duration
	// Fields lists invalid parts of the request, if any.
	Fields []FieldError
	// BudgetSpent adds HeaderRetryBudget to a retryable refusal: the
	// tenant's fleet retry budget is spent, so the caller sends no retry
	// now (rule 9).
	BudgetSpent bool
}

// Error implements error.
func (e *Error) Error() string { return "frontdoor: " + string(e.Code) + ": " + e.Detail }

// Is makes errors.Is match any *Error with the same code.
func (e *Error) Is(target error) bool { return errcode.Match(e, target, (*Error).code) }

// code is the code of e, for errcode's Match.
func (e *Error) code() Code { return e.Code }

// Status is the HTTP status of the refusal.
func (e *Error) Status() int { return Problems[e.Code].Status }

// Errorf returns an *Error with a formatted detail.
func Errorf(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Detail: fmt.Sprintf(format, args...)}
}

// Problem is the RFC 9457 body of a refusal.
type Problem struct {
	Type      string       `json:"type"`
	Title     string       `json:"title"`
	Status    int          `json:"status"`
	Detail    string       `json:"detail"`
	Code      Code         `json:"code"`
	Retryable bool         `json:"retryable"`
	Instance  string       `json:"instance"`
	Errors    []FieldError `json:"errors,omitempty"`
}

// TypePrefix starts the type URI of every front-door problem.
const TypePrefix = "urn:idem:problem:"

// InstancePrefix starts the instance URI; the request id follows.
const InstancePrefix = "urn:idem:request:"

// NewProblem returns the problem body of e for the request with id.
func NewProblem(e *Error, requestID string) Problem {
	info := Problems[e.Code]
	detail := e.Detail
	if detail == "" {
		detail = info.Title
	}
	return Problem{
		Type: TypePrefix + string(e.Code), Title: info.Title, Status: info.Status,
		Detail: detail, Code: e.Code, Retryable: info.Retryable,
		Instance: InstancePrefix + requestID, Errors: e.Fields,
	}
}

// RetryAfterSeconds rounds a wait up to whole seconds, at least 1.
func RetryAfterSeconds(d time.Duration) int {
	return max(int(math.Ceil(d.Seconds())), 1)
}

// WriteProblem answers e as application/problem+json, with Retry-After
// for the retryable codes and the request id (RequestID) as instance and
// X-Request-Id. Errors other than *Error are not expected here: callers map
// them first (a store error is CodeStoreUnavailable).
func WriteProblem(w http.ResponseWriter, r *http.Request, e *Error) {
	id := RequestID(w, r)
	p := NewProblem(e, id)
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Cache-Control", "no-store")
	if p.Retryable {
		h.Set("Retry-After", strconv.Itoa(RetryAfterSeconds(e.RetryAfter)))
		if e.BudgetSpent {
			h.Set(HeaderRetryBudget, RetryBudgetExhausted)
		}
	}
	w.WriteHeader(p.Status)
	_ = json.NewEncoder(w).Encode(p)
}

// RequestID returns the request id of r: the caller's X-Request-Id when it
// is 1–128 characters of [A-Za-z0-9._-], else a new random one. It also
// sets X-Request-Id on w when w has none yet, so the caller can quote it.
func RequestID(w http.ResponseWriter, r *http.Request) string {
	if id := w.Header().Get(HeaderRequestID); id != "" {
		return id
	}
	id := r.Header.Get(HeaderRequestID)
	if !ValidRequestID(id) {
		id = NewRequestID()
	}
	w.Header().Set(HeaderRequestID, id)
	return id
}

// ValidRequestID reports whether a caller's request id may be kept: 1–128
// characters of [A-Za-z0-9._-], the same rule as the idem API.
func ValidRequestID(id string) bool {
	if id == "" || len(id) > 128 {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// NewRequestID returns a random request id of 32 hex digits.
func NewRequestID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func itoa(n int) string { return strconv.Itoa(n) }
