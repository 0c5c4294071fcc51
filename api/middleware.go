package api

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"runtime/debug"
	"sync/atomic"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/auth"
	"github.com/idem-dev/idem/client/frontdoor"
	"github.com/idem-dev/idem/internal/statuswriter"
	"github.com/idem-dev/idem/retrybudget"
)

type ctxKey int

// stateKey holds the request's *reqState.
const stateKey ctxKey = 1

// reqState is what the middlewares learn about one request, in one context
// value (one request copy) instead of one context value each: the request id
// (requestID), the tenant for the access log line, the principal
// (authenticate), the tenant (resolveTenant) and, for the claim, the
// response's header (exposeResponseHeader). Each field is set before the
// handlers that read it run; logTenant is atomic because the access log
// reads it after the handler returned.
type reqState struct {
	id             string
	idHeader       [1]string // the X-Request-Id response header's value
	logTenant      atomic.Pointer[string]
	principal      auth.Principal
	tenant         idem.Tenant
	responseHeader http.Header
	budgetKind     retrybudget.Kind    // the retry budget's kind of call (tenantResolver; KindOther before)
	writer         statuswriter.Writer // the access log's view of the status, kept here: no allocation
}

func stateFrom(ctx context.Context) *reqState {
	st, _ := ctx.Value(stateKey).(*reqState)
	return st
}

// withState returns r's state, attaching a new one to r when the request
// has none (a middleware used outside New's chain).
func withState(r *http.Request) (*reqState, *http.Request) {
	if st := stateFrom(r.Context()); st != nil {
		return st, r
	}
	st := &reqState{}
	return st, r.WithContext(context.WithValue(r.Context(), stateKey, st))
}

// RequestIDHeader carries the request id in both directions.
const RequestIDHeader = "X-Request-Id"

// requestID keeps a well-formed caller X-Request-Id (1–128 characters of
// [A-Za-z0-9._-], the rule the SDKs' front door shares, hence its helpers)
// or generates one, stores it in the context and echoes it in the response.
func requestID(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get(RequestIDHeader)
		if !frontdoor.ValidRequestID(id) {
			id = frontdoor.NewRequestID()
		}
		st, r := withState(r)
		st.id = id
		// The header's value lives in the state: no slice of its own.
		st.idHeader[0] = id
		w.Header()[RequestIDHeader] = st.idHeader[:]
		next.ServeHTTP(w, r)
	})
}

func requestIDFrom(ctx context.Context) string {
	if st := stateFrom(ctx); st != nil {
		return st.id
	}
	return ""
}

// accessLog writes one line per request: request id, method, route pattern,
// status, duration and tenant when known. It never logs headers, tokens or
// bodies. The same observation goes to the Observer (the HTTP latency
// histogram), so one response wrapper and one route pattern serve both.
func (s *service) accessLog(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		st, r := withState(r)
		ww := &st.writer
		ww.ResponseWriter = w
		returned := false
		defer func() {
			end := time.Now()
			status := ww.Status
			if status == 0 {
				status = http.StatusOK
				if !returned {
					// A panic got past the recoverer (http.ErrAbortHandler)
					// before anything was written.
					status = http.StatusInternalServerError
				}
			}
			pattern := routePattern(chi.RouteContext(r.Context()))
			if s.observer != nil {
				s.observer.ObserveHTTP(pattern, r.Method, status, end.Sub(start))
			}
			s.logRequest(r.Context(), st, r.Method, pattern, status, start, end)
		}()
		next.ServeHTTP(ww, r)
		returned = true
	})
}

// routePattern is rc.RoutePattern(), remembered per list of the routers'
// patterns: chi joins them and replaces wildcards anew for every request,
// a few allocations each time, to arrive at one of a handful of answers.
func routePattern(rc *chi.Context) string {
	if rc == nil {
		return ""
	}
	var key routeKey
	if len(rc.RoutePatterns) > len(key) {
		return rc.RoutePattern()
	}
	copy(key[:], rc.RoutePatterns)
	cache := routePatterns.Load()
	if p, ok := (*cache)[key]; ok {
		return p
	}
	p := rc.RoutePattern()
	if len(*cache) < maxRoutePatterns {
		// Copy on write: the routes are few, so this happens a few times.
		next := make(map[routeKey]string, len(*cache)+1)
		maps.Copy(next, *cache)
		next[key] = p
		routePatterns.CompareAndSwap(cache, &next)
	}
	return p
}

// routeKey is the patterns of the routers a request went through (a chi
// Context's RoutePatterns; at most four: the router, a mounted subrouter,
// and room for more).
type routeKey [4]string

// routePatterns maps routeKey to the route pattern, for all servers in
// the process (a pattern depends on nothing else).
var routePatterns atomic.Pointer[map[routeKey]string]

// maxRoutePatterns bounds routePatterns (the routes are a few dozen).
const maxRoutePatterns = 256

func init() { routePatterns.Store(&map[routeKey]string{}) }

// logRequest writes the access log line: it hands the handler the record,
// as slog.Logger.LogAttrs would, minus the runtime.Callers that looks up
// the caller for a source position nobody asks for (NewLogger never sets
// AddSource); the output is the same.
func (s *service) logRequest(ctx context.Context, st *reqState, method, pattern string, status int, start, end time.Time) {
	h := s.logger.Handler()
	if !h.Enabled(ctx, slog.LevelInfo) {
		return
	}
	rec := slog.NewRecord(end, slog.LevelInfo, "http request", 0)
	rec.AddAttrs(
		slog.String("request_id", st.id),
		slog.String("method", method),
		slog.String("route", pattern),
		slog.Int("status", status),
		slog.Duration("duration", end.Sub(start)),
	)
	if t := st.logTenant.Load(); t != nil {
		rec.AddAttrs(slog.String("tenant", *t))
	}
	_ = h.Handle(ctx, rec)
}

// recoverer turns a panic into a 500 problem and logs it with its stack.
func (s *service) recoverer(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			v := recover()
			if v == nil {
				return
			}
			if v == http.ErrAbortHandler {
				panic(v)
			}
			s.logger.ErrorContext(r.Context(), "panic serving request",
				slog.String("request_id", requestIDFrom(r.Context())),
				slog.String("panic", fmt.Sprint(v)),
				slog.String("stack", string(debug.Stack())))
			s.writeProblem(w, r, fmt.Errorf("panic: %v", v))
		}()
		next.ServeHTTP(w, r)
	})
}

// exposeResponseHeader puts the response's header into the request's
// state, for an endpoint whose answer carries a header on success and on
// error alike (the claim's Preference-Applied).
func exposeResponseHeader(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		st, r := withState(r)
		st.responseHeader = w.Header()
		next.ServeHTTP(w, r)
	})
}

// responseHeaderFrom returns the header exposeResponseHeader exposed, or nil.
func responseHeaderFrom(ctx context.Context) http.Header {
	if st := stateFrom(ctx); st != nil {
		return st.responseHeader
	}
	return nil
}
