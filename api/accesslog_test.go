package api

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/stretchr/testify/require"
)

// TestAccessLineIsSlogJSON: the access log line NewJSONLogHandler writes by
// itself is byte for byte the line slog's JSON handler writes for the same
// record, over random request ids, methods, routes, statuses, durations,
// tenants and times (values that need escaping included: those go through
// slog), and at a level that turns the line off.
func TestAccessLineIsSlogJSON(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(14, 7))
	words := []string{"", "a", "req-1.x_Z", "POST", "/v1/keys/{key}/claim", "<&>", "a\"b", `back\slash`, "tab\t", "\x00", "é", "\u2028", "\xff", "~!#$%'*+^`|"}
	zones := []*time.Location{time.UTC, time.FixedZone("", 5*3600+1800), time.FixedZone("X", -8*3600)}
	word := func() string {
		if rng.IntN(3) == 0 {
			return words[rng.IntN(len(words))] + words[rng.IntN(len(words))]
		}
		return words[rng.IntN(len(words))]
	}
	fast, slow := 0, 0
	for range 3000 {
		var got, want bytes.Buffer
		h := NewJSONLogHandler(&got, nil)
		st := &reqState{id: word()}
		if rng.IntN(2) == 0 {
			st.logTenant.Store(new(word()))
		}
		method, route, status := word(), word(), 100+rng.IntN(500)
		start := time.Unix(rng.Int64N(1<<34), rng.Int64N(1e9)).In(zones[rng.IntN(len(zones))])
		if rng.IntN(10) == 0 {
			start = start.Truncate(time.Second) // a time RFC3339Nano writes without a fraction
		}
		end := start.Add(time.Duration(rng.Int64N(int64(time.Minute))))
		(&service{logger: slog.New(h)}).logRequest(context.Background(), st, method, route, status, start, end)
		(&service{logger: slog.New(slog.NewJSONHandler(&want, nil))}).logRequest(context.Background(), st, method, route, status, start, end)
		require.Equal(t, want.String(), got.String())
		if h.(*jsonLogHandler).writeAccessLine(end, st.id, method, route, status, end.Sub(start), st.logTenant.Load()) {
			fast++
		} else {
			slow++
		}
	}
	require.Positive(t, fast)
	require.Positive(t, slow)

	var out bytes.Buffer
	s := &service{logger: slog.New(NewJSONLogHandler(&out, &slog.HandlerOptions{Level: slog.LevelWarn}))}
	s.logRequest(context.Background(), &reqState{id: "r"}, "GET", "/healthz", 200, time.Now(), time.Now())
	require.Empty(t, out.String(), "an access line below the handler's level")
}

// TestJSONLogHandlerWritesWholeLines: lines written at once by both of the
// handler's paths and by a handler derived from it never interleave.
func TestJSONLogHandlerWritesWholeLines(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	w := &slowWriter{w: &out}
	logger := slog.New(NewJSONLogHandler(w, nil))
	s := &service{logger: logger}
	derived := logger.With("component", "jobs")
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for range 50 {
				switch i % 3 {
				case 0:
					s.logRequest(context.Background(), &reqState{id: "req"}, "POST", "/v1/keys/{key}/claim", 201, time.Now(), time.Now())
				case 1:
					logger.Info("something", "n", i)
				default:
					derived.Warn("other", "n", i)
				}
			}
		})
	}
	wg.Wait()
	sc := bufio.NewScanner(&out)
	lines := 0
	for sc.Scan() {
		require.True(t, json.Valid(sc.Bytes()), "line %q", sc.Text())
		lines++
	}
	require.Equal(t, 400, lines)
}

// slowWriter writes its input in two halves, so that two writes at once
// would interleave if the handler let them.
type slowWriter struct{ w io.Writer }

func (s *slowWriter) Write(p []byte) (int, error) {
	n, _ := s.w.Write(p[:len(p)/2])
	time.Sleep(time.Microsecond)
	m, err := s.w.Write(p[len(p)/2:])
	return n + m, err
}

// BenchmarkAccessLog is what the access log middleware costs one request
// (request id, the line, the route pattern) with the JSON logger the
// server uses and with slog's, writing to io.Discard so the write itself
// is left out; the request goes through a chi router and a subrouter, as
// in New, to a handler that does nothing.
func BenchmarkAccessLog(b *testing.B) {
	for _, bc := range []struct {
		name string
		h    slog.Handler
	}{
		{"slog", slog.NewJSONHandler(io.Discard, nil)},
		{"server", NewJSONLogHandler(io.Discard, nil)},
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
