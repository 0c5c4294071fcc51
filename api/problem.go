package api

import (
	"errors"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/go-json-experiment/json"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/client/errcode"
	"github.com/idem-dev/idem/metrics"
	"github.com/idem-dev/idem/retrybudget"
)

// problems are the rows of the one error table (package errcode) the API
// answers with: every code of the contract (§3). Codes missing here are
// answered as internal errors.
var problems = errcode.Of(errcode.API)

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
// be refused (web/docs/retries#budget-signal). Never on a finishing write
// (checkpoint, complete, release): the budget does not decide those, and
// an SDK told to stop would leave work that ran unrecorded
// (resolveFinishingTenant).
func (s *service) budgetSpent(r *http.Request, code idem.Code, info errcode.Info) bool {
	if code == idem.CodeRetryBudgetExhausted {
		return true
	}
	if st := stateFrom(r.Context()); st != nil && st.budgetKind.Finishing() {
		return false
	}
	if !info.Retryable && code != idem.CodeInternal {
		return false // 507 storage_quota_exceeded included: never retried
	}
	tenant := principalFrom(r.Context()).Tenant
	kind := retrybudget.KindOther
	if st := stateFrom(r.Context()); st != nil {
		kind = st.budgetKind
	}
	return tenant != "" && s.retries.Invite(tenant, kind)
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
		detail = info.Title
	}
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Cache-Control", "no-store")
	if info.Retryable {
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
	w.WriteHeader(info.Status)
	b, _ := json.Marshal(problem{
		Type:      "/docs/errors#" + string(e.Code),
		Title:     info.Title,
		Status:    info.Status,
		Detail:    detail,
		Code:      e.Code,
		Retryable: info.Retryable,
		Errors:    e.Fields,
		RequestID: requestIDFrom(r.Context()),
	}, answerOptions)
	_, _ = w.Write(append(b, '\n'))
}
