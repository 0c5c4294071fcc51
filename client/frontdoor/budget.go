package frontdoor

import (
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/idem-dev/idem/client/errcode"
)

// Rule 9 (docs/frontdoor.md): a front door joins idem's fleet retry budget
// (the retry contract, /docs/retries#fleet-budget). Its caller's retry of a
// request with the same Idempotency-Key is a retry of one logical call,
// and it says so in its Idem-Attempt field: the front door claims as that
// attempt, so the budget counts it, and answers the budget's refusal so
// that its caller stops retrying, as the SDKs do.

// HeaderAttempt is the request field naming the attempt of a logical call
// (an RFC 9651 Item: an Integer, with an optional cause Token parameter:
// "2;cause=timeout"), and HeaderRetryBudget the response field by which a
// front door, as idem, says that the tenant's fleet retry budget is spent
// ("Idem-Retry-Budget: exhausted").
const (
	HeaderAttempt     = "Idem-Attempt"
	HeaderRetryBudget = "Idem-Retry-Budget"
	// RetryBudgetExhausted is HeaderRetryBudget's value.
	RetryBudgetExhausted = "exhausted"
)

// CodeRetryBudgetExhausted: the caller's retry (its Idem-Attempt above 1)
// was refused by the tenant's fleet retry budget before anything was
// claimed or run. Retryable (the same request may pass later, after
// Retry-After), but the caller should stop retrying this call now and
// report the failure that made it retry (rule 9).
const CodeRetryBudgetExhausted = errcode.RetryBudgetExhausted

// RetryBudgetDetail is the detail of CodeRetryBudgetExhausted, the same in
// every front door.
const RetryBudgetDetail = "this request is a retry and the tenant's fleet retry budget is spent: it was not processed and the idempotency key is as it was; stop retrying now and report the failure that made you retry (Retry-After says when the budget has room again)"

// Attempt is what a caller's Idem-Attempt field says: the 1-based attempt
// of its logical call and, for a retry, the cause it named ("" when none,
// or one that is not a Token).
type Attempt struct {
	Number int
	Cause  string
}

// Retry reports whether the attempt is a retry (above the first).
func (a Attempt) Retry() bool { return a.Number > 1 }

// String is the field value passed on to idem: "1", "2", "2;cause=timeout".
func (a Attempt) String() string {
	n := max(a.Number, 1)
	if n == 1 || a.Cause == "" {
		return strconv.Itoa(n)
	}
	return strconv.Itoa(n) + ";cause=" + a.Cause
}

// CallerAttempt reads the caller's Idem-Attempt field lines (http.Header's
// Values). A missing field, one that is not a single RFC 9651 Integer Item
// of 1 or more (two field lines, a list, a decimal, junk), is a first
// attempt: the field is advice, never a reason to refuse a request
// (testvectors/frontdoor/policy.json, member attempts; the idem server's
// retrybudget.ParseAttempt reads every vector the same way). Parameters
// other than cause, and a cause that is not a Token, are ignored.
func CallerAttempt(values []string) Attempt {
	first := Attempt{Number: 1}
	if len(values) != 1 {
		return first
	}
	parts := strings.Split(strings.Trim(values[0], " \t"), ";")
	num := parts[0]
	if num == "" || len(num) > 15 || strings.Trim(num, "0123456789") != "" {
		return first
	}
	n, err := strconv.Atoi(num)
	if err != nil || n < 1 {
		return first
	}
	a := Attempt{Number: n}
	for _, p := range parts[1:] {
		name, value, hasValue := strings.Cut(strings.TrimLeft(p, " "), "=")
		if !sfKey(name) || (hasValue && !sfBareItem(value)) {
			return first
		}
		if name == "cause" && sfToken(value) && n > 1 {
			a.Cause = value
		}
	}
	return a
}

// Budget is a Door that keeps the fleet retry budget itself: the gateway,
// which claims in the store directly, not through the idem API that keeps
// it for the middleware. Serve asks Admit after the key and its scope and
// before the body is read, so a refused retry costs neither body memory
// nor a store call and leaves its key as it was; and Spent before it
// answers a retryable refusal of the claim, whose answer then carries
// HeaderRetryBudget.
type Budget interface {
	// Admit counts the attempt and returns the refusal of a retry past the
	// budget (BudgetRefusal), or nil.
	Admit(r *http.Request, a Attempt) error
	// Spent reports whether the budget is spent, for a retryable refusal
	// about to be answered.
	Spent(r *http.Request) bool
}

// BudgetRefusal is the answer to a retry the fleet retry budget refused:
// 429 retry_budget_exhausted with Retry-After (when the budget has room
// again) and HeaderRetryBudget.
func BudgetRefusal(retryAfter time.Duration) *Error {
	return &Error{Code: CodeRetryBudgetExhausted, Detail: RetryBudgetDetail, RetryAfter: retryAfter, BudgetSpent: true}
}

// SpentBudget returns e saying the fleet retry budget is spent
// (HeaderRetryBudget) when spent and e is retryable: a refusal nobody
// retries never carries it.
func SpentBudget(e *Error, spent bool) *Error {
	if spent && Problems[e.Code].Retryable {
		e.BudgetSpent = true
	}
	return e
}

// markSpent sets BudgetSpent on a retryable refusal err of the claim when
// the door's budget is spent.
func markSpent(err error, b Budget, r *http.Request) {
	var e *Error
	if errors.As(err, &e) && !e.BudgetSpent && Problems[e.Code].Retryable {
		SpentBudget(e, b.Spent(r))
	}
}

// sfKey reports whether s is an RFC 9651 key: lcalpha or "*", then
// lcalpha, digits, "_", "-", "." or "*".
func sfKey(s string) bool {
	if s == "" || !(s[0] >= 'a' && s[0] <= 'z' || s[0] == '*') {
		return false
	}
	for i := 1; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || strings.IndexByte("_-.*", c) >= 0) {
			return false
		}
	}
	return true
}

// sfToken reports whether s is an RFC 9651 Token: ALPHA or "*", then
// tchar, ":" or "/".
func sfToken(s string) bool {
	if s == "" || !(s[0] >= 'a' && s[0] <= 'z' || s[0] >= 'A' && s[0] <= 'Z' || s[0] == '*') {
		return false
	}
	for i := 1; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~:/", c) >= 0) {
			return false
		}
	}
	return true
}

// sfBareItem reports whether s is a parameter value the Item may carry: a
// Token, an Integer or Decimal, a Boolean or a String without ";" (the
// split above). Anything else makes the field unparsable.
func sfBareItem(s string) bool {
	switch {
	case sfToken(s), s == "?0", s == "?1":
		return true
	case len(s) >= 2 && s[0] == '"' && s[len(s)-1] == '"':
		return true
	}
	t := strings.TrimPrefix(s, "-")
	whole, frac, dot := strings.Cut(t, ".")
	digits := func(d string, most int) bool { return d != "" && len(d) <= most && strings.Trim(d, "0123456789") == "" }
	if !dot {
		return digits(whole, 15)
	}
	return digits(whole, 12) && digits(frac, 3)
}
