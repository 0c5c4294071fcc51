// Package idemhttp is net/http middleware that gives an existing Go HTTP
// API Stripe-style Idempotency-Key semantics
// (draft-ietf-httpapi-idempotency-key-header) by calling the idem service
// through a *client.Client. It follows the front-door rules of package
// client/frontdoor (docs/frontdoor.md of the repository), the same package
// the idem gateway uses, so the two cannot drift:
//
//   - The key is the Idempotency-Key header, as an RFC 8941 sf-string
//     ("k") or bare (k); both are the same key. Two fields, an empty value,
//     a list or a key that is not 1–255 printable ASCII bytes get 400
//     problem+json (invalid_key). POST and PATCH require a key (400
//     idempotency_key_missing without one), PUT and DELETE are protected
//     when they carry one, safe methods are never claimed
//     (Options.Methods changes this). Options.Scope keeps the keys of
//     different callers apart (scope + ":" + key).
//   - The claim's operation is the method plus the route: the net/http
//     ServeMux pattern (r.Pattern) when there is one, the path otherwise
//     (frontdoor.PathRoute: the decoded path, or the path as it arrived,
//     escaped, when the decoded one holds a control character or bytes
//     that are not UTF-8, which idem refuses in a label);
//     Options.Route supplies the pattern of another router (chi:
//     chi.RouteContext(r.Context()).RoutePattern()). The request sent with
//     the claim is the fingerprint document {"path", "query", "body"} (a
//     JSON body as JSON, so key order and white space do not matter) or
//     {"path", "query", "body_sha256"}; the server fingerprints it. The
//     path is the request's own, so one key on /orders/7 and /orders/8 is
//     422, not a replay; path and query are read as they arrived on the
//     request line (frontdoor.Target), as the Python and Node middleware
//     read them, so the same bytes have the same fingerprint there. A JSON body that is not I-JSON is refused by the
//     server, whose 400 invalid_request is passed on.
//   - A fresh claim or a takeover runs the handler once, buffering its
//     whole response, completes the key with the status, the allowlisted
//     headers (Options.Headers, default frontdoor.DefaultStoredHeaders;
//     never Set-Cookie) and the body, and only then sends the response. The
//     lease is renewed while a slow handler runs. Every status is stored,
//     5xx included (Stripe's behaviour, and what the idem contract says);
//     Options.ReleaseServerErrors releases the key on 5xx instead. A
//     response over Options.MaxStoredBytes is sent but stored without its
//     body: a replay then answers 409 response_not_replayable instead of
//     running the handler again; so is one the tenant's max_response_bytes
//     refuses (413) when it is under MaxStoredBytes; and so is an answer
//     whose status idem cannot store (net/http allows 100–999, idem
//     stores 100–599: frontdoor.StorableStatus), whatever
//     ReleaseServerErrors says, recorded with status 502.
//   - A completed key replays the stored response verbatim with
//     Idempotent-Replayed: true, without running the handler. A replay
//     idem answered is kept in the middleware's replay cache
//     (Options.ReplayCache; docs/frontdoor.md, "The replay cache"): a
//     retry of exactly that request (same key, route and fingerprint
//     document, no Prefer: wait) within its replay window and 2 s is
//     answered from memory, the same bytes, without a call. Another
//     request in flight with the key: 409 request_in_flight with
//     Retry-After at once — unless the request carries Prefer: wait=N
//     (RFC 7240): then the claim asks idem to hold it (wait_seconds =
//     min(N, Options.MaxWait)) and the request gets the replay as soon as
//     the first one completes (or runs the handler when that one releases
//     the key or loses its lease; 409 when the wait runs out), with
//     Preference-Applied: wait=<applied> when idem held it. The key used
//     with another request: 422 fingerprint_mismatch.
//   - A handler that panics stores nothing: the claim is left to become an
//     orphan (a retry after the lease takes it over) and the panic
//     propagates. So does one that breaks off its answer part way
//     (panic(http.ErrAbortHandler)): what it wrote is never stored.
//   - The caller hanging up does not stop a handler that has started: its
//     request's context is the request's values without the caller's
//     cancellation, as the gateway's upstream call, so the handler writes
//     its whole answer and that is stored for the caller's retry. (A
//     handler that stopped on r.Context().Done() returned normally with
//     part of its answer, and that part was stored and replayed as a
//     complete 200.) A caller gone before the handler started releases
//     the key. docs/frontdoor.md rule 5, "A cut answer".
//   - A body idem refuses as over its request limit (IDEM_MAX_BODY_BYTES
//     under MaxBodyBytes): 413 payload_too_large, the handler does not run.
//   - A body that ends before its Content-Length (the caller went away part
//     way: net/http's read fails with io.ErrUnexpectedEOF) or cannot be
//     read: 400 invalid_request, nothing is claimed and the handler does
//     not run, so the caller's real retry runs it with the whole body.
//   - The tenant's storage quota used up (idem refused the claim of a new
//     key: 507 storage_quota_exceeded): 507 storage_quota_exceeded, not
//     retryable, and the handler does not run; keys already completed
//     still replay.
//   - Any other claim idem refuses as invalid (400 invalid_request, an
//     operation from Options.Route it does not accept, say): 400
//     invalid_request, not retryable, naming idem's field; the handler does
//     not run.
//   - The middleware's tenant does not exist or is disabled (idem refused
//     the claim 403 tenant_unknown): 403 tenant_unknown, not retryable
//     (frontdoor.TenantUnknownDetail), and the handler does not run; no
//     retry succeeds until an operator enables the tenant.
//   - A key idem's completer holds (the first request died in flight;
//     docs/frontdoor.md rule 8): 409 request_in_flight with idem's
//     Retry-After while the completer finds out what it did
//     (outcome_unknown), 409 outcome_review, not retryable, once it gave
//     up and a person must resolve the key; the handler does not run.
//   - A caller's Idem-Attempt field (the retry contract: "2;cause=timeout",
//     its retry of its own call) is passed on with the claim
//     (client.WithAttempt), so idem's fleet retry budget counts the
//     retries that arrive through the middleware; a missing or unparsable
//     one is a first attempt (frontdoor.CallerAttempt). A retry the budget
//     refuses: 429 retry_budget_exhausted with Retry-After and
//     Idem-Retry-Budget: exhausted, nothing claimed; a retryable refusal
//     whose idem answer said the budget is spent (or whose own retry idem
//     refused) carries Idem-Retry-Budget: exhausted too
//     (docs/frontdoor.md rule 9).
//   - The idem service unreachable or failing, or refusing the
//     middleware's own token (401 unauthenticated, 403 forbidden: a fault
//     of the service's credentials that a rotation fixes, never the
//     caller's): 503 store_unavailable with Retry-After, and the handler
//     does not run (fail closed). If
//     completing fails after the handler ran, the handler's response is
//     still sent and the error logged.
//
// Every refusal is an RFC 9457 problem (frontdoor.WriteProblem). Streaming
// handlers (http.Flusher, hijacking) are not supported: the response is
// buffered whole, and informational 1xx answers (103 Early Hints) are
// dropped, so the first answer and its replays are the same.
package idemhttp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/idem-dev/idem/client"
	"github.com/idem-dev/idem/client/frontdoor"
)

// HeaderKey is the request header that carries the idempotency key, and
// HeaderReplayed the response header set on replays.
const (
	HeaderKey      = frontdoor.HeaderKey
	HeaderReplayed = frontdoor.HeaderReplayed
)

// Options configure Middleware. Zero values take the documented defaults.
type Options struct {
	// Methods says which methods require a key and which are protected
	// when they carry one; the zero value is the default (POST and PATCH
	// required, other unsafe methods optional). Methods{Required:
	// []string{}} protects only requests that carry a key.
	Methods frontdoor.Methods
	// Headers are the response headers stored and replayed; nil takes
	// frontdoor.DefaultStoredHeaders. Set-Cookie is never stored.
	Headers []string
	// ReleaseServerErrors releases the key on a 5xx answer, so that the
	// retry runs the handler again, instead of storing and replaying it.
	// Only for handlers whose 5xx is known to come before any side effect.
	ReleaseServerErrors bool
	// Scope returns the caller's scope (e.g. the authenticated account id):
	// keys are claimed as scope + ":" + key. Without it every caller shares
	// one key space in the idem tenant. An error answers 400 invalid_key.
	Scope func(r *http.Request) (string, error)
	// Route returns the route pattern of the request for the operation
	// label; nil uses r.Pattern of net/http's ServeMux, or the path.
	Route func(r *http.Request) string
	// Fingerprint are the fingerprint rules (JSON pointers to leave out,
	// headers to include).
	Fingerprint frontdoor.Rules
	// Lease is the lease asked for; zero takes the tenant's default.
	Lease time.Duration
	// MaxWait caps how long a request with Prefer: wait=N is held while
	// another request with its key is in flight (the claim's wait_seconds
	// = min(N, MaxWait)). Zero: no cap of the middleware's own (the
	// tenant's max_wait_seconds and the client's attempt timeout less a
	// second still apply); negative: Prefer is ignored, 409 at once.
	MaxWait time.Duration
	// MaxBodyBytes bounds the request body read for the fingerprint
	// (default 8 MiB, under the idem server's default request limit); a
	// larger body gets 413 payload_too_large.
	MaxBodyBytes int64
	// MaxStoredBytes is the largest response (body plus stored headers)
	// stored for replay (default 1 MiB, the tenant's default
	// max_response_bytes); a larger one is sent but stored without its
	// body.
	MaxStoredBytes int
	// UnavailableRetryAfter is the Retry-After of the 503 sent when the idem
	// service cannot be reached (default 1 s).
	UnavailableRetryAfter time.Duration
	// Logger receives errors of the service; nil discards them.
	Logger *slog.Logger
	// ReplayCache configures the middleware's replay cache
	// (docs/frontdoor.md, "The replay cache"): a replay idem answered is
	// kept, and a retry of exactly that request (same key, route and
	// fingerprint document) within its replay window and MaxAge (default
	// 2 s) is answered from memory, byte for byte as idem's replay, without
	// a call. On by default; ReplayCache.Off turns it off. A tenant
	// deleted or disabled may still see its completed keys replayed for up
	// to MaxAge. The middleware's client must stay with one tenant (a
	// token function that switches tenants needs the cache off).
	ReplayCache frontdoor.ReplayCacheOptions
}

// Middleware returns middleware that protects handlers with the idem
// service reached through c. See the package doc for the behaviour.
func Middleware(c *client.Client, opts Options) func(http.Handler) http.Handler {
	if err := opts.Fingerprint.Validate(); err != nil {
		panic("idemhttp: " + err.Error())
	}
	if opts.MaxBodyBytes <= 0 {
		opts.MaxBodyBytes = 8 << 20
	}
	if opts.MaxStoredBytes <= 0 {
		opts.MaxStoredBytes = 1 << 20
	}
	if opts.UnavailableRetryAfter <= 0 {
		opts.UnavailableRetryAfter = time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Route == nil {
		opts.Route = frontdoor.Route
	}
	m := &middleware{c: c, opts: opts, cache: frontdoor.NewReplayCache(opts.ReplayCache)}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { m.serve(w, r, next) })
	}
}

type middleware struct {
	c     *client.Client
	opts  Options
	cache *frontdoor.ReplayCache // nil: off
}

func (m *middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	frontdoor.Serve(w, r, &door{m: m, next: next})
}

// door is the middleware's front door for one request (frontdoor.Door):
// its port is the idem API reached through the client.
type door struct {
	m    *middleware
	next http.Handler
}

func (d *door) Methods() frontdoor.Methods { return d.m.opts.Methods }

func (d *door) Pass(w http.ResponseWriter, r *http.Request) { d.next.ServeHTTP(w, r) }

func (d *door) Scope(r *http.Request) (string, bool, error) {
	if d.m.opts.Scope == nil {
		return "", false, nil
	}
	scope, err := d.m.opts.Scope(r)
	if err != nil {
		return "", true, frontdoor.Errorf(frontdoor.CodeInvalidKey, "the key cannot be scoped to the caller")
	}
	return scope, true, nil
}

func (d *door) ReadBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	body, err := frontdoor.ReadBody(w, r, d.m.opts.MaxBodyBytes)
	if err == nil {
		_ = r.Body.Close()
	}
	return body, err
}

func (d *door) Rules() frontdoor.Rules { return d.m.opts.Fingerprint }

func (d *door) Route(r *http.Request) string { return d.m.opts.Route(r) }

func (d *door) LeaseBound() bool { return true }

func (d *door) Store5xx() bool { return !d.m.opts.ReleaseServerErrors }

func (d *door) Refuse(w http.ResponseWriter, r *http.Request, err error) { frontdoor.Refuse(w, r, err) }

// ReplayCache is the middleware's cache; its client is of one tenant.
func (d *door) ReplayCache() (*frontdoor.ReplayCache, string) { return d.m.cache, "" }

func (d *door) CachedReplay(*http.Request) {}

// Claim claims the key through the client, as one claim with the caller's
// own wait (Prefer: wait=N): a held key is answered at once.
func (d *door) Claim(ctx context.Context, r *http.Request, req frontdoor.ClaimRequest) (*frontdoor.Claimed, error) {
	m := d.m
	if req.Attempt.Retry() {
		// The caller's retry of its own call (rule 9): the claim says so,
		// so idem's fleet retry budget counts the retries that arrive
		// through the middleware.
		ctx = client.WithAttempt(ctx, req.Attempt.Number, req.Attempt.Cause)
	}
	cr, err := m.c.Claim(ctx, req.Key, client.Request{
		Operation: req.Operation,
		Payload:   json.RawMessage(req.Document),
		Lease:     m.opts.Lease,
		Wait:      m.c.ServerWait(ctx, m.preferWait(r)),
	})
	if err != nil {
		c := &frontdoor.Claimed{}
		var ce *client.Error
		if errors.As(err, &ce) {
			c.WaitApplied = ce.WaitApplied
		}
		return c, m.claimError(r, err)
	}
	c := &frontdoor.Claimed{Key: req.Key, Token: cr.FencingToken, Attempt: cr.Attempt, Takeover: cr.Resumed,
		WaitApplied: cr.WaitApplied, Point: cr.RecoveryPoint, Data: cr.RecoveryData}
	if cr.Replayed {
		var resp client.Response
		if cr.Response != nil {
			resp = *cr.Response
		}
		c.Replay = &frontdoor.Stored{Status: resp.Status, Headers: resp.Headers, Body: resp.Body}
		c.ReplayLeft = cr.ReplayLeft
		return c, nil
	}
	c.Lease = m.opts.Lease
	if c.Lease <= 0 {
		// The lease the server granted, on the server's clock (its
		// answer's Date): this host's clock may be off by more than a
		// lease (client.Do's rule).
		c.Lease = cr.LeaseLeft
		if c.Lease <= 0 {
			c.Lease = time.Until(cr.LeaseExpiresAt)
		}
		if cr.LeaseExpiresAt.IsZero() || c.Lease <= 0 {
			c.Lease = 30 * time.Second
		}
	}
	return c, nil
}

// Checkpoint renews the lease, saving the last recovery point again
// (client.RenewalPoint before there is one).
func (d *door) Checkpoint(ctx context.Context, c *frontdoor.Claimed) error {
	point := c.Point
	if point == "" {
		point = client.RenewalPoint
	}
	_, err := d.m.c.Checkpoint(ctx, c.Key, c.Token, point, c.Data, d.m.opts.Lease)
	if errors.Is(err, client.ErrLeaseLost) || errors.Is(err, client.ErrKeyNotFound) {
		return fmt.Errorf("%w: %w", frontdoor.ErrLeaseGone, err)
	}
	return err
}

// Complete stores the answer; a failure is logged (the answer is sent all
// the same), except the tenant's max_response_bytes refusing it, which the
// flow answers by storing it without its body.
func (d *door) Complete(ctx context.Context, c *frontdoor.Claimed, s frontdoor.Stored) error {
	err := d.m.c.CompleteNoRecord(ctx, c.Key, c.Token, client.Response{Status: s.Status, Headers: s.Headers, Body: s.Body})
	if errors.Is(err, client.ErrPayloadTooLarge) {
		return fmt.Errorf("%w: %w", frontdoor.ErrResponseTooLarge, err)
	}
	if err != nil {
		d.m.opts.Logger.ErrorContext(ctx, "idem: the handler ran but its response was not stored", "error", err)
	}
	return err
}

// Release releases the key; a failure leaves it to become an orphan.
func (d *door) Release(ctx context.Context, c *frontdoor.Claimed) error {
	if err := d.m.c.Release(ctx, c.Key, c.Token); err != nil && !errors.Is(err, client.ErrKeyNotFound) {
		return err
	}
	return nil
}

// Run runs the handler once, buffering its whole answer. A caller gone
// before it started releases the key: nothing ran, and the retry runs it.
func (d *door) Run(ctx context.Context, r *http.Request, _ *frontdoor.Claimed, body []byte) (*frontdoor.Answer, error) {
	if r.Context().Err() != nil {
		return nil, &frontdoor.Unanswered{Release: true, Problem: d.m.unavailable(nil)}
	}
	rec := newRecorder()
	r2 := r.WithContext(ctx)
	r2.Body = io.NopCloser(bytes.NewReader(body))
	r2.ContentLength = int64(len(body))
	d.next.ServeHTTP(rec, r2)
	size := d.m.size(rec)
	return &frontdoor.Answer{
		Status: rec.status, Header: rec.header, Body: rec.body.Bytes(),
		Stored: frontdoor.StoredHeaders(rec.header, d.m.opts.Headers),
		// A 5xx that ReleaseServerErrors releases is released whatever its
		// size.
		TooLarge:      size > d.m.opts.MaxStoredBytes,
		NotStoredNote: "response of " + strconv.Itoa(size) + " bytes not stored",
	}, nil
}

// preferWait returns the wait to ask the server for: the request's
// Prefer: wait=N within MaxWait, zero without one or when MaxWait is
// negative.
func (m *middleware) preferWait(r *http.Request) time.Duration {
	n := frontdoor.PreferWait(r.Header.Values("Prefer"))
	if n <= 0 || m.opts.MaxWait < 0 {
		return 0
	}
	wait := time.Duration(min(n, 24*3600)) * time.Second
	if m.opts.MaxWait > 0 {
		wait = min(wait, m.opts.MaxWait)
	}
	return wait
}

// size is what storing rec whole takes: its body and stored headers.
func (m *middleware) size(rec *recorder) int {
	size := rec.body.Len()
	for k, v := range frontdoor.StoredHeaders(rec.header, m.opts.Headers) {
		size += len(k) + len(v)
	}
	return size
}

// claimError is the answer to a claim that did not let the handler run. A
// retryable one whose idem answer said the fleet retry budget is spent
// says so too (rule 9): the client does not retry a 409 request_in_flight
// itself, so its signal reaches the caller only this way.
func (m *middleware) claimError(r *http.Request, err error) *frontdoor.Error {
	e := m.refusal(r, err)
	if ce := (*client.Error)(nil); errors.As(err, &ce) && ce.FleetBudgetSpent {
		frontdoor.SpentBudget(e, true)
	}
	return e
}

// refusal maps err, the error of a claim, to the front door's refusal.
func (m *middleware) refusal(r *http.Request, err error) *frontdoor.Error {
	if fb := (*client.FleetBudgetError)(nil); errors.As(err, &fb) {
		// idem's fleet retry budget stopped the claim (rule 9). Refused as
		// the caller's retry, with no failure before it: 429
		// retry_budget_exhausted. Stopped after a failure of the claim's
		// own (its retry refused, or the failure saying the budget is
		// spent): that failure's answer, which names the cause, saying the
		// budget is spent. Either way nothing was claimed.
		if fb.Original == nil {
			var ra time.Duration
			if fb.Refusal != nil {
				ra = fb.Refusal.RetryAfter
			}
			return frontdoor.BudgetRefusal(ra)
		}
		return frontdoor.SpentBudget(m.claimError(r, fb.Original), true)
	}
	var ce *client.Error
	errors.As(err, &ce)
	switch {
	case ce != nil && ce.Code == client.CodeRetryBudgetExhausted:
		// A refusal the client did not wrap (a first attempt is never
		// refused; kept for a server that refuses one all the same).
		return frontdoor.BudgetRefusal(ce.RetryAfter)
	case errors.Is(err, client.ErrRequestInFlight):
		e := frontdoor.Errorf(frontdoor.CodeRequestInFlight, "a request with this idempotency key is being processed; retry later")
		if ce != nil {
			e.RetryAfter = ce.RetryAfter
		}
		return e
	case ce != nil && (ce.Code == client.CodeOutcomeUnknown || ce.Code == client.CodeOutcomeReview):
		// idem's completer holds the key (rule 8): 409 request_in_flight
		// with its Retry-After while it finds out what the first request
		// did, 409 outcome_review (not retryable) once it gave up. Never
		// the retryable 503: idem is up and answered.
		return frontdoor.Held(frontdoor.Code(ce.Code), ce.RetryAfter)
	case errors.Is(err, client.ErrFingerprintMismatch):
		return &frontdoor.Error{Code: frontdoor.CodeFingerprintMismatch, Detail: frontdoor.MismatchDetail}
	case errors.Is(err, client.ErrPayloadTooLarge):
		// idem's request limit (IDEM_MAX_BODY_BYTES) is under MaxBodyBytes:
		// a retry cannot succeed, so not the retryable 503.
		return frontdoor.Errorf(frontdoor.CodePayloadTooLarge,
			"the request body is too large for the idempotency service to fingerprint")
	case errors.Is(err, client.ErrInvalidKey):
		return frontdoor.Errorf(frontdoor.CodeInvalidKey, "%s", ce.Detail)
	case errors.Is(err, client.ErrStorageQuotaExceeded):
		// idem is up and refused the new key: a 503 store_unavailable
		// would have the caller retry what cannot succeed until the
		// tenant's usage falls.
		return frontdoor.Errorf(frontdoor.CodeStorageQuotaExceeded, "%s", frontdoor.StorageQuotaDetail)
	case errors.Is(err, client.ErrTenantUnknown):
		// The middleware's tenant does not exist or is disabled: idem is up
		// and refused, and no retry succeeds until an operator enables the
		// tenant, so not the retryable 503 (issue 21, hole 2's class).
		m.opts.Logger.ErrorContext(r.Context(), "idem: the idempotency service refused the middleware's tenant (it does not exist or is disabled)", "error", err)
		return frontdoor.Errorf(frontdoor.CodeTenantUnknown, "%s", frontdoor.TenantUnknownDetail)
	case errors.Is(err, client.ErrUnauthenticated) || errors.Is(err, client.ErrForbidden):
		// idem refused the middleware's own token (expired, signed with a
		// rotated secret, of a deleted tenant, or without keys:write). That
		// is a fault of this service's credentials, not of the caller's
		// request, and a rotation fixes it: fail closed with the retryable
		// 503 (nothing was claimed, so the retry with the same key is safe),
		// never a 401 or 403 that would blame the caller's own credentials.
		m.opts.Logger.ErrorContext(r.Context(), "idem: the idempotency service refused the middleware's token (check its expiry, tenant and the keys:write scope); failing closed", "error", err)
		return m.unavailable(ce)
	case ce != nil && ce.Code == client.CodeInvalidRequest && len(ce.Fields) > 0 && isDocumentField(ce.Fields[0].Field):
		// The body is not I-JSON: idem refused the fingerprint document
		// (request.body…), the one place that rule is checked.
		return &frontdoor.Error{Code: frontdoor.CodeInvalidRequest,
			Detail: "the request body cannot be fingerprinted: " + ce.Fields[0].Field + " " + ce.Fields[0].Message,
			Fields: []frontdoor.FieldError{{Field: "body", Message: ce.Fields[0].Message}}}
	case errors.Is(err, client.ErrInvalidRequest):
		// idem refused the claim itself (an operation label from
		// Options.Route it does not accept, say): the same claim is refused
		// again, so not the retryable 503, which would have the caller
		// retry what cannot succeed.
		m.opts.Logger.ErrorContext(r.Context(), "idem: the idempotency service refused the claim", "error", err)
		e := frontdoor.Errorf(frontdoor.CodeInvalidRequest, "the idempotency service refused the claim of this request: %s", ce.Detail)
		for _, f := range ce.Fields {
			e.Fields = append(e.Fields, frontdoor.FieldError{Field: f.Field, Message: f.Message})
		}
		return e
	default:
		if r.Context().Err() == nil {
			m.opts.Logger.ErrorContext(r.Context(), "idem: the idempotency service is unavailable; failing closed", "error", err)
		}
		return m.unavailable(ce)
	}
}

// unavailable is the retryable 503 store_unavailable (fail
// closed), with Retry-After the longer of UnavailableRetryAfter and idem's
// own hint (ce may be nil).
func (m *middleware) unavailable(ce *client.Error) *frontdoor.Error {
	e := frontdoor.Errorf(frontdoor.CodeStoreUnavailable, "the request was not processed; retry later with the same idempotency key")
	e.RetryAfter = m.opts.UnavailableRetryAfter
	if ce != nil && ce.RetryAfter > e.RetryAfter {
		e.RetryAfter = ce.RetryAfter
	}
	return e
}

// isDocumentField reports whether a field error of idem's claim answer
// names the fingerprint document the middleware sent (request or a member
// of it), not something else of the claim.
func isDocumentField(field string) bool {
	return field == "request" || strings.HasPrefix(field, "request.") || strings.HasPrefix(field, "request[")
}

// recorder buffers a handler's whole response.
type recorder struct {
	header http.Header
	status int
	body   bytes.Buffer
	wrote  bool
}

func newRecorder() *recorder { return &recorder{header: http.Header{}, status: http.StatusOK} }

func (rec *recorder) Header() http.Header { return rec.header }

// WriteHeader records the final status. An informational 1xx (103 Early
// Hints, say; not 101, which is final as in net/http) is dropped: it is not
// the answer, a replay could not repeat it, and taking it as the status
// sent and stored a status the handler never answered.
func (rec *recorder) WriteHeader(status int) {
	if rec.wrote || (status >= 100 && status <= 199 && status != http.StatusSwitchingProtocols) {
		return
	}
	rec.wrote = true
	rec.status = status
}

func (rec *recorder) Write(b []byte) (int, error) {
	if !rec.wrote {
		rec.WriteHeader(http.StatusOK)
	}
	return rec.body.Write(b)
}
