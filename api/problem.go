package api

import (
	"encoding/json"
	"errors"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/metrics"
	"github.com/idem-dev/idem/retrybudget"
)

// problemInfo is one row of the contract's error table.
type problemInfo struct {
	status    int
	title     string
	retryable bool
}

// Codes of this package that the domain does not define: an unknown route or
// method. The contract is silent about them; they follow the same shape.
const (
	codeNotFound         idem.Code = "not_found"
	codeMethodNotAllowed idem.Code = "method_not_allowed"
)

// problems maps every code to its status, title and retryability (contract
// §3). Codes missing here are answered as internal errors.
var problems = map[idem.Code]problemInfo{
	idem.CodeInvalidRequest:       {http.StatusBadRequest, "Invalid request", false},
	idem.CodeInvalidKey:           {http.StatusBadRequest, "Invalid idempotency key", false},
	idem.CodeUnauthenticated:      {http.StatusUnauthorized, "Unauthenticated", false},
	idem.CodeForbidden:            {http.StatusForbidden, "Forbidden", false},
	idem.CodeTenantUnknown:        {http.StatusForbidden, "Unknown tenant", false},
	idem.CodeKeyNotFound:          {http.StatusNotFound, "Key not found", false},
	idem.CodeTenantNotFound:       {http.StatusNotFound, "Tenant not found", false},
	idem.CodeWebhookNotFound:      {http.StatusNotFound, "Webhook endpoint not found", false},
	idem.CodeWebhookDisabled:      {http.StatusConflict, "Webhook endpoint disabled", false},
	idem.CodeWebhookLimitReached:  {http.StatusConflict, "Webhook endpoint limit reached", false},
	idem.CodeRequestInFlight:      {http.StatusConflict, "Request in flight", true},
	idem.CodeLeaseLost:            {http.StatusConflict, "Lease lost", false},
	idem.CodeAlreadyCompleted:     {http.StatusConflict, "Already completed", false},
	idem.CodeTenantExists:         {http.StatusConflict, "Tenant exists", false},
	idem.CodePayloadTooLarge:      {http.StatusRequestEntityTooLarge, "Payload too large", false},
	idem.CodeUnsupportedMediaType: {http.StatusUnsupportedMediaType, "Unsupported media type", false},
	idem.CodeFingerprintMismatch:  {http.StatusUnprocessableEntity, "Fingerprint mismatch", false},
	idem.CodeRateLimited:          {http.StatusTooManyRequests, "Rate limited", true},
	// Retryable as the same call later may pass, but the SDKs stop the
	// logical call at once with its original cause (web/docs/retries).
	idem.CodeRetryBudgetExhausted: {http.StatusTooManyRequests, "Retry budget exhausted", true},
	idem.CodeStoreUnavailable:     {http.StatusServiceUnavailable, "Store unavailable", true},
	idem.CodeServerBusy:           {http.StatusServiceUnavailable, "Server busy", true},
	idem.CodeInternal:             {http.StatusInternalServerError, "Internal error", false},
	// Not retryable as such: only releases and the reaper's purge free the
	// quota, which a retry does not wait for. On a complete the key is
	// completed without the response (a retry of the request is answered
	// not replayable); on a checkpoint the lease was renewed.
	idem.CodeStorageQuotaExceeded: {http.StatusInsufficientStorage, "Storage quota exceeded", false},
	codeNotFound:                  {http.StatusNotFound, "Not found", false},
	codeMethodNotAllowed:          {http.StatusMethodNotAllowed, "Method not allowed", false},
}

// problem is the RFC 9457 body of every error.
type problem struct {
	Type      string            `json:"type"`
	Title     string            `json:"title"`
	Status    int               `json:"status"`
	Detail    string            `json:"detail"`
	Code      idem.Code         `json:"code"`
	Retryable bool              `json:"retryable"`
	Errors    []idem.FieldError `json:"errors,omitempty"`
	RequestID string            `json:"request_id,omitempty"`
}

// retryAfterSeconds rounds a wait up to whole seconds, at least 1.
func retryAfterSeconds(d time.Duration) int {
	s := int(math.Ceil(d.Seconds()))
	return max(s, 1)
}

// budgetSpent reports whether the answer of code should carry
// Idem-Retry-Budget: exhausted: on a refused retry always, and on any other
// failure an SDK retries (a retryable code, or a 500 an SDK may be set to
// retry) of a known tenant when
// its fleet retry budget on this replica is spent (Budget.Invite), so the
// callers stop on the failure they have instead of each sending a retry to
// be refused (web/docs/retries#budget-signal).
func (s *service) budgetSpent(r *http.Request, code idem.Code, info problemInfo) bool {
	if code == idem.CodeRetryBudgetExhausted {
		return true
	}
	if !info.retryable && code != idem.CodeInternal {
		return false // 507 storage_quota_exceeded included: never retried
	}
	tenant := principalFrom(r.Context()).Tenant
	return tenant != "" && s.retries.Invite(tenant)
}

// writeProblem answers err as application/problem+json. An error without a
// known code is a 500 "internal" whose cause is logged and never shown.
//
// When the client went away before its answer (the request's context was
// canceled: the connection closed or the stream was reset), whatever err
// says came from that — a store call interrupted, a lock wait given up —
// and nobody reads the answer: it is logged at debug level and recorded as
// status 499 (metrics.StatusClientClosedRequest), never as an internal
// error.
func (s *service) writeProblem(w http.ResponseWriter, r *http.Request, err error) {
	if r.Context().Err() != nil {
		s.logger.DebugContext(r.Context(), "request canceled by the client",
			slog.String("request_id", requestIDFrom(r.Context())),
			slog.String("method", r.Method),
			slog.String("error", err.Error()))
		w.WriteHeader(metrics.StatusClientClosedRequest)
		return
	}
	var e *idem.Error
	if !errors.As(err, &e) {
		e = &idem.Error{Code: idem.CodeInternal, Err: err}
	}
	info, ok := problems[e.Code]
	if !ok {
		e = &idem.Error{Code: idem.CodeInternal, Err: err}
		info = problems[idem.CodeInternal]
	}
	detail := e.Detail
	if e.Code == idem.CodeInternal {
		s.logger.ErrorContext(r.Context(), "internal error",
			slog.String("request_id", requestIDFrom(r.Context())),
			slog.String("method", r.Method),
			slog.String("error", err.Error()))
		detail = "an internal error occurred; quote the request id when reporting it"
	}
	if detail == "" {
		detail = info.title
	}
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Cache-Control", "no-store")
	if info.retryable {
		wait := e.RetryAfter
		if e.Code == idem.CodeStoreUnavailable && wait <= 0 {
			wait = time.Second
		}
		h.Set("Retry-After", strconv.Itoa(retryAfterSeconds(wait)))
	}
	if s.budgetSpent(r, e.Code, info) {
		h.Set(retrybudget.SignalHeader, retrybudget.Exhausted)
	}
	if e.Code == idem.CodeUnauthenticated {
		h.Set("WWW-Authenticate", `Bearer error="invalid_token"`)
	}
	w.WriteHeader(info.status)
	_ = json.NewEncoder(w).Encode(problem{
		Type:      "/docs/errors#" + string(e.Code),
		Title:     info.title,
		Status:    info.status,
		Detail:    detail,
		Code:      e.Code,
		Retryable: info.retryable,
		Errors:    e.Fields,
		RequestID: requestIDFrom(r.Context()),
	})
}
