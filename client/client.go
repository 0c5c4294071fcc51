package client

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/idem-dev/idem/client/frontdoor"
)

// Client calls one idem service. It is safe for concurrent use; all its
// calls share one retry budget.
type Client struct {
	base      *url.URL
	hc        *http.Client
	token     func(ctx context.Context) (string, error)
	policy    RetryPolicy
	budget    *retryBudget
	logger    *slog.Logger
	hook      func(AttemptInfo)
	clock     Clock
	userAgent string
	// noAttemptIDs turns off the random attempt_id of claims.
	noAttemptIDs bool
}

// Option configures a Client.
type Option func(*Client)

// WithToken authenticates every call with a static bearer token.
func WithToken(token string) Option {
	return func(c *Client) {
		c.token = func(context.Context) (string, error) { return token, nil }
	}
}

// WithTokenSource authenticates every attempt with the token src returns,
// for tokens that rotate. An error of src ends the call without a retry.
func WithTokenSource(src func(ctx context.Context) (string, error)) Option {
	return func(c *Client) { c.token = src }
}

// WithHTTPClient sets the *http.Client the calls go through (default: a
// client of its own with a transport of its own, NewTransport, and no
// overall timeout — the deadlines come from the context and
// RetryPolicy.AttemptTimeout). Give yours the idle-connection limits of
// NewTransport, or start from it: with http.DefaultTransport's 2 idle
// connections per host, a Client called from more goroutines than that
// opens a connection for most calls.
func WithHTTPClient(hc *http.Client) Option {
	return func(c *Client) { c.hc = hc }
}

// DefaultMaxIdleConnsPerHost is how many idle keep-alive connections to the
// idem service the transport of NewTransport keeps: enough for a Client
// shared by a server's request goroutines.
const DefaultMaxIdleConnsPerHost = 128

// NewTransport returns the transport a Client made without WithHTTPClient
// uses: a clone of http.DefaultTransport (proxy from the environment, dial
// and TLS timeouts, HTTP/2, 90 s idle timeout) that keeps up to
// DefaultMaxIdleConnsPerHost idle connections to the service instead of 2.
// With 2, every call beyond two at once opened a new connection and closed
// it afterwards: a front door on it served 0.55× the requests at 1.28× the
// CPU of one sized for its concurrency (issue 23). Each Client gets its own
// transport: share one Client, not one per request.
func NewTransport() *http.Transport {
	var t *http.Transport
	if dt, ok := http.DefaultTransport.(*http.Transport); ok {
		t = dt.Clone()
	} else { // a program replaced the default with a RoundTripper of its own
		t = &http.Transport{Proxy: http.ProxyFromEnvironment, ForceAttemptHTTP2: true,
			DialContext:     (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			IdleConnTimeout: 90 * time.Second, TLSHandshakeTimeout: 10 * time.Second, ExpectContinueTimeout: time.Second}
	}
	t.MaxIdleConnsPerHost = DefaultMaxIdleConnsPerHost
	if t.MaxIdleConns > 0 { // 0 is no limit
		t.MaxIdleConns = max(t.MaxIdleConns, DefaultMaxIdleConnsPerHost)
	}
	return t
}

// WithRetryPolicy replaces the retry policy; zero fields take their
// defaults.
func WithRetryPolicy(p RetryPolicy) Option {
	return func(c *Client) { c.policy = p }
}

// WithLogger logs every attempt to l: Debug for a success, Warn for a
// failure. Tokens are never logged.
func WithLogger(l *slog.Logger) Option {
	return func(c *Client) { c.logger = l }
}

// WithAttemptHook calls hook after every attempt of every call, on the
// calling goroutine. Use it for metrics or tests.
func WithAttemptHook(hook func(AttemptInfo)) Option {
	return func(c *Client) { c.hook = hook }
}

// WithClock replaces the time source of the retry loop (tests).
func WithClock(clock Clock) Option {
	return func(c *Client) { c.clock = clock }
}

// WithAttemptIDs says whether claims carry a random attempt_id (default
// true): one per Claim or Do call, the same in all its retries and
// in-flight waits, so a claim whose answer was lost (a timeout, a reset)
// is answered with its own attempt at the next try instead of 409 and a
// wait for the lease it holds itself. Turn it off only for an idem server
// older than attempt_id, which refuses the field.
func WithAttemptIDs(on bool) Option {
	return func(c *Client) { c.noAttemptIDs = !on }
}

// attemptID is the attempt_id a claim of req sends: the caller's, else a
// random UUID (version 4) unless attempt ids are off.
func (c *Client) attemptID(req Request) string {
	if req.AttemptID != "" || c.noAttemptIDs {
		return req.AttemptID
	}
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// WithUserAgent sets the User-Agent header.
func WithUserAgent(ua string) Option {
	return func(c *Client) { c.userAgent = ua }
}

// AttemptInfo describes one attempt of a call, as passed to the attempt
// hook and written to the logger.
type AttemptInfo struct {
	// Call names the call, e.g. "claim" or "complete".
	Call string
	// Method and Path are the HTTP request line.
	Method, Path string
	// Attempt counts from 1.
	Attempt int
	// Status is the HTTP status, 0 when no answer arrived.
	Status int
	// Err is the attempt's error, nil on success.
	Err error
	// Retry says whether another attempt follows; Wait is the wait chosen
	// before it.
	Retry bool
	Wait  time.Duration
	// GiveUp says why no retry follows a retryable failure: "attempts",
	// "budget", "deadline" or "context"; "fleet-budget" when idem refused
	// the retry (429 retry_budget_exhausted); "fleet-signal" when the
	// failure's answer said the fleet budget is spent (Idem-Retry-Budget:
	// exhausted) and no retry was sent; empty otherwise.
	GiveUp string
	// BudgetLeft is the client's retry budget after this attempt (+Inf when
	// the budget is off).
	BudgetLeft float64
}

// New returns a Client for the idem service at baseURL (e.g.
// "https://idem.example.com"; a path prefix is kept).
func New(baseURL string, opts ...Option) (*Client, error) {
	u, err := url.Parse(strings.TrimRight(baseURL, "/"))
	if err != nil {
		return nil, fmt.Errorf("parse idem base URL: %w", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("idem base URL %q: scheme must be http or https", baseURL)
	}
	c := &Client{base: u, userAgent: "idem-go-client/1"}
	for _, o := range opts {
		o(c)
	}
	if c.hc == nil {
		c.hc = &http.Client{Transport: NewTransport()}
	}
	if c.clock == nil {
		c.clock = realClock{}
	}
	c.policy = c.policy.withDefaults()
	c.budget = newRetryBudget(c.policy)
	return c, nil
}

// RetryPolicy returns the client's effective policy, defaults filled in.
func (c *Client) RetryPolicy() RetryPolicy { return c.policy }

// RetryBudgetLeft returns the tokens left in the client-wide retry budget
// (+Inf when the budget is off).
func (c *Client) RetryBudgetLeft() float64 { return c.budget.left() }

// apiCall describes one HTTP call of the contract.
type apiCall struct {
	name   string
	method string
	path   string // already escaped
	query  url.Values
	body   any // marshalled to JSON when non-nil
	out    any // decoded from a 2xx body when non-nil
}

// callResult carries what the caller may need beyond the decoded body.
type callResult struct {
	status int
	header http.Header
}

// do runs one call under the retry policy.
func (c *Client) do(ctx context.Context, ac apiCall) (callResult, error) {
	var payload []byte
	if ac.body != nil {
		b, err := json.Marshal(ac.body)
		if err != nil {
			return callResult{}, fmt.Errorf("%s: encode request: %w", ac.name, err)
		}
		payload = b
	}
	u := *c.base
	u.RawPath = c.base.EscapedPath() + ac.path
	unescaped, err := url.PathUnescape(u.RawPath)
	if err != nil {
		return callResult{}, fmt.Errorf("%s: build URL: %w", ac.name, err)
	}
	u.Path = unescaped
	if ac.query != nil {
		u.RawQuery = ac.query.Encode()
	}
	target := u.String()

	p := c.policy
	if p.CallDeadline > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, p.CallDeadline)
		defer cancel()
	}
	ctx, lc := withLogicalCall(ctx, ac.name == "claim")
	finishing := finishingCall(ac.name)
	var prevWait time.Duration
	for attempt := 1; ; attempt++ {
		lc.attempts++
		res, body, err := c.attempt(ctx, ac, target, payload, attemptHeader(lc.attempts, lc.cause))
		info := AttemptInfo{Call: ac.name, Method: ac.method, Path: ac.path, Attempt: attempt, Status: res.status, Err: err}
		if e := (*Error)(nil); errors.As(err, &e) && e.Code == CodeRetryBudgetExhausted && lc.attempts > 1 && !finishing {
			// idem's fleet budget refused this retry: stop now, and
			// report what failed before, not the refusal.
			info.GiveUp = "fleet-budget"
			info.BudgetLeft = c.budget.left()
			c.report(ctx, info)
			return res, &FleetBudgetError{Call: ac.name, Attempts: lc.attempts, Cause: lc.cause, Original: lc.original, Refusal: e}
		}
		if err == nil {
			c.budget.success()
			info.BudgetLeft = c.budget.left()
			c.report(ctx, info)
			if ac.out != nil && len(body) > 0 {
				if err := json.Unmarshal(body, ac.out); err != nil {
					return res, fmt.Errorf("%s: %w: decode answer: %w", ac.name, ErrInvalidAnswer, err)
				}
			}
			return res, nil
		}
		retryable, ra := c.classify(ctx, res, err, finishing)
		if !retryable {
			if res.status > 0 && res.status < 500 {
				// The service answered sensibly: it is healthy.
				c.budget.success()
			}
			info.BudgetLeft = c.budget.left()
			c.report(ctx, info)
			return res, fmt.Errorf("%s: %w", ac.name, err)
		}
		lc.cause = causeOf(res, err)
		if lc.original == nil {
			lc.original = err
		}
		if e := (*Error)(nil); errors.As(err, &e) && e.FleetBudgetSpent && !finishing {
			// idem says the fleet budget is spent: a retry would only
			// be refused (an attempt reaching idem all the same), so
			// stop now as for the refusal, with the original cause.
			info.GiveUp = "fleet-signal"
			info.BudgetLeft = c.budget.left()
			c.report(ctx, info)
			return res, &FleetBudgetError{Call: ac.name, Attempts: lc.attempts, Cause: lc.cause, Original: lc.original}
		}
		// Choose the wait, then check attempts, deadline and budget.
		var wait time.Duration
		if ra > 0 {
			wait = p.retryAfterWait(ra)
		} else {
			wait = p.backoff(attempt-1, prevWait)
		}
		prevWait = wait
		info.Wait = wait
		var giveUp error
		switch {
		case ctx.Err() != nil:
			info.GiveUp, giveUp = "context", ctx.Err()
		case attempt >= p.MaxAttempts:
			info.GiveUp = "attempts"
		case !c.fits(ctx, wait):
			info.GiveUp, giveUp = "deadline", ErrDeadlineTooClose
		case !finishing && !c.budget.take():
			info.GiveUp, giveUp = "budget", ErrRetryBudgetExhausted
		}
		info.BudgetLeft = c.budget.left()
		info.Retry = info.GiveUp == ""
		if !info.Retry {
			info.Wait = 0
		}
		c.report(ctx, info)
		if !info.Retry {
			if giveUp != nil {
				return res, fmt.Errorf("%s: giving up after %d attempts: %w: %w", ac.name, attempt, giveUp, err)
			}
			return res, fmt.Errorf("%s: giving up after %d attempts: %w", ac.name, attempt, err)
		}
		if serr := c.clock.Sleep(ctx, wait); serr != nil {
			return res, fmt.Errorf("%s: waiting to retry after %d attempts: %w: %w", ac.name, attempt, serr, err)
		}
	}
}

// fits reports whether a wait plus a minimal attempt fits before the
// context's deadline.
func (c *Client) fits(ctx context.Context, wait time.Duration) bool {
	dl, ok := ctx.Deadline()
	if !ok {
		return true
	}
	return dl.Sub(c.clock.Now()) >= addSat(wait, c.policy.MinAttemptTime)
}

// finishingCall reports whether the call named name is a write that
// finishes a claim (checkpoint, complete, release). idem's fleet retry
// budget does not cover those, and the client ignores it for them: its
// signal (HeaderRetryBudget) is no reason to stop, and an older server's
// 429 retry_budget_exhausted is retried after its Retry-After, within the
// call's deadline and the policy's attempt cap and backoff. Nor do they
// spend or meet the client's own retry budget (RetryPolicy.BudgetCapacity): failed
// claims empty it in an outage, and a complete given up there would leave
// work that ran unrecorded and its key in flight, and the next attempt
// after the lease would run the work again; each admitted claim has one
// of them, so their retries stay bounded (/docs/retries#finishing).
func finishingCall(name string) bool {
	return name == "checkpoint" || name == "complete" || name == "release"
}

// classify decides whether a failed attempt may be retried and returns the
// server's Retry-After. finishing: the call is a finishing write
// (finishingCall).
func (c *Client) classify(ctx context.Context, res callResult, err error, finishing bool) (bool, time.Duration) {
	if ctx.Err() != nil {
		return false, 0
	}
	var e *Error
	if errors.As(err, &e) {
		if e.Code == CodeRetryBudgetExhausted {
			if finishing {
				// An older server's refusal: it touched nothing, and
				// the work that ran is worth recording once room frees.
				return true, max(e.RetryAfter, time.Second)
			}
			return false, 0 // never retried: more retries are what it refuses
		}
		return c.policy.retryableStatus(e.Status), e.RetryAfter
	}
	if res.status != 0 {
		// An answer arrived but could not be read completely.
		return retryableTransportError(err) && c.policy.retryableStatus(res.status), 0
	}
	var te *tokenError
	if errors.As(err, &te) {
		return false, 0
	}
	return retryableTransportError(err), 0
}

type tokenError struct{ err error }

func (e *tokenError) Error() string { return "get token: " + e.err.Error() }
func (e *tokenError) Unwrap() error { return e.err }

// attempt sends one HTTP request and reads the whole answer within the
// per-attempt timeout. A non-2xx answer is returned as *Error.
func (c *Client) attempt(ctx context.Context, ac apiCall, target string, payload []byte, attemptHeader string) (callResult, []byte, error) {
	actx := ctx
	if d := c.attemptTimeout(ctx); d > 0 {
		var cancel context.CancelFunc
		actx, cancel = context.WithTimeout(ctx, d)
		defer cancel()
	}
	var body io.Reader
	if payload != nil {
		body = bytes.NewReader(payload)
	}
	req, err := http.NewRequestWithContext(actx, ac.method, target, body)
	if err != nil {
		return callResult{}, nil, fmt.Errorf("build request: %w", err)
	}
	if payload != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json, application/problem+json")
	req.Header.Set("User-Agent", c.userAgent)
	req.Header.Set(HeaderAttempt, attemptHeader)
	if c.token != nil {
		tok, err := c.token(ctx)
		if err != nil {
			return callResult{}, nil, &tokenError{err: err}
		}
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return callResult{}, nil, err
	}
	defer resp.Body.Close()
	res := callResult{status: resp.StatusCode, header: resp.Header}
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return res, nil, fmt.Errorf("read answer: %w", err)
	}
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return res, data, nil
	}
	return res, nil, c.problem(resp, data)
}

// attemptTimeout returns the timeout of the next attempt: the policy's,
// never longer than the time left before the deadline; 0 for none.
func (c *Client) attemptTimeout(ctx context.Context) time.Duration {
	d := c.policy.AttemptTimeout
	if dl, ok := ctx.Deadline(); ok {
		left := dl.Sub(c.clock.Now())
		if d <= 0 || left < d {
			d = max(left, time.Millisecond)
		}
	}
	return max(d, 0)
}

// waitApplied returns the wait the server says it applied to a claim
// (Preference-Applied: wait=N), zero when it applied none.
func waitApplied(h http.Header) time.Duration {
	return time.Duration(max(frontdoor.PreferWait(h.Values(frontdoor.HeaderPreferenceApplied)), 0)) * time.Second
}

// problem turns a non-2xx answer into *Error.
func (c *Client) problem(resp *http.Response, data []byte) *Error {
	e := &Error{
		Status:      resp.StatusCode,
		Code:        CodeUnknown,
		RetryAfter:  parseRetryAfter(resp.Header.Get("Retry-After"), c.clock.Now()),
		RequestID:   resp.Header.Get("X-Request-Id"),
		Retryable:   c.policy.retryableStatus(resp.StatusCode),
		WaitApplied: waitApplied(resp.Header),

		FleetBudgetSpent: budgetSpent(resp.Header),
	}
	var pd struct {
		Type      string       `json:"type"`
		Title     string       `json:"title"`
		Detail    string       `json:"detail"`
		Code      string       `json:"code"`
		Retryable *bool        `json:"retryable"`
		Errors    []FieldError `json:"errors"`
	}
	if json.Unmarshal(data, &pd) == nil {
		e.Type, e.Title, e.Detail, e.Fields = pd.Type, pd.Title, pd.Detail, pd.Errors
		if pd.Code != "" {
			e.Code = Code(pd.Code)
		}
		if pd.Retryable != nil {
			e.Retryable = *pd.Retryable
		}
	}
	if e.Title == "" {
		e.Title = http.StatusText(resp.StatusCode)
	}
	return e
}

// report sends an attempt to the hook and the logger.
func (c *Client) report(ctx context.Context, info AttemptInfo) {
	if c.hook != nil {
		c.hook(info)
	}
	if c.logger == nil {
		return
	}
	attrs := []slog.Attr{
		slog.String("call", info.Call),
		slog.String("method", info.Method),
		slog.String("path", info.Path),
		slog.Int("attempt", info.Attempt),
		slog.Int("status", info.Status),
		slog.String("budget_left", strconv.FormatFloat(info.BudgetLeft, 'f', 2, 64)),
	}
	if info.Err == nil {
		c.logger.LogAttrs(ctx, slog.LevelDebug, "idem call succeeded", attrs...)
		return
	}
	attrs = append(attrs, slog.String("error", info.Err.Error()), slog.Bool("retry", info.Retry), slog.Duration("wait", info.Wait))
	if info.GiveUp != "" {
		attrs = append(attrs, slog.String("give_up", info.GiveUp))
	}
	c.logger.LogAttrs(ctx, slog.LevelWarn, "idem call attempt failed", attrs...)
}
