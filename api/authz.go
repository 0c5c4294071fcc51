package api

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/auth"
	"github.com/idem-dev/idem/retrybudget"
)

// authenticate verifies the bearer token, which must carry iat, and puts
// its principal in the request's state; anything else is 401
// unauthenticated.
func (s *service) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := r.Header.Get("Authorization")
		scheme, token, ok := strings.Cut(h, " ")
		if !ok || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(token) == "" {
			s.writeProblem(w, r, idem.Errorf(idem.CodeUnauthenticated, "an Authorization: Bearer token is required"))
			return
		}
		p, err := s.verifier.Verify(strings.TrimSpace(token))
		if err != nil {
			s.writeProblem(w, r, err)
			return
		}
		if p.IssuedAt.IsZero() {
			// Without iat a token cannot be told from one of a deleted
			// tenant whose id was given again (see tenantResolver).
			s.writeProblem(w, r, idem.Errorf(idem.CodeUnauthenticated, "the token lacks a required claim (iat)"))
			return
		}
		st, r := withState(r)
		st.principal = p
		next.ServeHTTP(w, r)
	})
}

func principalFrom(ctx context.Context) auth.Principal {
	if st := stateFrom(ctx); st != nil {
		return st.principal
	}
	return auth.Principal{}
}

// requireScope answers 403 forbidden unless the principal holds one of
// scopes.
func (s *service) requireScope(scopes ...string) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			p := principalFrom(r.Context())
			for _, sc := range scopes {
				if p.HasScope(sc) {
					next.ServeHTTP(w, r)
					return
				}
			}
			s.writeProblem(w, r, idem.Errorf(idem.CodeForbidden, "the token lacks the scope %s", strings.Join(scopes, " or ")))
		})
	}
}

// resolveTenant loads the token's tenant (403 tenant_unknown when it is
// missing or disabled; 401 unauthenticated when the token was issued
// before the tenant was created), applies the tenant's rate limit (429)
// and puts the tenant in the request's state. The tenant comes only from
// the token.
//
// A tenant over its limit is refused first, from the limiter alone: no
// tenant lookup (which may reach the store), no body read, so a flood of
// refused requests costs its neighbours as little as possible. The limiter
// uses the rate of the tenant's last admitted request, which is at most as
// old as the tenant cache's entry.
//
// The retry budget decides next, the same way: a request whose
// Idem-Attempt says it is a retry, past the tenant's retry_budget_percent
// of first attempts on this replica, is refused with 429
// retry_budget_exhausted before the tenant lookup, so during a store
// outage (when the lookup itself may fail) the budget still holds the
// retries off, and a refused retry has touched nothing: its key is as it
// was.
func (s *service) resolveTenant(next http.Handler) http.Handler {
	return s.tenantResolver(s.tenants.Active, retrybudget.KindOther)(next)
}

// resolveClaimTenant is resolveTenant for the claim, whose retries the
// budget weighs against the tenant's first claims (retrybudget.Kind).
func (s *service) resolveClaimTenant(next http.Handler) http.Handler {
	return s.tenantResolver(s.tenants.Active, retrybudget.KindClaim)(next)
}

// resolveFinishingTenant is resolveTenant for the token-guarded writes
// that finish a claim (checkpoint, complete, release): a suspended
// (disabled) tenant is let through, so the work its workers had under way
// is stored or given up rather than refused and run again once the tenant
// is back. Only a claim starts work, and a suspended tenant makes none.
//
// For the same reason the fleet retry budget does not decide them: a
// retry of a finishing write is never refused (nor counted against the
// allowance), and no answer of theirs carries Idem-Retry-Budget: exhausted
// (the request state's budgetKind). A complete given up during a storm
// leaves work that ran unrecorded and its key in flight, and the next
// attempt after the lease runs the work again: the budget would buy its
// retry savings with duplicates. Their retries stay bounded without it: an
// admitted claim has one complete (or release), and each SDK's own policy
// and deadline bound its retries. Their attempts still reach the attempt
// metrics (idem_attempts_total), and a first attempt counts among the
// first attempts like any other (web/docs/retries#fleet-budget).
// kind is the write's kind of call for the retry budget.
func (s *service) resolveFinishingTenant(kind retrybudget.Kind) func(http.Handler) http.Handler {
	return s.tenantResolver(s.tenants.Known, kind)
}

// tenantResolver is resolveTenant with the tenant lookup lookup, for
// requests of the retry budget's kind of call kind; a finishing write's
// (checkpoint, complete, release) is exempt from the budget's decision and
// signal.
func (s *service) tenantResolver(lookup func(context.Context, string) (idem.Tenant, error), kind retrybudget.Kind) func(http.Handler) http.Handler {
	finishing := kind.Finishing()
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			p := principalFrom(r.Context())
			if p.Tenant == "" {
				s.writeProblem(w, r, idem.Errorf(idem.CodeTenantUnknown, "the token names no tenant"))
				return
			}
			st, r := withState(r)
			st.budgetKind = kind
			if wait, limited := s.limiter.limited(p.Tenant); limited {
				id := p.Tenant
				st.logTenant.Store(&id)
				s.rateLimited(w, r, wait)
				return
			}
			attempt := retrybudget.ParseAttempt(r.Header.Values(retrybudget.Header))
			d := retrybudget.Decision{Allowed: true}
			if !finishing || !attempt.Retry() {
				d = s.retries.Admit(p.Tenant, kind, attempt)
			}
			if s.observer != nil {
				s.observer.ObserveAttempt(p.Tenant, attempt, !d.Allowed)
			}
			if !d.Allowed {
				id := p.Tenant
				st.logTenant.Store(&id)
				s.writeProblem(w, r, &idem.Error{
					Code: idem.CodeRetryBudgetExhausted,
					Detail: fmt.Sprintf("this request is attempt %d (cause %s) and the tenant's retries already use its retry budget on this replica "+
						"(retry_budget_percent of the first attempts of the same call, %s, over %s; at least %d of every call): stop retrying this call and report its original cause",
						attempt.Number, attempt.Cause, kind, s.retries.Window(), retrybudget.Floor),
					RetryAfter: d.RetryAfter,
				})
				return
			}
			t, err := lookup(r.Context(), p.Tenant)
			if err != nil {
				s.writeProblem(w, r, err)
				return
			}
			if p.IssuedBefore(t.CreatedAt) {
				// A token of an earlier tenant of this id, deleted since:
				// the id is someone else's now. The tenant's created_at
				// comes with the cached tenant, so this costs no store call.
				s.writeProblem(w, r, idem.Errorf(idem.CodeUnauthenticated, "the token was issued before its tenant was created (a token of a deleted tenant with the same id)"))
				return
			}
			id := t.ID
			st.logTenant.Store(&id)
			s.retries.SetPercent(t.ID, t.Settings.RetryBudgetPercent)
			if ok, wait := s.limiter.allow(t.ID, t.Settings.RateLimitPerSecond); !ok {
				s.rateLimited(w, r, wait)
				return
			}
			st.tenant = t
			next.ServeHTTP(w, r)
		})
	}
}

func (s *service) rateLimited(w http.ResponseWriter, r *http.Request, wait time.Duration) {
	s.writeProblem(w, r, &idem.Error{
		Code:       idem.CodeRateLimited,
		Detail:     "the tenant is over its request rate limit",
		RetryAfter: wait,
	})
}

func tenantFrom(ctx context.Context) idem.Tenant {
	if st := stateFrom(ctx); st != nil {
		return st.tenant
	}
	return idem.Tenant{}
}

// limiter is an in-memory token bucket per tenant. It lives in one replica:
// with N replicas behind a load balancer the fleet admits up to N times the
// tenant's rate_limit_per_second. The burst is one second's worth of
// requests.
type limiter struct {
	now     func() time.Time
	mu      sync.Mutex
	buckets map[string]*bucket
}

type bucket struct {
	rate   int // of the last allow call
	tokens float64
	last   time.Time
}

func newLimiter(now func() time.Time) *limiter {
	return &limiter{now: now, buckets: map[string]*bucket{}}
}

// refill adds the tokens earned since b.last at b.rate, up to the burst.
func (b *bucket) refill(now time.Time) {
	burst := float64(b.rate)
	if elapsed := now.Sub(b.last).Seconds(); elapsed > 0 {
		b.tokens = min(burst, b.tokens+elapsed*float64(b.rate))
	}
	b.last = now
	// A lowered rate caps the bucket at once.
	b.tokens = min(b.tokens, burst)
}

// wait is the time until the bucket holds one token.
func (b *bucket) wait() time.Duration {
	return time.Duration((1 - b.tokens) / float64(b.rate) * float64(time.Second))
}

// limited reports whether the tenant's bucket is empty at the rate of its
// last allow call, and the wait until the next token. It takes no token: a
// request it lets through still goes through allow with the current rate.
// A tenant without a bucket (never seen, or rate limit off) is not limited.
func (l *limiter) limited(tenant string) (time.Duration, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	b, ok := l.buckets[tenant]
	if !ok {
		return 0, false
	}
	b.refill(l.now())
	if b.tokens >= 1 {
		return 0, false
	}
	return b.wait(), true
}

// allow takes one token from the tenant's bucket at rate. A rate of 0 or
// less is off. When the bucket is empty it returns the wait until the next
// token.
func (l *limiter) allow(tenant string, rate int) (bool, time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if rate <= 0 {
		delete(l.buckets, tenant)
		return true, 0
	}
	now := l.now()
	b, ok := l.buckets[tenant]
	if !ok {
		b = &bucket{tokens: float64(rate), last: now}
		l.buckets[tenant] = b
	}
	b.rate = rate
	b.refill(now)
	if b.tokens >= 1 {
		b.tokens--
		return true, 0
	}
	return false, b.wait()
}
