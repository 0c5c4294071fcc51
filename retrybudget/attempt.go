// Package retrybudget is the fleet-wide retry budget of a tenant, kept by
// each replica: the Idem-Attempt request header every SDK sends (which
// attempt of a logical call this request is, and why the previous one
// failed), and a sliding window per tenant of first attempts and retries
// of each kind of call that refuses a retry once the retries of its kind in
// the window reach the tenant's retry_budget_percent of its first attempts
// of that kind, and the tenant's retries of every kind reach Floor.
//
// A share needs no coordination between replicas: behind a load balancer
// each replica sees about the same mix of first attempts and retries, so
// each one refusing past the share bounds the fleet's amplification to the
// same share however many replicas run. A per-client cap cannot do that:
// a hundred clients each retrying three times amplify 300 times while each
// looks reasonable on its own (issue 28; web/docs/retries).
package retrybudget

import (
	"github.com/dunglas/httpsfv"
)

// Header is the request header naming the attempt: an RFC 9651 Item, an
// Integer (the 1-based attempt of this logical call) with an optional
// Token parameter cause, e.g. "Idem-Attempt: 2;cause=timeout".
const Header = "Idem-Attempt"

// SignalHeader is the response header by which idem tells a caller, on a
// retryable failure (503, other 5xx, 429, 409 request_in_flight), that the
// tenant's fleet retry budget on this replica is spent: an RFC 9651 Item,
// the Token exhausted ("Idem-Retry-Budget: exhausted"). It is absent
// otherwise. An SDK that reads it sends no retry of that call and reports
// the failure's own cause, as for a 429 retry_budget_exhausted: every
// caller learns of the budget from the failure it already has, not from a
// refused retry of its own (itself an attempt reaching idem).
const SignalHeader = "Idem-Retry-Budget"

// Exhausted is SignalHeader's value when the budget is spent.
const Exhausted = "exhausted"

// Cause is why the previous attempt of a logical call failed, the value of
// the cause parameter.
type Cause string

// The causes of the contract. CauseNone is a first attempt's;
// CauseOther a retry's whose header names no cause, or one outside the
// contract (kept out of the metrics' labels as itself).
const (
	CauseNone        Cause = "none"
	CauseTimeout     Cause = "timeout"
	CauseNetwork     Cause = "network"
	CauseUnavailable Cause = "unavailable"  // 503
	CauseThrottled   Cause = "throttled"    // 429
	CauseServerError Cause = "server-error" // any other 5xx
	CauseInFlight    Cause = "in-flight"    // a 409 request_in_flight waited out
	CauseOther       Cause = "other"
)

// Causes lists every cause a retry can be counted under, CauseOther
// last: the label values of the metrics.
var Causes = []Cause{CauseTimeout, CauseNetwork, CauseUnavailable, CauseThrottled, CauseServerError, CauseInFlight, CauseOther}

// Attempt is what an Idem-Attempt header says.
type Attempt struct {
	// Number is the 1-based attempt of the logical call.
	Number int64
	// Cause is CauseNone for a first attempt, else why the previous
	// attempt failed.
	Cause Cause
}

// Retry reports whether the attempt is a retry (not the first).
func (a Attempt) Retry() bool { return a.Number > 1 }

// First is the attempt of a request without the header.
var First = Attempt{Number: 1, Cause: CauseNone}

// ParseAttempt reads the Idem-Attempt header's field lines (http.Header's
// Values). A missing or unparsable header, or a number below 1, is a first
// attempt: the header is advice from the caller, never a reason to refuse a
// request. The parser is github.com/dunglas/httpsfv (RFC 9651), strict: a
// field that is not one Item (e.g. two lines, "2, 3") is unparsable.
func ParseAttempt(values []string) Attempt {
	if len(values) == 0 {
		return First
	}
	item, err := httpsfv.UnmarshalItem(values)
	if err != nil {
		return First
	}
	n, ok := item.Value.(int64)
	if !ok || n < 1 {
		return First
	}
	if n == 1 {
		return First
	}
	a := Attempt{Number: n, Cause: CauseOther}
	if v, ok := item.Params.Get("cause"); ok {
		if tok, ok := v.(httpsfv.Token); ok {
			a.Cause = knownCause(Cause(tok))
		}
	}
	return a
}

func knownCause(c Cause) Cause {
	for _, k := range Causes {
		if c == k {
			return c
		}
	}
	return CauseOther
}

// Format returns the header value of attempt n after a failure of cause
// (ignored for n = 1): "1", or "2;cause=timeout".
func Format(n int64, cause Cause) string {
	item := httpsfv.NewItem(n)
	if n > 1 && cause != "" && cause != CauseNone {
		item.Params.Add("cause", httpsfv.Token(cause))
	}
	s, err := httpsfv.Marshal(item)
	if err != nil {
		return "1"
	}
	return s
}
