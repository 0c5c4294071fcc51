package api

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/go-chi/chi/v5"
	"github.com/stretchr/testify/require"
)

// BenchmarkAccessLog is what the access log middleware costs one request
// (request id, the line, the route pattern) with the JSON logger the
// server uses (slog's), writing to io.Discard so the write itself is left
// out; the request goes through a chi router and a subrouter, as
// in New, to a handler that does nothing.
func BenchmarkAccessLog(b *testing.B) {
	for _, bc := range []struct {
		name string
		h    slog.Handler
	}{
		{"slog", slog.NewJSONHandler(io.Discard, nil)},
	} {
		b.Run(bc.name, func(b *testing.B) {
			s := &service{logger: slog.New(bc.h)}
			h := chi.NewRouter()
			h.Use(requestID, s.accessLog)
			h.Route("/v1", func(r chi.Router) {
				r.Post("/keys/{key}/claim", func(w http.ResponseWriter, r *http.Request) {
					stateFrom(r.Context()).logTenant.Store(new("bench"))
					w.WriteHeader(http.StatusCreated)
				})
			})
			r := httptest.NewRequest(http.MethodPost, "/v1/keys/k/claim", strings.NewReader(""))
			w := httptest.NewRecorder()
			b.ReportAllocs()
			for b.Loop() {
				h.ServeHTTP(w, r)
			}
		})
	}
}

// TestRoutePatternIsChis: the remembered route pattern is chi's, for route
// lists of every length (past routeKey's four too) and on repeat.
func TestRoutePatternIsChis(t *testing.T) {
	t.Parallel()
	require.Empty(t, routePattern(nil))
	for _, pats := range [][]string{
		nil, {"/"}, {"/healthz"}, {"/v1/*", "/keys/{key}/claim"}, {"/v1/*", "/keys/{key}/claim/"},
		{"/*", "/v1/*", "/*/", "/keys"}, {"/a/*", "/b/*", "/c/*", "/d/*", "/e"}, {"/v1/*", "/keys/{key}"},
	} {
		rc := &chi.Context{RoutePatterns: pats}
		for range 2 {
			require.Equal(t, rc.RoutePattern(), routePattern(rc), "%q", pats)
		}
	}
}
