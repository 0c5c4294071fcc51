package client

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// HeaderAttempt is the request header every call carries (issue 28; the
// retry contract, /docs/retries#attempt): which attempt of the logical call
// this request is, an RFC 9651 Integer, and for a retry a cause Token
// naming why the attempt before failed: "1", "2;cause=timeout". idem counts
// attempts by it and holds each tenant's retries to its
// retry_budget_percent of the first attempts of the same kind of call (a
// claim's of the claims), fleet-wide.
const HeaderAttempt = "Idem-Attempt"

// HeaderRetryBudget is the response header by which idem says, on a
// retryable failure, that the tenant's fleet retry budget is spent: an RFC
// 9651 Item, the Token "exhausted" (parameters, if any, are ignored). The
// client then sends no retry of that call: it returns a *FleetBudgetError
// with the failure as its original cause, as for a refused retry.
const HeaderRetryBudget = "Idem-Retry-Budget"

// budgetSpent reports whether h says the fleet retry budget is spent.
func budgetSpent(h http.Header) bool {
	v := h.Get(HeaderRetryBudget)
	if i := strings.IndexByte(v, ';'); i >= 0 {
		v = v[:i]
	}
	return strings.TrimSpace(v) == "exhausted"
}

// The causes of a retry, the cause parameter of HeaderAttempt.
const (
	CauseTimeout     = "timeout"      // the attempt timed out
	CauseNetwork     = "network"      // no answer: refused, reset, cut
	CauseUnavailable = "unavailable"  // 503
	CauseThrottled   = "throttled"    // 429
	CauseServerError = "server-error" // any other 5xx
	CauseInFlight    = "in-flight"    // 409 request_in_flight, waited out
)

// attemptHeader formats HeaderAttempt for attempt n after cause.
func attemptHeader(n int, cause string) string {
	if n <= 1 || cause == "" {
		return strconv.Itoa(max(n, 1))
	}
	return strconv.Itoa(n) + ";cause=" + cause
}

// causeOf names why a failed attempt failed, for the next attempt's
// header.
func causeOf(res callResult, err error) string {
	var e *Error
	status := res.status
	if errors.As(err, &e) {
		if e.Code == CodeRequestInFlight {
			return CauseInFlight
		}
		status = e.Status
	}
	switch {
	case status == http.StatusServiceUnavailable:
		return CauseUnavailable
	case status == http.StatusTooManyRequests:
		return CauseThrottled
	case status >= 500:
		return CauseServerError
	case status == http.StatusRequestTimeout:
		return CauseTimeout
	}
	var ne net.Error
	if errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()) {
		return CauseTimeout
	}
	return CauseNetwork
}

// logicalCall counts the attempts of one logical call across the HTTP
// calls that make it: Do's claim and its in-flight waits are one call
// (the wait's claims say cause=in-flight), so the server sees them as
// retries of the first.
type logicalCall struct {
	attempts int    // attempts sent so far
	cause    string // why the last one failed
	original error  // the first retryable failure's error
}

type logicalCallKey struct{}

type attemptSeedKey struct{}

// attemptSeed is what WithAttempt put in a context.
type attemptSeed struct {
	attempt int
	cause   string
}

// WithAttempt returns ctx saying that the claims made with it are attempt
// (1-based) of a logical call that began before this process, after a
// failure of cause (CauseTimeout …): a front door in front of the SDK (a
// middleware, a proxy) that received a caller's Idem-Attempt passes it on
// this way, so idem's fleet budget counts the caller's retry as one. Only
// claims carry it; their own retries count on from it.
func WithAttempt(ctx context.Context, attempt int, cause string) context.Context {
	return context.WithValue(ctx, attemptSeedKey{}, attemptSeed{attempt: attempt, cause: cause})
}

// withLogicalCall returns ctx carrying a logical call, the one already in
// it if any; a new claim's starts from WithAttempt's seed.
func withLogicalCall(ctx context.Context, claim bool) (context.Context, *logicalCall) {
	if lc, ok := ctx.Value(logicalCallKey{}).(*logicalCall); ok {
		return ctx, lc
	}
	lc := &logicalCall{}
	if seed, ok := ctx.Value(attemptSeedKey{}).(attemptSeed); ok && claim && seed.attempt > 1 {
		lc.attempts, lc.cause = seed.attempt-1, seed.cause
	}
	return context.WithValue(ctx, logicalCallKey{}, lc), lc
}

// ErrFleetBudgetExhausted is wrapped into the error of a call whose retry
// idem refused with 429 retry_budget_exhausted: the tenant's retries use
// its retry budget across the fleet. The client stopped retrying at once;
// the error wraps the attempt's error before the refusal too, so
// ErrorCode and errors.Is see the original cause (store_unavailable, a
// timeout), and errors.As finds the *FleetBudgetError.
var ErrFleetBudgetExhausted = errors.New("idem: the tenant's fleet retry budget refused the retry")

// FleetBudgetError is the error of a call stopped by idem's fleet retry
// budget. It wraps ErrFleetBudgetExhausted and Original.
type FleetBudgetError struct {
	// Call names the call ("claim", "complete", …).
	Call string
	// Attempts is how many attempts were sent, the refused one included.
	Attempts int
	// Cause is why the attempt before the refusal failed (CauseTimeout …).
	Cause string
	// Original is that attempt's error: what the caller should act on.
	Original error
	// Refusal is the 429 retry_budget_exhausted answer; its RetryAfter
	// says when the tenant's budget has room again. It is nil when the
	// client sent no retry at all because the failed attempt's answer said
	// the budget is spent (HeaderRetryBudget; Original has that answer).
	Refusal *Error
}

// Error implements error.
func (e *FleetBudgetError) Error() string {
	return fmt.Sprintf("%s: stopped after %d attempts: %v (original cause %s): %v", e.Call, e.Attempts, ErrFleetBudgetExhausted, e.Cause, e.Original)
}

// Unwrap returns ErrFleetBudgetExhausted and the original error.
func (e *FleetBudgetError) Unwrap() []error { return []error{ErrFleetBudgetExhausted, e.Original} }

// Presets of RetryPolicy for the two kinds of caller (issue 28, item 3;
// the numbers are in the retry contract, /docs/retries#presets).
//
// InteractivePolicy is for a call a person waits on: 10 s for the whole
// call, 3 attempts of at most 3 s, waits of 0.2 s growing to 2 s, at most
// 5 s waiting for another holder of the key, the per-process budget as by
// default (10 retries, 0.1 back per success).
func InteractivePolicy() RetryPolicy {
	return RetryPolicy{
		CallDeadline:        10 * time.Second,
		MaxAttempts:         3,
		AttemptTimeout:      3 * time.Second,
		BaseDelay:           200 * time.Millisecond,
		MaxDelay:            2 * time.Second,
		InFlightWait:        5 * time.Second,
		BudgetCapacity:      DefaultBudgetCapacity,
		BudgetSuccessRefund: DefaultBudgetSuccessRefund,
	}.withDefaults()
}

// BackgroundPolicy is for a job nobody waits on: 10 minutes for the whole
// call, 10 attempts of at most 30 s, waits of 1 s growing to 60 s, up to
// 5 minutes waiting for another holder of the key, and a per-process
// budget ten times the default (100 retries, 0.5 back per success).
func BackgroundPolicy() RetryPolicy {
	return RetryPolicy{
		CallDeadline:        10 * time.Minute,
		MaxAttempts:         10,
		AttemptTimeout:      30 * time.Second,
		BaseDelay:           time.Second,
		MaxDelay:            60 * time.Second,
		InFlightWait:        5 * time.Minute,
		BudgetCapacity:      100,
		BudgetSuccessRefund: 0.5,
	}.withDefaults()
}

// Interactive configures the client with InteractivePolicy.
func Interactive() Option { return WithRetryPolicy(InteractivePolicy()) }

// Background configures the client with BackgroundPolicy.
func Background() Option { return WithRetryPolicy(BackgroundPolicy()) }
