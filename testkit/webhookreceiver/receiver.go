// Package webhookreceiver is a loopback webhook receiver for tests: it
// verifies every request's Standard Webhooks signature with code of its
// own (not package webhooks' signer, so a wrong signer cannot agree with
// itself), counts requests per webhook-id, and answers per a script.
package webhookreceiver

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Verify checks a Standard Webhooks request the way a receiver would: the
// secret is "whsec_" and the base64 key; the signed content is
// "<webhook-id>.<webhook-timestamp>.<body>" under HMAC-SHA256; any one of
// the space-separated "v1,<base64>" entries may match; the timestamp must
// be within five minutes of now.
func Verify(secret string, h http.Header, body []byte) error {
	id, ts, sigs := h.Get("Webhook-Id"), h.Get("Webhook-Timestamp"), h.Get("Webhook-Signature")
	if id == "" || ts == "" || sigs == "" {
		return errors.New("missing webhook headers")
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return fmt.Errorf("bad timestamp %q", ts)
	}
	if d := time.Since(time.Unix(sec, 0)); d > 5*time.Minute || d < -5*time.Minute {
		return fmt.Errorf("timestamp %s too far from now", ts)
	}
	b64key, ok := strings.CutPrefix(secret, "whsec_")
	if !ok {
		return errors.New("secret without whsec_ prefix")
	}
	key, err := base64.StdEncoding.DecodeString(b64key)
	if err != nil {
		return err
	}
	mac := hmac.New(sha256.New, key)
	fmt.Fprintf(mac, "%s.%s.%s", id, ts, body)
	want := mac.Sum(nil)
	for _, s := range strings.Fields(sigs) {
		v, b64, ok := strings.Cut(s, ",")
		if !ok || v != "v1" {
			continue
		}
		got, err := base64.StdEncoding.DecodeString(b64)
		if err == nil && hmac.Equal(got, want) {
			return nil
		}
	}
	return errors.New("no valid signature")
}

// Answer is what the receiver does with one request.
type Answer struct {
	Status int
	// Hang holds the request this long before answering (a timeout).
	Hang time.Duration
}

// Request is one request the receiver got.
type Request struct {
	ID    string
	Type  string
	Body  string
	Valid bool
}

// Receiver is a loopback webhook receiver.
type Receiver struct {
	*httptest.Server
	mu     sync.Mutex
	secret string
	script func(n int) Answer
	reqs   []Request
	acked  map[string]int
	bad    []error
}

// New starts a receiver that answers the n-th request (from 0) with
// script(n); it stops when the test ends.
func New(t testing.TB, script func(n int) Answer) *Receiver {
	r := &Receiver{script: script, acked: map[string]int{}}
	r.Server = httptest.NewServer(http.HandlerFunc(r.serve))
	t.Cleanup(r.Close)
	return r
}

// SetSecret sets the secret signatures are checked against.
func (r *Receiver) SetSecret(s string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.secret = s
}

func (r *Receiver) serve(w http.ResponseWriter, req *http.Request) {
	body, _ := io.ReadAll(io.LimitReader(req.Body, 1<<20))
	r.mu.Lock()
	n := len(r.reqs)
	err := Verify(r.secret, req.Header, body)
	if err != nil {
		r.bad = append(r.bad, err)
	}
	var typ struct {
		Type string `json:"type"`
	}
	_ = json.Unmarshal(body, &typ)
	id := req.Header.Get("Webhook-Id")
	r.reqs = append(r.reqs, Request{ID: id, Type: typ.Type, Body: string(body), Valid: err == nil})
	r.mu.Unlock()
	a := r.script(n)
	if a.Hang > 0 {
		select {
		case <-time.After(a.Hang):
		case <-req.Context().Done():
			return
		}
	}
	if a.Status/100 == 2 {
		r.mu.Lock()
		r.acked[id]++
		r.mu.Unlock()
	}
	w.WriteHeader(a.Status)
}

// Requests returns every request so far.
func (r *Receiver) Requests() []Request {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Request(nil), r.reqs...)
}

// ByID counts requests per webhook-id.
func (r *Receiver) ByID() map[string]int {
	out := map[string]int{}
	for _, q := range r.Requests() {
		out[q.ID]++
	}
	return out
}

// Acked counts the 2xx answers per webhook-id.
func (r *Receiver) Acked() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return maps.Clone(r.acked)
}

// Bad returns the verification failures so far.
func (r *Receiver) Bad() []error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]error(nil), r.bad...)
}

// Always answers every request with status.
func Always(status int) func(int) Answer {
	return func(int) Answer { return Answer{Status: status} }
}
