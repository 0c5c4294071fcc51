// Package gateway is idem's front door for any HTTP API: a reverse proxy
// that gives the routes of its upstreams Stripe-style Idempotency-Key
// semantics (draft-ietf-httpapi-idempotency-key-header) by configuration
// alone. It follows the front-door rules of client/frontdoor
// (docs/frontdoor.md), the package client/idemhttp uses too, and talks to
// the idem.Store directly: the records it writes are ordinary records of
// one tenant, so the API (GET /v1/keys/{key}), the dashboard, the metrics
// and the reaper see them.
//
// A protected request (POST and PATCH by default; PUT and DELETE when they
// carry a key) is claimed under its key with operation METHOD + route
// pattern and the fingerprint of its document (frontdoor.Document). A new
// claim or a takeover calls the upstream once, keeping the lease alive
// while the call runs, stores the whole response and only then sends it. A
// retry gets the stored response with Idempotent-Replayed: true; the key in
// flight 409 with Retry-After; the key used with another request 422. A
// store that fails gives 503 with Retry-After and the upstream is not
// called (fail closed); a store that fails while the upstream's response
// is being stored is asked again before the response is sent (complete);
// an upstream that cannot be reached gives 502 and releases the key; one
// that had the request and did not answer (a timeout: 504, a broken
// connection: 502) may have acted on it, so that answer is stored like a
// 5xx (released with store_5xx false). Only a store failure fails open
// (fail_open): idem refusing the claim (the tenant unknown or disabled,
// its quota used up) is answered as a refusal. The gateway never sends a
// request to the upstream twice by itself. A response over the route's
// max_stored_bytes, or of a status idem cannot store (outside 100–599:
// frontdoor.StorableStatus, whatever store_5xx says), is passed through and
// recorded as completed without its body; a replay then answers 409
// response_not_replayable. A caller's retry (Idem-Attempt above 1) is
// counted against the tenant's fleet retry budget, which the gateway keeps
// itself since it does not go through the API that keeps idem's: past it,
// 429 retry_budget_exhausted before the body is read (docs/frontdoor.md
// rule 9).
package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptrace"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/canon"
	"github.com/idem-dev/idem/client/frontdoor"
	"github.com/idem-dev/idem/internal/budget"
	"github.com/idem-dev/idem/internal/statuswriter"
	"github.com/idem-dev/idem/keyevents"
	"github.com/idem-dev/idem/metrics"
	"github.com/idem-dev/idem/retrybudget"
	"github.com/idem-dev/idem/storemw"
	"github.com/idem-dev/idem/tenants"
)

// Options configure a Gateway.
type Options struct {
	// Store is the idem store, shared with `server serve`: a driver
	// (server.OpenStore), which New wraps (storemw.Wrap) with the store
	// deadline and Metrics.
	Store idem.Driver
	// Tenant is the tenant whose records the gateway writes.
	Tenant string
	// Upstream is the default upstream URL (the "default" upstream).
	Upstream string
	// ConfigFile is the YAML route configuration; "" means none.
	ConfigFile string
	// StoreTimeout bounds every store call (storemw.WithDeadline; default
	// 5s, IDEM_STORE_TIMEOUT): a store slower than that is failing (503).
	StoreTimeout time.Duration
	// TenantCacheTTL is how long the tenant's settings are cached.
	TenantCacheTTL time.Duration
	// Metrics, when not nil, times every store call
	// (idem_store_operation_duration_seconds, storemw.Instrument).
	Metrics *metrics.Metrics
	// Registerer receives the gateway's metrics; nil registers none.
	Registerer prometheus.Registerer
	// Logger receives the access log and errors; nil discards them.
	Logger *slog.Logger
	// Waiters hold requests with Prefer: wait=N while their key is in
	// flight (keyevents.NewWaiters on the store's key events); nil answers 409
	// at once.
	Waiters *keyevents.Waiters
	// Transport reaches the upstreams; nil uses a clone of
	// http.DefaultTransport.
	Transport http.RoundTripper
	// MaxInflightBytes is the budget of protected request bodies the
	// gateway holds in memory at once, each charged BodyMemoryFactor times
	// its size before it is read (IDEM_MAX_INFLIGHT_BYTES; 0 means
	// DefaultMaxInflightBytes). Past it a protected request is refused
	// 503 server_busy with Retry-After, unread and unclaimed.
	MaxInflightBytes int64
	// InflightShare is the part of the budget each caller — the route's
	// scope when it has one, else the client's address — may always hold,
	// and at least the largest request of any route; past it a caller's
	// request is still admitted while a whole share stays free for the
	// others (IDEM_INFLIGHT_SHARE; 0 means budget.DefaultShare, 1 or more
	// turns the shares off).
	InflightShare float64
	// BodyReadTimeout bounds reading the body of a protected request
	// (IDEM_READ_TIMEOUT; default 30s): a caller that stops sending its
	// body mid-way gets 400 instead of holding the connection and the
	// bytes read so far for good.
	BodyReadTimeout time.Duration
	// RetryBudget is the gateway's fleet retry budget (docs/frontdoor.md
	// rule 9): the gateway claims in the store directly, not through the
	// API that keeps idem's, so it keeps the budget of its tenant itself,
	// per replica, by the same rule (retry_budget_percent of the first
	// attempts over the window, at least retrybudget.Floor). nil means one
	// with retrybudget.DefaultWindow.
	RetryBudget *retrybudget.Budget

	// ReplayCache configures the replay cache (docs/frontdoor.md, "The
	// replay cache"); the zero value is on with the defaults. The file's
	// replay_cache overrides it.
	ReplayCache frontdoor.ReplayCacheOptions
}

// Gateway is the front door's http.Handler.
type Gateway struct {
	opts      Options
	budget    *budget.Bytes
	retries   *retrybudget.Budget
	store     idem.Store
	tenants   *tenants.Service
	routing   atomic.Pointer[routing]
	transport http.RoundTripper
	logger    *slog.Logger
	metrics   *gatewayMetrics
}

// New loads the configuration and returns a Gateway. The tenant must
// exist; it is checked at the first request (the store may be down at
// start, and the gateway must then fail closed, not refuse to start).
func New(opts Options) (*Gateway, error) {
	if opts.Store == nil {
		return nil, errors.New("gateway: no store")
	}
	if err := idem.ValidateTenantID(opts.Tenant); err != nil {
		return nil, fmt.Errorf("gateway tenant %q: %w", opts.Tenant, err)
	}
	if opts.StoreTimeout <= 0 {
		opts.StoreTimeout = 5 * time.Second
	}
	if opts.BodyReadTimeout <= 0 {
		opts.BodyReadTimeout = DefaultBodyReadTimeout
	}
	if opts.MaxInflightBytes <= 0 {
		opts.MaxInflightBytes = DefaultMaxInflightBytes
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.RetryBudget == nil {
		opts.RetryBudget = retrybudget.New(retrybudget.DefaultWindow, nil)
	}
	// The gateway writes one tenant's records: a tenant share of its
	// pool would have no other tenant to keep connections for.
	store := storemw.Wrap(opts.Store, storemw.Options{Timeout: opts.StoreTimeout, Metrics: opts.Metrics})
	g := &Gateway{
		opts: opts, budget: budget.NewShared(opts.MaxInflightBytes, 0), store: store, tenants: tenants.NewService(store, opts.TenantCacheTTL),
		transport: opts.Transport, logger: opts.Logger, retries: opts.RetryBudget,
	}
	g.metrics = newMetrics(opts.Registerer, g.budget.Used, g.replayCacheStats)
	if g.transport == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.MaxIdleConnsPerHost = 256
		g.transport = t
	}
	if err := g.Reload(); err != nil {
		return nil, err
	}
	return g, nil
}

// replayCacheStats are the counters of the replay cache in use (zero
// before the first configuration, or with the cache off).
func (g *Gateway) replayCacheStats() frontdoor.ReplayCacheStats {
	if rt := g.routing.Load(); rt != nil {
		return rt.cache.Stats()
	}
	return frontdoor.ReplayCacheStats{}
}

// Reload reads the configuration file again and swaps it in atomically:
// requests already running finish with the configuration they started
// with, none is dropped. An invalid file leaves the running configuration
// in place and returns the error.
func (g *Gateway) Reload() error {
	f, err := LoadFile(g.opts.ConfigFile)
	if err != nil {
		return err
	}
	rt, err := compile(f, g.opts.Upstream)
	if err != nil {
		return fmt.Errorf("gateway config: %w", err)
	}
	if err := rt.fits(g.budget.Limit()); err != nil {
		return fmt.Errorf("gateway config: %w", err)
	}
	co, err := f.ReplayCache.options(g.opts.ReplayCache)
	if err != nil {
		return fmt.Errorf("gateway config: %w", err)
	}
	rt.cache = frontdoor.NewReplayCache(co)
	g.budget.SetShare(g.shareOf(rt))
	g.routing.Store(rt)
	return nil
}

// exchange is one request through the gateway, for the access log and the
// metrics.
type exchange struct {
	rid      string
	start    time.Time
	route    string
	outcome  string
	status   int
	attempt  int
	upstream time.Duration
}

// Outcomes of a request, the "outcome" label of the metrics and the access
// log.
const (
	outcomePassthrough         = "passthrough"
	outcomeExecuted            = "executed"
	outcomeTakeover            = "takeover"
	outcomeReplayed            = "replayed"
	outcomeNotReplayable       = "not_replayable"
	outcomeInFlight            = "in_flight"
	outcomeMismatch            = "mismatch"
	outcomeRefused             = "refused"
	outcomeStoreUnavailable    = "store_unavailable"
	outcomeFailOpen            = "fail_open"
	outcomeUpstreamUnavailable = "upstream_unavailable"
	outcomeUpstreamTimeout     = "upstream_timeout"
	outcomeCanceled            = "canceled"
	outcomeBusy                = "busy"
	outcomeRetryBudget         = "retry_budget"
)

// ServeHTTP implements http.Handler.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	x := &exchange{start: time.Now()}
	rid := frontdoor.RequestID(w, r)
	x.rid = rid
	sw := &statuswriter.Writer{ResponseWriter: w}
	g.serve(sw, r, x)
	x.status = sw.Status
	g.metrics.observe(x)
	g.logger.LogAttrs(r.Context(), slog.LevelInfo, "gateway request",
		slog.String("request_id", rid),
		slog.String("method", r.Method),
		slog.String("route", x.route),
		slog.Int("status", x.status),
		slog.String("outcome", x.outcome),
		slog.Int("attempt", x.attempt),
		slog.Float64("upstream_ms", float64(x.upstream.Microseconds())/1000),
		slog.Float64("duration_ms", float64(time.Since(x.start).Microseconds())/1000),
		slog.String("tenant", g.opts.Tenant))
}

func (g *Gateway) serve(w http.ResponseWriter, r *http.Request, x *exchange) {
	rt := g.routing.Load()
	rr, routeName := rt.match(r)
	x.route = rr.pattern
	if x.route == "" {
		x.route = "(unmatched)"
	}
	d := &request{g: g, x: x, rt: rt, rr: rr, routeName: routeName}
	defer func() {
		if d.held > 0 {
			g.budget.Release(d.owner, d.held)
		}
	}()
	frontdoor.Serve(w, r, d)
}

// request is the gateway's front door for one request (frontdoor.Door):
// its port is the store, its work the upstream call, and it keeps the
// request's share of the in-flight budget and its outcome for the access
// log.
type request struct {
	g         *Gateway
	x         *exchange
	rt        *routing
	rr        *route
	routeName string
	r         *http.Request

	scope  string
	owner  string
	held   int64 // of the budget, released once the answer is written
	answer int64 // of held, reserved for the upstream's answer
	body   []byte
	tenant idem.Tenant
}

// errFailOpen is the claim's error when the store failed on a route that
// fails open: the request is passed through unprotected.
var errFailOpen = errors.New("gateway: the store failed; the route fails open")

func (d *request) Methods() frontdoor.Methods { return d.rr.methods }

func (d *request) Pass(w http.ResponseWriter, r *http.Request) {
	d.x.outcome = outcomePassthrough
	d.g.passThrough(w, r, d.rr, d.x, r.Body)
}

// Scope is the route's scope of the caller. No route scopes keys: every
// key is a record key as it is, a ":" included (frontdoor.ScopedKey's
// refusal guards scoped records, and there are none).
func (d *request) Scope(r *http.Request) (string, bool, error) {
	scope, err := d.rr.scope(r)
	if err != nil {
		return "", false, err
	}
	d.scope = scope
	return scope, scope != "" || d.rt.scoped, nil
}

// ReadBody charges the budget for the body before a byte of it is read,
// reads it within the body read timeout, and keeps of the charge only
// what the body holds.
func (d *request) ReadBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	g := d.g
	d.owner = budgetOwner(r, d.scope)
	held, ok := g.reserveBody(r, d.owner, d.rr.maxBody)
	if !ok {
		return nil, d.busy()
	}
	d.held = held
	body, err := g.readBody(w, r, d.rr.maxBody)
	if err != nil {
		return nil, err
	}
	// A body of unknown length was charged the route's limit: keep only
	// what it holds.
	if keep := int64(len(body)) * BodyMemoryFactor; keep < d.held {
		g.budget.Release(d.owner, d.held-keep)
		d.held = keep
	}
	d.body = body
	return body, nil
}

func (d *request) Rules() frontdoor.Rules { return d.rr.rules }

func (d *request) Route(*http.Request) string { return d.routeName }

func (d *request) LeaseBound() bool { return false }

func (d *request) Store5xx() bool { return d.rr.store5xx }

// Refuse answers a refusal, or passes the request through when the store
// failed on a route that fails open.
func (d *request) Refuse(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, errFailOpen) {
		d.g.passThrough(w, r, d.rr, d.x, io.NopCloser(bytes.NewReader(d.body)))
		return
	}
	if d.x.outcome == "" {
		d.x.outcome = outcomeRefused
	}
	frontdoor.Refuse(w, r, err)
}

// Admit decides the caller's attempt by the tenant's fleet retry budget
// (frontdoor.Budget; rule 9), before the body is read, the tenant looked
// up or anything claimed: a refused retry costs the store nothing and
// leaves its key as it was, during a store outage too. It decides on the
// retry_budget_percent of the tenant's last request (Claim records it).
func (d *request) Admit(r *http.Request, _ frontdoor.Attempt) error {
	g := d.g
	// The server's own reading of the field (frontdoor.CallerAttempt reads
	// every vector the same way), with the causes the metrics count by.
	at := retrybudget.ParseAttempt(r.Header.Values(retrybudget.Header))
	// Each protected request is a claim: its retry spends the claims' allowance.
	dec := g.retries.Admit(g.opts.Tenant, retrybudget.KindClaim, at)
	if g.opts.Metrics != nil {
		g.opts.Metrics.ObserveAttempt(g.opts.Tenant, at, !dec.Allowed)
	}
	if dec.Allowed {
		return nil
	}
	d.x.outcome = outcomeRetryBudget
	return frontdoor.BudgetRefusal(dec.RetryAfter)
}

// Spent reports whether the tenant's fleet retry budget is spent, for a
// retryable refusal of the claim (frontdoor.Budget): its answer then says
// so (Idem-Retry-Budget: exhausted), as idem's own answers do.
func (d *request) Spent(*http.Request) bool {
	return d.g.retries.Invite(d.g.opts.Tenant, retrybudget.KindClaim)
}

// ReplayCache is the configuration snapshot's cache, of the gateway's
// one tenant.
func (d *request) ReplayCache() (*frontdoor.ReplayCache, string) { return d.rt.cache, d.g.opts.Tenant }

// CachedReplay counts a replay answered from the cache as replayed.
func (d *request) CachedReplay(*http.Request) { d.x.outcome = outcomeReplayed }

// busy is the refusal of a protected request for lack of in-flight
// budget, before anything was claimed or sent upstream.
func (d *request) busy() error {
	d.x.outcome = outcomeBusy
	return &frontdoor.Error{Code: frontdoor.CodeServerBusy, RetryAfter: time.Second,
		Detail: "the gateway holds as many request bodies and answers as it may; the request was not processed, retry after Retry-After with the same key"}
}

// Claim fingerprints the document and claims the key in the store under
// the tenant's settings, translating the store's refusals into the front
// door's.
func (d *request) Claim(sctx context.Context, r *http.Request, req frontdoor.ClaimRequest) (*frontdoor.Claimed, error) {
	g, rr, x := d.g, d.rr, d.x
	d.r = r
	fp, err := canon.Fingerprint(req.Document)
	if err != nil {
		return nil, &frontdoor.Error{Code: frontdoor.CodeInvalidRequest, Detail: "the request body cannot be fingerprinted: " + err.Error(),
			Fields: []frontdoor.FieldError{{Field: "body", Message: err.Error()}}}
	}
	c := &frontdoor.Claimed{Key: req.Key}
	t, err := g.tenants.Active(sctx, g.opts.Tenant)
	var res idem.ClaimResult
	if err == nil {
		g.retries.SetPercent(t.ID, t.Settings.RetryBudgetPercent)
		// The upstream's answer is buffered up to what may be stored:
		// reserve that before anything is claimed or sent, so the answer
		// of a request the upstream ran always has room to be stored.
		d.answer = int64(storedLimit(t, rr))
		if !g.budget.Acquire(d.owner, d.answer) {
			return nil, d.busy()
		}
		d.held += d.answer
		var lease time.Duration
		lease, err = t.Settings.LeaseFor(g.leaseSeconds(r.Context(), t, rr))
		if err == nil {
			// Prefer: wait=N holds the request while the key is in flight,
			// capped by the tenant's max_wait_seconds and the route's
			// max_wait.
			wait := t.Settings.WaitFor(frontdoor.PreferWait(r.Header.Values("Prefer")))
			if rr.maxWait >= 0 {
				wait = min(wait, rr.maxWait)
			}
			var applied bool
			res, applied, err = g.opts.Waiters.Claim(sctx, g.store, idem.ClaimParams{
				TenantID: t.ID, Key: req.Key, Operation: req.Operation, Fingerprint: fp, Lease: lease,
				ReplayWindow: t.Settings.ReplayWindow(), ReaperThreshold: t.Settings.ReaperThreshold(),
				StorageQuotaBytes: t.ClaimQuota(),
			}, wait)
			if applied {
				c.WaitApplied = wait
			}
		}
	}
	if err != nil {
		return c, d.claimError(r, err)
	}
	rec := res.Record
	x.attempt = rec.Attempt
	if res.Action == idem.ActionReplay {
		x.outcome = outcomeReplayed
		resp := rec.Response
		if resp == nil {
			resp = &idem.Response{Status: http.StatusOK}
		}
		if _, ok := resp.Headers[frontdoor.HeaderNotReplayable]; ok {
			x.outcome = outcomeNotReplayable
		}
		// A response stored while the limit was higher is charged what
		// it holds beyond the reservation.
		if more := int64(resp.Size()) - d.answer; more > 0 {
			if !g.budget.Acquire(d.owner, more) {
				return c, d.busy()
			}
			d.held += more
		}
		c.Replay = &frontdoor.Stored{Status: resp.Status, Headers: resp.Headers, Body: resp.Body}
		// On the database's clock, which decides when the record expires.
		c.ReplayLeft = rec.ReplayUntil.Sub(rec.ObservedAt)
		return c, nil
	}
	x.outcome = outcomeExecuted
	if res.Action == idem.ActionTakeover {
		x.outcome = outcomeTakeover
	}
	d.tenant = t
	c.Token, c.Attempt, c.Takeover = rec.FencingToken, rec.Attempt, res.Action == idem.ActionTakeover
	c.Lease = rec.LeaseExpiresAt.Sub(rec.ObservedAt)
	return c, nil
}

// claimError is the front door's answer to a claim the store refused or
// failed, and the request's outcome.
func (d *request) claimError(r *http.Request, err error) error {
	g, x := d.g, d.x
	switch {
	case errors.Is(err, idem.ErrRequestInFlight):
		x.outcome = outcomeInFlight
		return withRetryAfter(frontdoor.Errorf(frontdoor.CodeRequestInFlight,
			"a request with this idempotency key is being processed; retry after Retry-After seconds"), err)
	case errors.Is(err, idem.ErrOutcomeUnknown) || errors.Is(err, idem.ErrOutcomeReview):
		// idem's completer holds the key (rule 8): in flight while it
		// finds out what the first request did, a refusal once it gave
		// up. The store is up and answered: never fail_open.
		e := frontdoor.Held(idem.ErrorCode(err), 0)
		if e.Code == frontdoor.CodeRequestInFlight {
			x.outcome = outcomeInFlight
			return withRetryAfter(e, err)
		}
		x.outcome = outcomeRefused
		g.logger.WarnContext(r.Context(), "gateway: the key waits for a person's review (idem's completer gave up on it)",
			"request_id", x.rid)
		return e
	case errors.Is(err, idem.ErrFingerprintMismatch):
		x.outcome = outcomeMismatch
		return &frontdoor.Error{Code: frontdoor.CodeFingerprintMismatch, Detail: frontdoor.MismatchDetail}
	case errors.Is(err, idem.ErrStorageQuotaExceeded):
		// The store is up and refused a new record: not a store failure,
		// so a fail_open route does not pass the request through either.
		x.outcome = outcomeRefused
		return frontdoor.Errorf(frontdoor.CodeStorageQuotaExceeded, "%s", frontdoor.StorageQuotaDetail)
	case r.Context().Err() != nil:
		// The caller went away during the claim; nobody reads this answer
		// and the store is not to blame.
		x.outcome = outcomeCanceled
		return frontdoor.Errorf(frontdoor.CodeStoreUnavailable, "the request was canceled before it was claimed")
	case errors.Is(err, idem.ErrTenantUnknown):
		// idem refused: the gateway's tenant is gone or disabled. The store
		// is up, so this is no store failure: a fail_open route does not
		// pass the request through, and no retry succeeds until an
		// operator acts.
		x.outcome = outcomeRefused
		g.logger.ErrorContext(r.Context(), "gateway: idem refused the gateway's tenant (it does not exist or is disabled)",
			"request_id", x.rid, "tenant", g.opts.Tenant)
		return frontdoor.Errorf(frontdoor.CodeTenantUnknown, "%s", frontdoor.TenantUnknownDetail)
	case !storeFailed(err):
		// Any other refusal by idem (the store answered, with a code of the
		// domain): a refusal, never a reason to run the request
		// unprotected, nor a retryable 503.
		x.outcome = outcomeRefused
		g.logger.ErrorContext(r.Context(), "gateway: idem refused the claim",
			"request_id", x.rid, "code", string(idem.ErrorCode(err)), "error", err.Error())
		detail := "idem refused the claim"
		var ie *idem.Error
		if errors.As(err, &ie) && ie.Detail != "" {
			detail += ": " + ie.Detail
		}
		return frontdoor.Errorf(frontdoor.CodeInvalidRequest, "%s; the request was not processed and not sent upstream", detail)
	}
	g.logger.ErrorContext(r.Context(), "gateway: the store failed; failing closed unless the route fails open",
		"request_id", x.rid, "error", err.Error())
	if d.rr.failOpen {
		x.outcome = outcomeFailOpen
		return errFailOpen
	}
	x.outcome = outcomeStoreUnavailable
	return withRetryAfter(frontdoor.Errorf(frontdoor.CodeStoreUnavailable,
		"the idempotency store is unavailable; the request was not processed, retry later with the same key"), err)
}

// storeFailed reports whether err is the store failing (unreachable,
// too slow, an error without a code of the domain): the only errors a
// fail_open route passes through unprotected. An error with another code
// is idem refusing the request, and is answered as a refusal.
func storeFailed(err error) bool {
	switch idem.ErrorCode(err) {
	case idem.CodeStoreUnavailable, idem.CodeInternal:
		return true
	}
	return false
}

// leaseSeconds is the lease a claim on rr asks idem for: the route's
// lease (0: the tenant's default), capped by the tenant's
// lease_seconds_max. A route's lease over the maximum, in the file or
// after the tenant's admin lowered it, is clamped rather than refused:
// the route stays protected, and the lease is renewed every third of it
// while the upstream works, so a long call is not cut short. The first
// request after a (re)load, and the first after the maximum changed, log
// each route that is clamped.
func (g *Gateway) leaseSeconds(ctx context.Context, t idem.Tenant, rr *route) int {
	limit := t.Settings.LeaseSecondsMax
	// Load before Swap: every protected request passes here, and only a
	// change of the maximum needs the write.
	if rt := g.routing.Load(); rt.leaseChecked.Load() != int64(limit) && rt.leaseChecked.Swap(int64(limit)) != int64(limit) {
		for _, c := range rt.all() {
			if c.lease > time.Duration(limit)*time.Second {
				g.logger.WarnContext(ctx, "gateway: a route's lease is over the tenant's lease_seconds_max; its claims take the maximum",
					"route", c.name(), "lease_seconds", int(c.lease/time.Second), "lease_seconds_max", limit, "tenant", t.ID)
			}
		}
	}
	return min(int(rr.lease/time.Second), limit)
}

// DefaultMaxInflightBytes is Options.MaxInflightBytes when unset, the
// server's default IDEM_MAX_INFLIGHT_BYTES.
const DefaultMaxInflightBytes = 64 << 20

// BodyMemoryFactor is how many times its size a protected request's body
// is charged against the budget: it is held as read, in the fingerprint
// document and in its canonical form while the upstream call runs, and
// sent upstream from a copy. The upstream's answer is charged apart (see
// storedLimit).
const BodyMemoryFactor = 4

// reserveBody charges the budget for the body of a protected request
// before a byte of it is read: its Content-Length (the route's limit when
// it announces more: the read stops there with 413), or the route's limit
// when the length is unknown, in owner's share. It returns the bytes
// charged, or false when they do not fit; the caller releases them once the
// answer is written.
func (g *Gateway) reserveBody(r *http.Request, owner string, limit int64) (int64, bool) {
	n := r.ContentLength
	if n < 0 || n > limit {
		n = limit
	}
	held := n * BodyMemoryFactor
	return held, g.budget.Acquire(owner, held)
}

// budgetOwner is whose share of the budget a protected request counts in:
// the caller the route scopes keys by (a header's value, a bearer token's
// subject) when it has a scope, else the client's address. The gateway
// serves one tenant, so without it one anonymous client announcing large
// bodies and sending them slowly refused every other caller until the body
// read timeout. (The address is a substring of RemoteAddr: no allocation.)
func budgetOwner(r *http.Request, scope string) string {
	if scope != "" {
		return scope
	}
	if host, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		return host
	}
	return r.RemoteAddr
}

// shareOf is the share of each caller in the budget for the routes of rt:
// Options.InflightShare of it, and at least what the largest request of a
// route holds (route.mostHeld), so that such a request is never
// refused to a caller holding nothing while the budget has room.
func (g *Gateway) shareOf(rt *routing) int64 {
	var largest int64
	for _, r := range rt.all() {
		body, answer := r.mostHeld()
		largest = max(largest, body+answer)
	}
	share := g.opts.InflightShare
	if share <= 0 {
		share = budget.DefaultShare
	}
	return budget.ShareOf(g.budget.Limit(), share, largest)
}

// storedLimit is the largest answer of route rr the gateway stores for
// tenant t (headers and body): the route's max_stored_bytes capped by the
// tenant's max_response_bytes. It is also what a protected request reserves
// of the in-flight budget for the answer before it is claimed.
func storedLimit(t idem.Tenant, rr *route) int {
	limit := t.Settings.MaxResponseBytes
	if rr.maxStored > 0 && rr.maxStored < limit {
		limit = rr.maxStored
	}
	return limit
}

// DefaultBodyReadTimeout is Options.BodyReadTimeout when unset, the
// server's default IDEM_READ_TIMEOUT.
const DefaultBodyReadTimeout = 30 * time.Second

// readBody reads the body of a protected request (frontdoor.ReadBody)
// within Options.BodyReadTimeout. The listener sets no read timeout of its
// own, since an upstream call may outlast any: the deadline is set on the
// connection for the body only, and lifted once it is read. A body that
// could not be read leaves the deadline in place and the connection is
// closed after the answer: net/http would otherwise wait, before it
// answers, for the rest of a body that is not coming.
func (g *Gateway) readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Now().Add(g.opts.BodyReadTimeout))
	body, err := frontdoor.ReadBody(w, r, limit)
	if err != nil {
		w.Header().Set("Connection", "close")
		return nil, err
	}
	_ = rc.SetReadDeadline(time.Time{})
	return body, nil
}

// scope returns the key scope of r under the route's policy: "" without
// one, the scope header's value, or the sub claim of the caller's verified
// bearer token. The field that gives the scope must come once and hold one
// value: with two (or a list in one), the gateway would scope the key by
// one of them while the upstream may serve the caller as another, so the
// request is refused, as two Idempotency-Key fields are.
func (rr *route) scope(r *http.Request) (string, error) {
	switch {
	case rr.scopeHeader != "":
		vs := r.Header.Values(rr.scopeHeader)
		switch {
		case len(vs) > 1:
			return "", frontdoor.Errorf(frontdoor.CodeInvalidKey, "the request carries %d %s fields, which scope the key; send exactly one", len(vs), rr.scopeHeader)
		case len(vs) == 0 || vs[0] == "":
			return "", frontdoor.Errorf(frontdoor.CodeInvalidKey, "the %s header that scopes the key is missing", rr.scopeHeader)
		case strings.Contains(vs[0], ","):
			return "", frontdoor.Errorf(frontdoor.CodeInvalidKey, "the %s header, which scopes the key, holds a list (a comma); send one value", rr.scopeHeader)
		}
		return vs[0], nil
	case rr.scopeJWT != nil:
		if fields := r.Header.Values("Authorization"); len(fields) > 1 {
			return "", frontdoor.Errorf(frontdoor.CodeInvalidKey, "the key is scoped by the caller's bearer token, and the request carries %d Authorization fields; send exactly one", len(fields))
		}
		tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok {
			return "", frontdoor.Errorf(frontdoor.CodeInvalidKey, "the key is scoped by the caller's bearer token, and the request has none")
		}
		p, err := rr.scopeJWT.Verify(strings.TrimSpace(tok))
		if err != nil || p.Subject == "" {
			return "", frontdoor.Errorf(frontdoor.CodeInvalidKey, "the key is scoped by the caller's bearer token, and it is invalid or has no sub claim")
		}
		return p.Subject, nil
	}
	return "", nil
}

// withRetryAfter gives e the Retry-After the store chose for err (the
// lease left, or its own back-off), if it chose one.
func withRetryAfter(e *frontdoor.Error, err error) *frontdoor.Error {
	var ie *idem.Error
	if errors.As(err, &ie) {
		e.RetryAfter = ie.RetryAfter
	}
	return e
}

// Run calls the upstream under the claim and reads its answer, up to what
// may be stored.
func (d *request) Run(ctx context.Context, r *http.Request, c *frontdoor.Claimed, body []byte) (*frontdoor.Answer, error) {
	g, rr, x := d.g, d.rr, d.x
	uctx, cancel := context.WithTimeout(ctx, rr.timeout)
	began := time.Now()
	// Whether the request reached the upstream: once its headers are
	// written, the upstream may act on it whatever happens next.
	var sent atomic.Bool
	uctx = httptrace.WithClientTrace(uctx, &httptrace.ClientTrace{WroteHeaders: func() { sent.Store(true) }})
	resp, err := g.roundTrip(uctx, r, rr, io.NopCloser(bytes.NewReader(body)), int64(len(body)))
	x.upstream = time.Since(began)
	if err != nil {
		cancel()
		timeout := errors.Is(err, context.DeadlineExceeded) || isTimeout(err)
		x.outcome = outcomeUpstreamUnavailable
		if timeout {
			x.outcome = outcomeUpstreamTimeout
		}
		if sent.Load() && rr.store5xx {
			return d.failure(timeout, rr.timeout), nil
		}
		return nil, &frontdoor.Unanswered{Release: true, Problem: upstreamError(sent.Load(), timeout, rr.timeout,
			"the key was released, retry with the same key",
			"the key was released (store_5xx: false), so a retry with the same key sends it again")}
	}

	maxStored := storedLimit(d.tenant, rr)
	stored := frontdoor.StoredHeaders(resp.Header, rr.storedHeaders)
	headerBytes := 0
	for k, v := range stored {
		headerBytes += len(k) + len(v)
	}
	limit := int64(maxStored - headerBytes)
	var buf bytes.Buffer
	if n := resp.ContentLength; n >= 0 && n <= limit {
		// Room for the whole answer and the read that finds its end: the
		// buffer does not double past the bytes reserved for it.
		buf.Grow(int(n) + bytes.MinRead)
	}
	n, err := io.Copy(&buf, io.LimitReader(resp.Body, max(limit, 0)+1))
	x.upstream = time.Since(began)
	if err != nil && n <= limit {
		// The upstream broke off its answer: nothing of it is usable, and
		// it had the request, so it may have acted. Like a request it did
		// not answer: its 502 is stored like a 5xx (store_5xx), or the
		// claim is left to become an orphan that a retry takes over.
		resp.Body.Close()
		cancel()
		x.outcome = outcomeUpstreamUnavailable
		g.logger.ErrorContext(r.Context(), "gateway: the upstream response broke off", "error", err.Error())
		if rr.store5xx {
			return d.failure(false, rr.timeout), nil
		}
		return nil, &frontdoor.Unanswered{Problem: frontdoor.Errorf(frontdoor.CodeUpstreamUnavailable,
			"the upstream's answer broke off: it had the request and may have acted on it; the key stays claimed until its lease runs out, then a retry with the same key sends it again (store_5xx: false)")}
	}
	a := &frontdoor.Answer{Status: resp.StatusCode, Header: resp.Header, AddHeader: true, Stored: stored, Body: buf.Bytes(),
		TooLarge: n > limit, NotStoredNote: "response larger than " + strconv.Itoa(maxStored) + " bytes not stored"}
	if a.TooLarge {
		// Streamed through once stored: what was read, then the rest.
		a.Rest = &upstreamRest{ReadCloser: resp.Body, cancel: cancel}
	} else {
		resp.Body.Close()
		cancel()
	}
	return a, nil
}

// upstreamRest is the rest of an upstream answer too large to store, read
// after Run returned: closing it ends the upstream call.
type upstreamRest struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (u *upstreamRest) Close() error {
	err := u.ReadCloser.Close()
	u.cancel()
	return err
}

// upstreamError is the problem of an upstream call that got no answer.
// It says whether the request reached the upstream (its headers were
// written), since that decides what a retry risks: a request that never
// reached it cannot have run, one that did may have acted. notSent and
// wasSent end the detail: what became of the key in each case.
func upstreamError(sent, timeout bool, limit time.Duration, notSent, wasSent string) *frontdoor.Error {
	switch {
	case !sent && timeout:
		return frontdoor.Errorf(frontdoor.CodeUpstreamTimeout,
			"the upstream could not be reached within %s: the request never reached it; %s", limit, notSent)
	case !sent:
		return frontdoor.Errorf(frontdoor.CodeUpstreamUnavailable,
			"the upstream could not be reached: the request never reached it; %s", notSent)
	case timeout:
		return frontdoor.Errorf(frontdoor.CodeUpstreamTimeout,
			"the upstream received the request and did not answer within %s: it may have acted on it; %s", limit, wasSent)
	}
	return frontdoor.Errorf(frontdoor.CodeUpstreamUnavailable,
		"the upstream received the request and the connection broke before its answer: it may have acted on it; %s", wasSent)
}

// failure is the answer to a request the upstream received but did not
// answer (it timed out, or the connection broke before its answer): the
// upstream may have acted on it, so like a 5xx answer (store_5xx, the
// default) the gateway's 502 or 504 is stored and sent, and a retry gets
// it replayed instead of running the request a second time. The caller
// learns the outcome from the upstream, and sends a new key to try again.
func (d *request) failure(timeout bool, limit time.Duration) *frontdoor.Answer {
	e := frontdoor.Errorf(frontdoor.CodeUpstreamUnavailable,
		"the upstream received the request and the connection broke before its answer was in; it may have acted on it, so this answer is stored and replayed for this key: check the outcome, and use a new key to try again")
	if timeout {
		e = frontdoor.Errorf(frontdoor.CodeUpstreamTimeout,
			"the upstream received the request and did not answer within %s; it may have acted on it, so this answer is stored and replayed for this key: check the outcome, and use a new key to try again", limit)
	}
	body, _ := json.Marshal(frontdoor.NewProblem(e, d.x.rid))
	return &frontdoor.Answer{Status: e.Status(), AddHeader: true,
		Header: http.Header{"Content-Type": {"application/problem+json"}, "Cache-Control": {"no-store"}},
		Stored: map[string]string{"Content-Type": "application/problem+json"}, Body: body}
}

// bodyEncoding is how a stored body travels in JSON: as text when it is
// valid UTF-8; none without a body.
func bodyEncoding(b []byte) string {
	switch {
	case b == nil:
		return ""
	case utf8.Valid(b):
		return idem.BodyEncodingUTF8
	}
	return idem.BodyEncodingBase64
}

// completeRetryMin is the shortest time complete keeps asking a store that
// is unavailable to store a response; it asks for as long as the claim's
// lease when that is longer.
const completeRetryMin = 5 * time.Second

// Complete stores the response. The upstream has run: a response that is
// not stored leaves the record in flight, and once its lease runs out a
// retry takes it over and runs the upstream a second time. So a store
// that is unavailable (store_unavailable: a lock held elsewhere, a
// deadline, a lost connection) is asked again, with a growing pause, for
// as long as the claim's lease and at least completeRetryMin: a complete
// that landed but whose answer was lost is then a repeat, which the store
// accepts. Any other refusal (lease_lost: a retry took the key over
// meanwhile) ends it at once. A response still not stored is logged and
// sent all the same.
func (d *request) Complete(ctx context.Context, c *frontdoor.Claimed, s frontdoor.Stored) error {
	g, r := d.g, d.r
	resp := idem.Response{Status: s.Status, Headers: s.Headers, Body: s.Body, BodyEncoding: bodyEncoding(s.Body)}
	until := time.Now().Add(max(c.Lease, completeRetryMin))
	pause := 50 * time.Millisecond
	for {
		// The quota is checked as the API checks it: a response without
		// room completes the key as not replayable (storage_quota_exceeded,
		// logged below; the retry is 409 response_not_replayable).
		_, err := g.store.Complete(ctx, idem.CompleteParams{TenantID: d.tenant.ID, Key: c.Key, FencingToken: c.Token, Response: resp,
			StorageQuotaBytes: d.tenant.Settings.StorageQuotaBytes})
		if err == nil {
			return nil
		}
		g.metrics.storeFailures.WithLabelValues("complete").Inc()
		if idem.ErrorCode(err) != idem.CodeStoreUnavailable || time.Now().Add(pause).After(until) {
			g.logger.ErrorContext(r.Context(), "gateway: the upstream answered but its response was not stored",
				"request_id", r.Header.Get(frontdoor.HeaderRequestID), "error", err.Error())
			return err
		}
		g.logger.WarnContext(r.Context(), "gateway: storing the response failed; trying again",
			"request_id", r.Header.Get(frontdoor.HeaderRequestID), "retry_in", pause, "error", err.Error())
		time.Sleep(pause)
		pause = min(2*pause, time.Second)
	}
}

// Release releases the key; a failure leaves it to become an orphan.
func (d *request) Release(ctx context.Context, c *frontdoor.Claimed) error {
	err := d.g.store.Release(ctx, idem.ReleaseParams{TenantID: d.tenant.ID, Key: c.Key, FencingToken: c.Token})
	if err != nil {
		d.g.metrics.storeFailures.WithLabelValues("release").Inc()
		d.g.logger.ErrorContext(d.r.Context(), "gateway: releasing the key failed; it becomes an orphan", "error", err.Error())
	}
	return err
}

// Checkpoint renews the claim's lease while the upstream call runs
// (recovery point "upstream").
func (d *request) Checkpoint(ctx context.Context, c *frontdoor.Claimed) error {
	_, err := d.g.store.Checkpoint(ctx, idem.CheckpointParams{
		TenantID: d.tenant.ID, Key: c.Key, FencingToken: c.Token, RecoveryPoint: "upstream", Lease: c.Lease,
	})
	if err == nil {
		return nil
	}
	d.g.metrics.storeFailures.WithLabelValues("renew").Inc()
	d.g.logger.WarnContext(d.r.Context(), "gateway: renewing the lease failed", "error", err.Error())
	if errors.Is(err, idem.ErrLeaseLost) || errors.Is(err, idem.ErrKeyNotFound) || errors.Is(err, idem.ErrAlreadyCompleted) {
		return fmt.Errorf("%w: %w", frontdoor.ErrLeaseGone, err)
	}
	return err
}

// passThrough proxies a request that is not protected, streaming both ways.
func (g *Gateway) passThrough(w http.ResponseWriter, r *http.Request, rr *route, x *exchange, body io.ReadCloser) {
	ctx, cancel := context.WithTimeout(r.Context(), rr.timeout)
	defer cancel()
	var sent atomic.Bool
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{WroteHeaders: func() { sent.Store(true) }})
	began := time.Now()
	resp, err := g.roundTrip(ctx, r, rr, body, r.ContentLength)
	x.upstream = time.Since(began)
	if err != nil {
		frontdoor.WriteProblem(w, r, upstreamError(sent.Load(), errors.Is(err, context.DeadlineExceeded) || isTimeout(err), rr.timeout,
			"sending it again cannot run it twice", "it was passed through without a key, so check the outcome before sending it again"))
		return
	}
	defer resp.Body.Close()
	copyHeader(w.Header(), resp.Header)
	w.WriteHeader(resp.StatusCode)
	_, _ = io.Copy(w, resp.Body)
}
