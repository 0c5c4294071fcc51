package api

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net/http"
	"runtime/debug"
	"sync/atomic"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
)

type ctxKey int

const (
	requestIDKey ctxKey = iota + 1
	logInfoKey
	principalKey
	tenantKey
)

// RequestIDHeader carries the request id in both directions.
const RequestIDHeader = "X-Request-Id"

// validRequestID reports whether a caller's request id may be kept: 1–128
// characters of [A-Za-z0-9._-].
func validRequestID(id string) bool {
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

func newRequestID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return hex.EncodeToString(b[:])
}

// requestID keeps a well-formed caller X-Request-Id or generates one, stores
// it in the context and echoes it in the response.
func requestID(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get(RequestIDHeader)
		if !validRequestID(id) {
			id = newRequestID()
		}
		w.Header().Set(RequestIDHeader, id)
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), requestIDKey, id)))
	})
}

func requestIDFrom(ctx context.Context) string {
	id, _ := ctx.Value(requestIDKey).(string)
	return id
}

// logInfo is filled in by inner handlers for the access log line.
type logInfo struct {
	tenant atomic.Pointer[string]
}

func setLogTenant(ctx context.Context, tenant string) {
	if li, ok := ctx.Value(logInfoKey).(*logInfo); ok {
		li.tenant.Store(&tenant)
	}
}

// accessLog writes one line per request: request id, method, route pattern,
// status, duration and tenant when known. It never logs headers, tokens or
// bodies.
func (s *server) accessLog(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		li := &logInfo{}
		ww := middleware.NewWrapResponseWriter(w, r.ProtoMajor)
		r = r.WithContext(context.WithValue(r.Context(), logInfoKey, li))
		defer func() {
			status := ww.Status()
			if status == 0 {
				status = http.StatusOK
			}
			pattern := ""
			if rc := chi.RouteContext(r.Context()); rc != nil {
				pattern = rc.RoutePattern()
			}
			attrs := []slog.Attr{
				slog.String("request_id", requestIDFrom(r.Context())),
				slog.String("method", r.Method),
				slog.String("route", pattern),
				slog.Int("status", status),
				slog.Duration("duration", time.Since(start)),
			}
			if t := li.tenant.Load(); t != nil {
				attrs = append(attrs, slog.String("tenant", *t))
			}
			s.logger.LogAttrs(r.Context(), slog.LevelInfo, "http request", attrs...)
		}()
		next.ServeHTTP(ww, r)
	})
}

// recoverer turns a panic into a 500 problem and logs it with its stack.
func (s *server) recoverer(next http.Handler) http.Handler {
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
