package conformance_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem/conformance"
)

// toy is a small in-memory Idempotency-Key middleware written to the draft
// and nothing more, with switches that break it the ways implementations
// in the field are broken. It is what shows the kit can fail: each broken
// toy must fail exactly the scenarios its fault breaks.
type toy struct {
	next http.Handler
	// racy looks the key up without claiming it: no in-flight state, so
	// duplicates in flight all run (a check that reads without a lock).
	racy bool
	// mismatchStatus answers a reused key with another payload (422).
	mismatchStatus int
	// ttl, when set, is the published expiry of a key.
	ttl time.Duration

	mu   sync.Mutex
	keys map[string]*toyEntry
}

type toyEntry struct {
	fingerprint [32]byte
	done        bool
	at          time.Time
	status      int
	header      http.Header
	body        []byte
}

func problem(w http.ResponseWriter, status int, title string) {
	w.Header().Set("Content-Type", "application/problem+json")
	if status == http.StatusConflict {
		w.Header().Set("Retry-After", "1")
	}
	w.WriteHeader(status)
	fmt.Fprintf(w, `{"type":"about:blank","title":%q,"status":%d}`, title, status)
}

// toyKey parses the Idempotency-Key field as an sf-string Item (a bare
// token is taken as the string), 1–255 printable ASCII.
func toyKey(r *http.Request) (string, bool, bool) {
	vals := r.Header.Values("Idempotency-Key")
	if len(vals) == 0 {
		return "", false, true
	}
	if len(vals) > 1 {
		return "", true, false
	}
	v := vals[0]
	if strings.HasPrefix(v, `"`) {
		if len(v) < 2 || !strings.HasSuffix(v, `"`) {
			return "", true, false
		}
		v = v[1 : len(v)-1]
	}
	if v == "" || len(v) > 255 || strings.ContainsAny(v, ", ") {
		return "", true, false
	}
	for i := range len(v) {
		if v[i] < 0x21 || v[i] > 0x7e {
			return "", true, false
		}
	}
	return v, true, true
}

func (m *toy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodGet {
		m.next.ServeHTTP(w, r)
		return
	}
	key, present, ok := toyKey(r)
	switch {
	case !present:
		problem(w, http.StatusBadRequest, "Idempotency-Key is missing")
		return
	case !ok:
		problem(w, http.StatusBadRequest, "Idempotency-Key is malformed")
		return
	}
	body, _ := io.ReadAll(r.Body)
	fp := sha256.Sum256([]byte(r.Method + " " + r.URL.RequestURI() + "\n" + string(body)))
	m.mu.Lock()
	e := m.keys[key]
	if e != nil && m.ttl > 0 && e.done && time.Since(e.at) > m.ttl {
		e = nil
	}
	switch {
	case e != nil && e.fingerprint != fp:
		m.mu.Unlock()
		problem(w, m.mismatchStatus, "Idempotency-Key is already used")
		return
	case e != nil && !e.done:
		m.mu.Unlock()
		problem(w, http.StatusConflict, "A request is outstanding for this Idempotency-Key")
		return
	case e != nil:
		m.mu.Unlock()
		for h, v := range e.header {
			w.Header()[h] = v
		}
		w.Header().Set("Idempotent-Replayed", "true")
		w.WriteHeader(e.status)
		_, _ = w.Write(e.body)
		return
	}
	e = &toyEntry{fingerprint: fp}
	if !m.racy {
		m.keys[key] = e
	}
	m.mu.Unlock()
	rec := httptest.NewRecorder()
	r.Body = io.NopCloser(bytes.NewReader(body))
	m.next.ServeHTTP(rec, r)
	m.mu.Lock()
	e.done, e.at, e.status, e.body = true, time.Now(), rec.Code, rec.Body.Bytes()
	e.header = http.Header{}
	for _, h := range []string{"Content-Type", "Location"} {
		if v := rec.Header().Get(h); v != "" {
			e.header.Set(h, v)
		}
	}
	m.keys[key] = e
	m.mu.Unlock()
	for h, v := range rec.Header() { // the first answer passes as the handler wrote it
		w.Header()[h] = v
	}
	for h, v := range e.header {
		w.Header()[h] = v
	}
	w.WriteHeader(e.status)
	_, _ = w.Write(e.body)
}

// idemOnly are the idem scenarios the toy does not implement (it is no
// idem front door): it must fail them, and only them, when it is sound.
var idemOnly = []string{"json_equivalence", "fingerprint_scope", "non_ijson_body", "prefer_wait", "replay_headers", "problem_members"}

func runToy(t *testing.T, m *toy, opts conformance.Options) conformance.Report {
	t.Helper()
	up := conformance.NewUpstream()
	m.next, m.keys = up, map[string]*toyEntry{}
	if m.mismatchStatus == 0 {
		m.mismatchStatus = http.StatusUnprocessableEntity
	}
	srv := httptest.NewServer(m)
	t.Cleanup(srv.Close)
	opts.Target = srv.URL
	rep := conformance.Run(context.Background(), opts)
	var out strings.Builder
	rep.Write(&out)
	t.Log("\n" + out.String())
	return rep
}

// TestKitFailsBrokenTargets: a sound toy passes every core and recommended
// scenario; each broken toy fails exactly the scenarios of its fault.
func TestKitFailsBrokenTargets(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		toy  *toy
		want []string // failures beyond idemOnly
	}{
		{"sound", &toy{}, nil},
		// The handler runs for every duplicate in flight: one side effect
		// per key breaks, and so does every check of the 409.
		{"runs twice", &toy{racy: true}, []string{"one_side_effect", "in_flight_conflict", "client_disconnect", "in_flight_retry_after", "problem_details"}},
		// 409 for another payload: still refused (core), but not 422.
		{"409 for mismatch", &toy{mismatchStatus: http.StatusConflict}, []string{"mismatch_422", "problem_details"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			rep := runToy(t, c.toy, conformance.Options{})
			var want []string
			for _, s := range conformance.Scenarios() {
				if slices.Contains(c.want, s.Name) || slices.Contains(idemOnly, s.Name) {
					want = append(want, s.Name)
				}
			}
			require.Equal(t, want, rep.Failures())
			require.Equal(t, 2, rep.Skipped(), "expiry and store_unavailable without their options")
		})
	}
}

// TestKitChecksPublishedExpiry: a toy whose keys expire as published
// passes the expiry scenario; one whose keys never expire fails it.
func TestKitChecksPublishedExpiry(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		ttl  time.Duration
		pass bool
	}{{"expires", time.Second, true}, {"never expires", 0, false}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			rep := runToy(t, &toy{ttl: c.ttl}, conformance.Options{Expiry: time.Second, Scenarios: []string{"expiry"}})
			require.Len(t, rep.Results, 1)
			require.Equal(t, c.pass, rep.Results[0].Passed, rep.Results[0].Detail)
		})
	}
}
