package faultcheck

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
)

// identOf is the record identity of a caller's key.
func identOf(scope, key string) string { return scope + "\x00" + key }

// body is the one request body of an ident (PROTOCOL.md).
func (id Ident) body() []byte {
	b, _ := json.Marshal(map[string]string{"req": id.Key, "mode": id.Mode, "pad": id.Pad})
	return b
}

// send sends one request over its own connection and reads the answer,
// going away where disconnect says. The request is written by hand so the
// client can stop at any byte and send a header twice.
func send(base string, s *Sent, dropAfter time.Duration) {
	s.Start = time.Now()
	defer func() { s.End = time.Now() }()
	host := strings.TrimPrefix(base, "http://")
	c, err := net.DialTimeout("tcp", host, 5*time.Second)
	if err != nil {
		s.Err = "dial: " + err.Error()
		return
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	var h strings.Builder
	fmt.Fprintf(&h, "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nIdempotency-Key: %s\r\nContent-Length: %d\r\nConnection: close\r\n",
		s.Path, host, s.Key, len(s.Body))
	for _, v := range s.Headers {
		fmt.Fprintf(&h, "%s: %s\r\n", ScopeHeader, v)
	}
	if s.Wait > 0 {
		fmt.Fprintf(&h, "Prefer: wait=%d\r\n", s.Wait)
	}
	if s.Attempt != "" {
		fmt.Fprintf(&h, "Idem-Attempt: %s\r\n", s.Attempt)
	}
	h.WriteString("\r\n")
	if _, err := io.WriteString(c, h.String()); err != nil {
		s.Err = "write: " + err.Error()
		return
	}
	switch s.Disconnect {
	case "before_body":
		s.Err = "client went away before the body"
		return
	case "mid_body":
		_, _ = c.Write(s.Body[:len(s.Body)/2])
		time.Sleep(20 * time.Millisecond)
		s.Err = "client went away mid-body"
		return
	}
	if _, err := c.Write(s.Body); err != nil {
		s.Err = "write body: " + err.Error()
		return
	}
	if s.Disconnect == "mid_answer" {
		_ = c.SetReadDeadline(time.Now().Add(dropAfter))
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		s.Err = "read answer: " + err.Error()
		if s.Disconnect == "mid_answer" {
			s.Err = "client went away mid-answer after " + dropAfter.String()
		}
		return
	}
	defer resp.Body.Close()
	s.Status, s.Header = resp.StatusCode, resp.Header
	if s.Disconnect == "mid_stream" {
		// The first piece, then away.
		buf := make([]byte, 8)
		n, _ := resp.Body.Read(buf)
		s.Resp = buf[:n]
		s.Err = "client went away mid-stream"
		return
	}
	if s.Disconnect == "mid_answer" {
		// The headers came before the drop: read the body in what is left.
		b, err := io.ReadAll(resp.Body)
		s.Resp = b
		if err != nil {
			s.Err = "client went away mid-answer after " + dropAfter.String()
			return
		}
		s.Complete = true
		return
	}
	b, err := io.ReadAll(resp.Body)
	s.Resp = b
	if err != nil {
		s.Err = "read body: " + err.Error()
		return
	}
	s.Complete = true
}

// Execute runs schedule s on the rig and returns its history.
func Execute(r *Rig, s Schedule) *History {
	h := &History{Before: r.lastFaults}
	defer func() { r.lastFaults = h.Faults }()
	t0 := time.Now()
	var wg sync.WaitGroup
	var stopHog func()
	if s.Hog {
		start := time.Now()
		stopHog = r.Hog(24)
		time.Sleep(300 * time.Millisecond) // the hog's bodies are declared before the schedule's requests
		defer func() {
			h.fault(FaultHog, "24 connections of tenant hog drip bodies declared 64 KiB", start, time.Now())
		}()
	}
	if s.Budget {
		spendBudget(r, s, h)
		defer func() { _ = r.PatchTenant(map[string]any{"settings": map[string]any{"retry_budget_percent": 10}}) }()
	}
	var quota int64
	if s.Quota {
		start := time.Now()
		used, _, err := r.TenantUsage()
		if err == nil {
			quota = used + 8192
			err = r.PatchTenant(map[string]any{"settings": map[string]any{"max_response_bytes": 4096, "storage_quota_bytes": quota}})
		}
		if err != nil {
			h.fault(FaultQuota, "could not set the quota: "+err.Error(), start, time.Now())
			quota = 0
		} else {
			h.fault(FaultQuota, fmt.Sprintf("storage_quota_bytes %d (usage %d), max_response_bytes 4096", quota, used), start, time.Now())
		}
	}
	for _, f := range s.Faults {
		wg.Go(func() {
			at := f.At
			if f.Kind == FaultFinishBudget {
				at -= budgetLead // spent before its cut at f.At
			}
			time.Sleep(time.Until(t0.Add(at)))
			start := time.Now()
			switch f.Kind {
			case FaultStoreCut:
				restore := r.Cut()
				time.Sleep(f.For)
				restore()
				h.fault(f.Kind, "path to the store cut", start, time.Now())
			case FaultFreeze:
				what := r.Freeze(f.For)
				h.fault(f.Kind, what, start, time.Now())
			case FaultListenerDown:
				what := r.ListenerDown(f.For)
				h.fault(f.Kind, what, start, time.Now())
			case FaultFinishBudget:
				what := r.SpendBudget(t0.Add(f.At), f.For)
				h.fault(f.Kind, what, start, time.Now())
			case FaultKill9:
				what := r.Kill9()
				h.fault(f.Kind, what+" killed with -9 and restarted", start, time.Now())
			case FaultSettings:
				patch, undo := map[string]any{"disabled": true}, map[string]any{"disabled": false}
				if f.What == "lease_max" {
					patch = map[string]any{"settings": map[string]any{"lease_seconds_max": 1, "lease_seconds_default": 1}}
					undo = map[string]any{"settings": map[string]any{"lease_seconds_max": 3600, "lease_seconds_default": int(Lease / time.Second)}}
				}
				err := r.PatchTenant(patch)
				time.Sleep(f.For)
				err2 := r.PatchTenant(undo)
				what := whatDisabled
				if f.What == "lease_max" {
					what = whatLeaseMax
				}
				if err != nil || err2 != nil {
					what += fmt.Sprintf(" (errors: %v %v)", err, err2)
				}
				h.fault(f.Kind, what, start, time.Now())
			}
		})
	}
	for i, op := range s.Ops {
		id := s.Idents[op.Ident]
		wg.Go(func() {
			time.Sleep(time.Until(t0.Add(op.At)))
			snt := &Sent{Op: i, Ident: identOf(id.Scope, id.Key), Scope: id.Scope, Key: id.Key,
				Path: "/fc/" + id.Route + "/" + id.Key, Body: id.body(), Disconnect: op.Disconnect, Wait: op.Wait, Attempt: op.Attempt}
			if id.Scope != "" {
				snt.Headers = []string{id.Scope}
			}
			if op.DupScope {
				snt.Headers = []string{id.Scope, "mallory"}
				snt.Key = id.Key + "-ds"
				snt.Ident = identOf("\x01ambiguous", snt.Key)
				snt.Path = "/fc/" + id.Route + "/" + snt.Key
			}
			send(r.BaseURL, snt, op.DropAfter)
			h.add(snt)
		})
	}
	wg.Wait()
	if stopHog != nil {
		stopHog()
	}
	settle(r, s, h)
	reuse(r, s, h)
	if s.Quota && quota > 0 {
		used, _, err := r.TenantUsage()
		start := time.Now()
		if err == nil {
			h.fault(FaultQuota, fmt.Sprintf("usage after the schedule: %d bytes (quota %d)", used, quota), start, start)
			h.QuotaUsed, h.Quota, h.QuotaWriters = used, quota, r.QuotaWriters()
		}
		_ = r.PatchTenant(map[string]any{"settings": map[string]any{"storage_quota_bytes": 1 << 30, "max_response_bytes": 1 << 20}})
	}
	return h
}

// budgetWarmups bounds the retries spendBudget sends: the allowance is the
// floor (retrybudget.Floor, 10) at retry_budget_percent 0, or 10 % of the
// first attempts in the window while a front door still has the tenant's
// earlier percent cached.
const budgetWarmups = 80

// spendBudget sets the tenant's retry_budget_percent to 0 and sends retries
// (Idem-Attempt: 2;cause=timeout) of fresh keys, outside the schedule's,
// through the front door until it refuses one with 429
// retry_budget_exhausted: the budget is then spent for the window (10 s),
// longer than the schedule's requests take.
func spendBudget(r *Rig, s Schedule, h *History) {
	start := time.Now()
	err := r.PatchTenant(map[string]any{"settings": map[string]any{"retry_budget_percent": 0}})
	route := "closed"
	if r.FrontDoor == "gateway" {
		route = "unscoped" // the gateway's scoped routes need the scope header
	}
	admitted := 0
	for i := range budgetWarmups {
		key := fmt.Sprintf("warm%d-%d-%d", s.Seed, s.Index, i)
		snt := &Sent{Op: -2, Key: key, Path: "/fc/" + route + "/" + key, Attempt: "2;cause=timeout",
			Body: Ident{Key: key, Mode: "ok"}.body()}
		send(r.BaseURL, snt, 0)
		if snt.Status == http.StatusTooManyRequests && problemCode(snt.Resp) == "retry_budget_exhausted" {
			h.BudgetSpent = true
			break
		}
		admitted++
	}
	what := fmt.Sprintf("retry_budget_percent 0; %d retries of fresh keys admitted", admitted)
	if h.BudgetSpent {
		what += ", then one refused 429 retry_budget_exhausted"
	} else {
		what += ", none refused"
	}
	if err != nil {
		what += " (error: " + err.Error() + ")"
	}
	h.fault(FaultBudget, what, start, time.Now())
}

// budgetLead is how long before its cut the finishbudget fault spends the
// tenant's retry budget.
const budgetLead = 300 * time.Millisecond

// What the settings fault did, as the report names it.
const (
	whatDisabled = "tenant disabled, then enabled again"
	whatLeaseMax = "tenant lease_seconds_max and lease_seconds_default 1, then 3600 and 2 again"
)

// settle sends each key of the schedule again after the faults, until it
// gets an answer that is not 409 or 503 or the lease and a margin have
// passed: what a retrying client would finally see.
func settle(r *Rig, s Schedule, h *History) {
	var wg sync.WaitGroup
	for _, id := range s.Idents {
		wg.Go(func() {
			deadline := time.Now().Add(Lease + 5*time.Second)
			for {
				snt := &Sent{Op: -1, Ident: identOf(id.Scope, id.Key), Scope: id.Scope, Key: id.Key,
					Path: "/fc/" + id.Route + "/" + id.Key, Body: id.body(), Settle: true}
				if id.Scope != "" {
					snt.Headers = []string{id.Scope}
				}
				send(r.BaseURL, snt, 0)
				h.add(snt)
				if settled(snt, id.Mode) || time.Now().After(deadline) {
					return
				}
				time.Sleep(150 * time.Millisecond)
			}
		})
	}
	wg.Wait()
}

// settled says whether snt, a settle request of a key whose handler runs
// mode, got the key's outcome: an answer that is not 409 or 503 (the key
// still in flight, the store not back), the handler's own 503, a 409
// response_not_replayable (the key completed without its response, under
// the quota: final for the replay window), or a cut answer of a failing
// handler a takeover ran again. Sending a final 409 again until the
// deadline is no use and costs much: a quota schedule's 22 keys so
// answered, each sent every 150 ms for 7 s, kept one SQLite writer so busy
// that claims went unanswered for the SDK's 10 s attempt timeout, and the
// front door's 503 was then reported as a refusal without a fault (seed
// 20261202, asgi/sqlite, schedule 2, with two other checkers beside it).
func settled(snt *Sent, mode string) bool {
	switch {
	case !snt.Complete:
		return strings.HasPrefix(mode, "cutstream") || mode == "raise"
	case snt.Status == http.StatusServiceUnavailable:
		return isRunBody(snt.Resp)
	case snt.Status == http.StatusConflict:
		return problemCode(snt.Resp) == "response_not_replayable"
	}
	return true
}

// reusePad is the pad of the other request FaultReuse sends with id's key.
func (id Ident) reusePad() string { return id.Pad + "+reuse" }

// reuse sends, for each key of s.Reuse, its request once more; when that
// is a replay (the key is completed, its answer stored, and the front
// door's replay cache holds it now), another request with the key: a
// different pad, so another fingerprint. Its answer must be 422
// fingerprint_mismatch (invariant 12).
func reuse(r *Rig, s Schedule, h *History) {
	var wg sync.WaitGroup
	for _, i := range s.Reuse {
		id := s.Idents[i]
		wg.Go(func() {
			snt := &Sent{Op: -1, Ident: identOf(id.Scope, id.Key), Scope: id.Scope, Key: id.Key,
				Path: "/fc/" + id.Route + "/" + id.Key, Body: id.body(), Settle: true}
			if id.Scope != "" {
				snt.Headers = []string{id.Scope}
			}
			send(r.BaseURL, snt, 0)
			h.add(snt)
			if !snt.Complete || !snt.Replayed() {
				return
			}
			other := id
			other.Pad = id.reusePad()
			again := &Sent{Op: -1, Ident: snt.Ident, Scope: id.Scope, Key: id.Key, Headers: snt.Headers,
				Path: snt.Path, Body: other.body(), Reuse: true}
			send(r.BaseURL, again, 0)
			h.add(again)
		})
	}
	wg.Wait()
}

// isRunBody says whether b is a run's answer body (PROTOCOL.md).
func isRunBody(b []byte) bool {
	_, ok := parseRunBody(b)
	return ok
}

type runBody struct {
	Run   string `json:"run"`
	Req   string `json:"req"`
	Scope string `json:"scope"`
	Pad   string `json:"pad"`
}

func parseRunBody(b []byte) (runBody, bool) {
	var rb runBody
	if json.Unmarshal(b, &rb) != nil || rb.Run == "" {
		return rb, false
	}
	return rb, true
}
