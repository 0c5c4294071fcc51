package api

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/auth"
)

// authenticate verifies the bearer token and puts its principal in the
// request's state; anything else is 401 unauthenticated.
func (s *server) authenticate(next http.Handler) http.Handler {
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
func (s *server) requireScope(scopes ...string) func(http.Handler) http.Handler {
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
// missing or disabled), applies the tenant's rate limit (429) and puts the
// tenant in the request's state. The tenant comes only from the token.
func (s *server) resolveTenant(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p := principalFrom(r.Context())
		if p.Tenant == "" {
			s.writeProblem(w, r, idem.Errorf(idem.CodeTenantUnknown, "the token names no tenant"))
			return
		}
		t, err := s.tenants.Active(r.Context(), p.Tenant)
		if err != nil {
			s.writeProblem(w, r, err)
			return
		}
		st, r := withState(r)
		id := t.ID
		st.logTenant.Store(&id)
		if ok, wait := s.limiter.allow(t.ID, t.Settings.RateLimitPerSecond); !ok {
			s.writeProblem(w, r, &idem.Error{
				Code:       idem.CodeRateLimited,
				Detail:     "the tenant is over its request rate limit",
				RetryAfter: wait,
			})
			return
		}
		st.tenant = t
		next.ServeHTTP(w, r)
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
	tokens float64
	last   time.Time
}

func newLimiter(now func() time.Time) *limiter {
	return &limiter{now: now, buckets: map[string]*bucket{}}
}

// allow takes one token from the tenant's bucket. A rate of 0 or less is
// off. When the bucket is empty it returns the wait until the next token.
func (l *limiter) allow(tenant string, rate int) (bool, time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if rate <= 0 {
		delete(l.buckets, tenant)
		return true, 0
	}
	now := l.now()
	burst := float64(rate)
	b, ok := l.buckets[tenant]
	if !ok {
		b = &bucket{tokens: burst, last: now}
		l.buckets[tenant] = b
	}
	if elapsed := now.Sub(b.last).Seconds(); elapsed > 0 {
		b.tokens = min(burst, b.tokens+elapsed*float64(rate))
	}
	b.last = now
	// A lowered rate caps the bucket at once.
	b.tokens = min(b.tokens, burst)
	if b.tokens >= 1 {
		b.tokens--
		return true, 0
	}
	wait := time.Duration((1 - b.tokens) / float64(rate) * float64(time.Second))
	return false, wait
}
