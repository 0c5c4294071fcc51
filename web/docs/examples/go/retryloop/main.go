// Command retryloop is a complete client retry loop for idem over raw
// net/http, standard library only, for services that do not use the Go SDK
// (which has the same policy built in). It claims and completes one key.
//
//	IDEM_URL=http://127.0.0.1:8080 IDEM_TOKEN=<jwt with keys:write> go run ./web/docs/examples/go/retryloop
//
// The policy (see /docs/retries/): retry only connection errors, timeouts,
// 408, 429, 502, 503 and 504; full jitter with base 1 s and cap 30 s;
// Retry-After replaces the backoff; one overall deadline with per-attempt
// timeouts; at most 3 attempts; a shared token-bucket retry budget; every
// attempt logged. A claim answered 409 request_in_flight (another holder of
// the key, or our own earlier claim whose answer was lost) is claimed again
// after Retry-After plus spread while the deadline allows; every other 409
// is final.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"sync"
	"time"
)

// The policy's numbers.
const (
	baseDelay      = time.Second
	maxDelay       = 30 * time.Second
	maxAttempts    = 3 // per call, the first included
	attemptTimeout = 10 * time.Second
	minAttemptTime = 100 * time.Millisecond
)

// budget is a token bucket shared by every call: retries stop when it is
// empty, so a fleet in trouble does not multiply the load.
type budget struct {
	mu                     sync.Mutex
	tokens, capacity, cost float64
	refund                 float64
}

func (b *budget) take() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.tokens < b.cost {
		return false
	}
	b.tokens -= b.cost
	return true
}

func (b *budget) success() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.tokens = min(b.capacity, b.tokens+b.refund)
}

func (b *budget) left() float64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.tokens
}

func retryableStatus(s int) bool {
	switch s {
	case 408, 429, 502, 503, 504:
		return true
	}
	return false
}

// fullJitter is the wait before retry n (n = 0, 1, ...).
func fullJitter(n int) time.Duration {
	ceiling := min(maxDelay, baseDelay<<n)
	return time.Duration(rand.Int64N(int64(ceiling)))
}

func retryAfter(h http.Header) (time.Duration, bool) {
	v := h.Get("Retry-After")
	if v == "" {
		return 0, false
	}
	if s, err := strconv.Atoi(v); err == nil && s >= 0 {
		return time.Duration(s) * time.Second, true
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(0, time.Until(t)), true
	}
	return 0, false
}

type result struct {
	status int
	header http.Header
	body   []byte
}

// call sends one logical call with retries inside ctx's deadline.
func call(ctx context.Context, b *budget, method, u, token string, body any) (result, error) {
	payload, err := json.Marshal(body)
	if err != nil {
		return result{}, fmt.Errorf("encode body: %w", err)
	}
	name := method + " " + u
	for attempt := 1; ; attempt++ {
		res, err := once(ctx, method, u, token, payload)
		// The caller's own deadline or cancellation is final.
		if ctx.Err() != nil {
			return result{}, fmt.Errorf("%s: %w", name, ctx.Err())
		}
		if err == nil && !retryableStatus(res.status) {
			b.success()
			slog.Info("attempt", "call", name, "attempt", attempt, "status", res.status, "outcome", "done", "budget", b.left())
			return res, nil
		}
		why := any(err)
		if err == nil {
			why = res.status
		}
		if attempt == maxAttempts {
			slog.Warn("attempt", "call", name, "attempt", attempt, "error", why, "outcome", "give_up", "reason", "attempt_cap")
			return res, fmt.Errorf("%s: attempt cap reached: %v", name, why)
		}
		wait := fullJitter(attempt - 1)
		if ra, ok := retryAfter(res.header); ok {
			wait = ra + time.Duration(rand.Int64N(int64(time.Second)))
		}
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) < wait+minAttemptTime {
			slog.Warn("attempt", "call", name, "attempt", attempt, "error", why, "outcome", "give_up", "reason", "deadline")
			return res, fmt.Errorf("%s: the time left cannot fit another attempt: %v", name, why)
		}
		if !b.take() {
			slog.Warn("attempt", "call", name, "attempt", attempt, "error", why, "outcome", "give_up", "reason", "retry_budget")
			return res, fmt.Errorf("%s: retry budget exhausted: %v", name, why)
		}
		slog.Info("attempt", "call", name, "attempt", attempt, "error", why, "outcome", "retry", "wait", wait, "budget", b.left())
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return result{}, fmt.Errorf("%s: %w", name, ctx.Err())
		}
	}
}

// claimWaiting claims the key, waiting out 409 request_in_flight: wait its
// Retry-After plus spread and claim again while the deadline allows. Every
// other answer, every other 409 included, is returned.
func claimWaiting(ctx context.Context, b *budget, u, token string, body any) (result, error) {
	for {
		res, err := call(ctx, b, "POST", u, token, body)
		if err != nil || res.status != http.StatusConflict {
			return res, err
		}
		var p struct {
			Code string `json:"code"`
		}
		if json.Unmarshal(res.body, &p) != nil || p.Code != "request_in_flight" {
			return res, nil
		}
		ra, ok := retryAfter(res.header)
		if !ok || ra <= 0 {
			ra = baseDelay
		}
		wait := ra + time.Duration(rand.Int64N(int64(time.Second)))
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) < wait+minAttemptTime {
			slog.Warn("claim", "call", "POST "+u, "status", res.status, "outcome", "give_up", "reason", "deadline_in_flight")
			return res, fmt.Errorf("claim: the key is still in flight and the deadline cannot fit another wait")
		}
		slog.Info("claim", "call", "POST "+u, "status", res.status, "code", p.Code, "outcome", "wait_in_flight", "wait", wait)
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return result{}, fmt.Errorf("claim: %w", ctx.Err())
		}
	}
}

// once is one attempt with its own timeout, cut to the time left.
func once(ctx context.Context, method, u, token string, payload []byte) (result, error) {
	actx, cancel := context.WithTimeout(ctx, attemptTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(actx, method, u, bytes.NewReader(payload))
	if err != nil {
		return result{}, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return result{}, err // refused, reset, timed out: retryable with a key in place
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return result{}, err
	}
	return result{status: resp.StatusCode, header: resp.Header, body: body}, nil
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "retryloop:", err)
		os.Exit(1)
	}
}

func run() error {
	base := os.Getenv("IDEM_URL")
	if base == "" {
		base = "http://127.0.0.1:8080"
	}
	token := os.Getenv("IDEM_TOKEN")
	if token == "" {
		return errors.New("set IDEM_TOKEN to a token with the keys:write scope")
	}
	key := os.Getenv("IDEM_KEY")
	if key == "" {
		key = "order-confirm-4711-" + strconv.FormatInt(time.Now().Unix(), 10)
	}
	path := base + "/v1/keys/" + url.PathEscape(key)
	b := &budget{tokens: 10, capacity: 10, cost: 1, refund: 0.1}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second) // one overall deadline
	defer cancel()

	res, err := claimWaiting(ctx, b, path+"/claim", token, map[string]any{
		"operation": "POST /orders/4711/confirm",
		"request":   map[string]any{"order_id": "4711", "amount": 1000},
	})
	if err != nil {
		return err
	}
	var claim struct {
		FencingToken int64 `json:"fencing_token"`
	}
	switch res.status {
	case http.StatusOK:
		fmt.Printf("replayed %s: %s\n", key, res.body)
		return nil
	case http.StatusCreated:
		if err := json.Unmarshal(res.body, &claim); err != nil {
			return fmt.Errorf("decode claim: %w", err)
		}
	default:
		return fmt.Errorf("claim: %d %s", res.status, res.body)
	}
	res, err = call(ctx, b, "POST", path+"/complete", token, map[string]any{
		"fencing_token": claim.FencingToken,
		"response": map[string]any{
			"status": 201, "headers": map[string]string{"Content-Type": "application/json"},
			"body": `{"order_id":"4711","status":"confirmed"}`,
		},
	})
	if err != nil {
		return err
	}
	if res.status != http.StatusOK {
		return fmt.Errorf("complete: %d %s", res.status, res.body)
	}
	fmt.Printf("completed %s\n", key)
	return nil
}
