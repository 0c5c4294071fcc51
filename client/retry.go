package client

import (
	"context"
	"errors"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/idem-dev/idem/client/backoff"
)

// Jitter selects how the wait before a retry is randomised.
type Jitter int

const (
	// FullJitter waits random(0, min(MaxDelay, BaseDelay·2^n)) before retry
	// n+1 (n = 0 for the first retry). It is the default.
	FullJitter Jitter = iota
	// DecorrelatedJitter waits min(MaxDelay, random(BaseDelay, 3·previous
	// wait)), starting from previous = BaseDelay.
	DecorrelatedJitter
)

// The defaults of RetryPolicy; DefaultRetryPolicy returns them filled in.
const (
	DefaultMaxAttempts         = 3
	DefaultBaseDelay           = time.Second
	DefaultMaxDelay            = 30 * time.Second
	DefaultAttemptTimeout      = 10 * time.Second
	DefaultMinAttemptTime      = 100 * time.Millisecond
	DefaultRetryAfterJitter    = time.Second
	DefaultInFlightWait        = 60 * time.Second
	DefaultBudgetCapacity      = 10.0
	DefaultBudgetRetryCost     = 1.0
	DefaultBudgetSuccessRefund = 0.1
)

// RetryPolicy configures the retry loop around every HTTP call of a Client.
// A zero field takes its default (see the package doc); a negative duration
// or budget value switches that mechanism off where noted.
type RetryPolicy struct {
	// MaxAttempts caps the attempts of one call, the first included.
	// Default 3; 1 disables retries.
	MaxAttempts int
	// BaseDelay and MaxDelay shape the backoff: default 1 s and 30 s.
	BaseDelay time.Duration
	MaxDelay  time.Duration
	// Jitter is FullJitter (default) or DecorrelatedJitter.
	Jitter Jitter
	// AttemptTimeout bounds one attempt (connect, send, read the whole
	// answer); it never extends past the context's deadline. Default 10 s;
	// negative means no per-attempt timeout.
	AttemptTimeout time.Duration
	// MinAttemptTime is the least time an attempt is worth: the loop stops
	// early when the time left before the deadline cannot fit the next wait
	// plus MinAttemptTime. Default 100 ms.
	MinAttemptTime time.Duration
	// RetryAfterJitter is the spread added on top of a Retry-After wait, so
	// that many clients told "1 second" do not return in the same
	// millisecond: the wait is Retry-After + random(0, RetryAfterJitter).
	// Default 1 s; negative means no spread.
	RetryAfterJitter time.Duration
	// Retry500 makes HTTP 500 retryable. Off by default: a 500 says the
	// server failed in a way it did not expect, and repeating the request
	// rarely helps.
	Retry500 bool
	// InFlightWait bounds the total time Do waits for another holder of the
	// key (409 request_in_flight) before it gives up with
	// ErrRequestInFlight. It never extends past the context's deadline.
	// Default 60 s; negative means Do never waits.
	InFlightWait time.Duration
	// BudgetCapacity, BudgetRetryCost and BudgetSuccessRefund configure the
	// client-wide retry budget, a token bucket shared by every call of one
	// Client: it starts full with BudgetCapacity tokens (default 10), every
	// retry takes BudgetRetryCost (default 1) and is refused when fewer are
	// left, and every successful attempt puts back BudgetSuccessRefund
	// (default 0.1) up to the capacity. A negative BudgetCapacity switches
	// the budget off.
	BudgetCapacity      float64
	BudgetRetryCost     float64
	BudgetSuccessRefund float64
	// CallDeadline bounds one whole call, its attempts, waits and (for
	// Do's claim) in-flight waits together, when the context has no
	// sooner deadline. Zero or negative means none: the context's deadline
	// alone. The presets set it (InteractivePolicy: 10 s).
	CallDeadline time.Duration
}

// DefaultRetryPolicy returns the policy a Client uses unless told
// otherwise, every field filled in.
func DefaultRetryPolicy() RetryPolicy {
	return RetryPolicy{}.withDefaults()
}

func (p RetryPolicy) withDefaults() RetryPolicy {
	positiveOr(&p.MaxAttempts, DefaultMaxAttempts)
	positiveOr(&p.BaseDelay, DefaultBaseDelay)
	positiveOr(&p.MaxDelay, DefaultMaxDelay)
	p.MaxDelay = max(p.MaxDelay, p.BaseDelay)
	// AttemptTimeout, RetryAfterJitter, InFlightWait and BudgetCapacity
	// give a negative value a meaning of its own: only zero takes the
	// default.
	nonZeroOr(&p.AttemptTimeout, DefaultAttemptTimeout)
	positiveOr(&p.MinAttemptTime, DefaultMinAttemptTime)
	nonZeroOr(&p.RetryAfterJitter, DefaultRetryAfterJitter)
	nonZeroOr(&p.InFlightWait, DefaultInFlightWait)
	nonZeroOr(&p.BudgetCapacity, DefaultBudgetCapacity)
	positiveOr(&p.BudgetRetryCost, DefaultBudgetRetryCost)
	positiveOr(&p.BudgetSuccessRefund, DefaultBudgetSuccessRefund)
	return p
}

// positiveOr sets *v to d when it is zero or negative.
func positiveOr[T ~int | ~int64 | ~float64](v *T, d T) {
	if *v <= 0 {
		*v = d
	}
}

// nonZeroOr sets *v to d when it is zero.
func nonZeroOr[T ~int64 | ~float64](v *T, d T) {
	if *v == 0 {
		*v = d
	}
}

// backoff returns the wait before retry number n (0 for the first retry).
// prev is the previous wait, for decorrelated jitter.
func (p RetryPolicy) backoff(n int, prev time.Duration) time.Duration {
	switch p.Jitter {
	case DecorrelatedJitter:
		if prev < p.BaseDelay {
			prev = p.BaseDelay
		}
		hi := min(3*prev, p.MaxDelay)
		if hi <= p.BaseDelay {
			return hi
		}
		return p.BaseDelay + rand.N(hi-p.BaseDelay)
	default:
		ceiling := p.fullJitterCeiling(n)
		if ceiling <= 0 {
			return 0
		}
		return rand.N(ceiling)
	}
}

// fullJitterCeiling returns min(MaxDelay, BaseDelay·2^n), the exclusive
// upper bound of the full-jitter wait before retry n.
func (p RetryPolicy) fullJitterCeiling(n int) time.Duration {
	return backoff.Ceiling(p.BaseDelay, p.MaxDelay, n)
}

// retryAfterWait returns the wait for a Retry-After answer.
func (p RetryPolicy) retryAfterWait(ra time.Duration) time.Duration {
	if p.RetryAfterJitter > 0 {
		return addSat(ra, rand.N(p.RetryAfterJitter))
	}
	return ra
}

// addSat adds two non-negative durations, saturating at the largest one:
// a Retry-After near it (a hostile or broken server) plus the spread must
// not wrap around to a negative wait that is retried at once.
func addSat(a, b time.Duration) time.Duration {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// retryBudget is the client-wide token bucket of retries.
type retryBudget struct {
	mu       sync.Mutex
	tokens   float64
	capacity float64
	cost     float64
	refund   float64
	off      bool
}

func newRetryBudget(p RetryPolicy) *retryBudget {
	if p.BudgetCapacity < 0 {
		return &retryBudget{off: true, tokens: math.Inf(1)}
	}
	return &retryBudget{tokens: p.BudgetCapacity, capacity: p.BudgetCapacity, cost: p.BudgetRetryCost, refund: p.BudgetSuccessRefund}
}

// take spends the cost of one retry; false when the bucket cannot pay it.
func (b *retryBudget) take() bool {
	if b.off {
		return true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.tokens+1e-9 < b.cost { // tolerate float sums like 10 × 0.1
		return false
	}
	b.tokens = max(b.tokens-b.cost, 0)
	return true
}

// success refunds a fraction of a retry.
func (b *retryBudget) success() {
	if b.off {
		return
	}
	b.mu.Lock()
	b.tokens = min(b.capacity, b.tokens+b.refund)
	b.mu.Unlock()
}

// left returns the tokens in the bucket (+Inf when the budget is off).
func (b *retryBudget) left() float64 {
	if b.off {
		return math.Inf(1)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.tokens
}

// Clock is the time source of a Client: Now for deadlines, Sleep for the
// waits between attempts. Tests inject a fake one with WithClock to run the
// retry loop without real sleeps.
type Clock interface {
	Now() time.Time
	// Sleep waits d or until ctx is done, whichever comes first, and returns
	// ctx.Err() in the latter case.
	Sleep(ctx context.Context, d time.Duration) error
}

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

func (realClock) Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// retryableStatus reports whether an HTTP status is on the retry allowlist.
func (p RetryPolicy) retryableStatus(status int) bool {
	switch status {
	case http.StatusRequestTimeout, http.StatusTooManyRequests,
		http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true
	case http.StatusInternalServerError:
		return p.Retry500
	}
	return false
}

// retryableTransportError reports whether an error of the transport (no
// HTTP answer) is on the allowlist: connection refused, connection reset
// (including a connection the peer closed before answering: EOF, broken
// pipe) and timeouts.
func retryableTransportError(err error) bool {
	if errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return true
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return true
	}
	return errors.Is(err, context.DeadlineExceeded)
}

// parseRetryAfter reads a Retry-After header: delay-seconds or an
// HTTP-date (relative to now). It returns 0 when absent or unreadable.
func parseRetryAfter(v string, now time.Time) time.Duration {
	if v == "" {
		return 0
	}
	if secs, err := strconv.ParseInt(v, 10, 64); err == nil {
		if secs <= 0 {
			return 0
		}
		return time.Duration(min(secs, math.MaxInt64/int64(time.Second))) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(t.Sub(now), 0)
	}
	return 0
}
