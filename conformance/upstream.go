package conformance

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Upstream is a small HTTP API with a side effect it counts: the reference
// target of the conformance kit (behind the gateway or wrapped by an SDK
// middleware) and the test upstream of the gateway's tests and benchmark.
//
//	POST|PUT|PATCH|DELETE /orders[/...]  one side effect: answers 201 with
//	    {"order": N, "echo": <the JSON body or null>}, Location /orders/N,
//	    an ETag and a Set-Cookie. Query parameters: delay_ms=N holds the
//	    answer N ms (N ≤ 60000); status=N answers that status instead
//	    (200–999: net/http lets a handler answer up to 999, beyond the
//	    100–599 idem stores); size=N answers N bytes of text instead (200,
//	    or status=N).
//	GET /count  {"count": N}, the side effects so far.
//	GET /orders  [] (a safe read).
type Upstream struct {
	count   atomic.Int64
	entered atomic.Int64
	// mu guards gate.
	mu   sync.Mutex
	gate chan struct{}
}

// NewUpstream returns an Upstream with no side effect yet.
func NewUpstream() *Upstream { return &Upstream{} }

// Count returns the side effects so far.
func (u *Upstream) Count() int64 { return u.count.Load() }

// Entered returns how many unsafe requests reached the handler, before
// their delay and side effect.
func (u *Upstream) Entered() int64 { return u.entered.Load() }

// Hold makes every unsafe request wait after it entered until the returned
// function is called; tests use it instead of a delay to hold a request in
// flight for exactly as long as they need.
func (u *Upstream) Hold() (release func()) {
	ch := make(chan struct{})
	u.mu.Lock()
	u.gate = ch
	u.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			u.mu.Lock()
			if u.gate == ch {
				u.gate = nil
			}
			u.mu.Unlock()
			close(ch)
		})
	}
}

// ServeHTTP implements http.Handler.
func (u *Upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.URL.Path == "/count" && r.Method == http.MethodGet:
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"count":%d}`, u.count.Load())
		return
	case r.URL.Path == "/orders" && (r.Method == http.MethodGet || r.Method == http.MethodHead):
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, "[]")
		return
	case r.URL.Path != "/orders" && !strings.HasPrefix(r.URL.Path, "/orders/"):
		http.NotFound(w, r)
		return
	case r.Method == http.MethodGet || r.Method == http.MethodHead:
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 16<<20))
	if err != nil {
		http.Error(w, "unreadable body", http.StatusBadRequest)
		return
	}
	u.entered.Add(1)
	u.mu.Lock()
	gate := u.gate
	u.mu.Unlock()
	if gate != nil {
		<-gate
	}
	q := r.URL.Query()
	if ms, err := strconv.Atoi(q.Get("delay_ms")); err == nil && ms > 0 {
		time.Sleep(time.Duration(min(ms, 60000)) * time.Millisecond)
	}
	n := u.count.Add(1)
	status, err := strconv.Atoi(q.Get("status"))
	custom := err == nil && status >= 200 && status <= 999
	if size, err := strconv.Atoi(q.Get("size")); err == nil && size > 0 {
		w.Header().Set("Content-Type", "text/plain")
		w.Header().Set("Content-Length", strconv.Itoa(size))
		if custom {
			w.WriteHeader(status)
		}
		chunk := []byte(strings.Repeat("x", 32<<10))
		for size > 0 {
			k := min(size, len(chunk))
			_, _ = w.Write(chunk[:k])
			size -= k
		}
		return
	}
	if !custom {
		status = http.StatusCreated
	}
	echo := json.RawMessage("null")
	if json.Valid(body) && len(body) > 0 {
		echo = body
	}
	out, _ := json.Marshal(map[string]any{"order": n, "echo": echo})
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/orders/"+strconv.FormatInt(n, 10))
	w.Header().Set("ETag", `"order-`+strconv.FormatInt(n, 10)+`"`)
	w.Header().Set("Set-Cookie", "session=order-"+strconv.FormatInt(n, 10))
	w.WriteHeader(status)
	_, _ = w.Write(out)
}
