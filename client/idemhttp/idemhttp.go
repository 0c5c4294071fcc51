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
//     Idempotent-Replayed: true, without running the handler. Another
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
	m := &middleware{c: c, opts: opts}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { m.serve(w, r, next) })
	}
}

type middleware struct {
	c    *client.Client
	opts Options
}

// errReleased marks a 5xx answer released under ReleaseServerErrors.
var errReleased = errors.New("handler answered 5xx; key released")

// errCallerGone marks a claim released because the caller went away before
// the handler started.
var errCallerGone = errors.New("the caller went away before the handler started; key released")

func (m *middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	key, protected, err := m.opts.Methods.KeyFor(r)
	if err != nil {
		writeErr(w, r, err)
		return
	}
	if !protected {
		next.ServeHTTP(w, r)
		return
	}
	if m.opts.Scope != nil {
		scope, err := m.opts.Scope(r)
		if err != nil {
			frontdoor.WriteProblem(w, r, frontdoor.Errorf(frontdoor.CodeInvalidKey, "the key cannot be scoped to the caller"))
			return
		}
		if key, err = frontdoor.ScopedKey(scope, key); err != nil {
			writeErr(w, r, err)
			return
		}
	}
	body, err := frontdoor.ReadBody(w, r, m.opts.MaxBodyBytes)
	if err != nil {
		writeErr(w, r, err)
		return
	}
	_ = r.Body.Close()
	path, query := frontdoor.Target(r)
	doc, err := frontdoor.Document(frontdoor.Parts{
		Path: path, Query: query, ContentType: r.Header.Get("Content-Type"), Body: body, Header: r.Header,
	}, m.opts.Fingerprint)
	if err != nil {
		writeErr(w, r, err)
		return
	}

	req := client.Request{
		Operation: frontdoor.Operation(r.Method, m.opts.Route(r)),
		Payload:   json.RawMessage(doc),
		Lease:     m.opts.Lease,
		NoWait:    true,
		Wait:      m.preferWait(r),
	}
	// The caller going away stops the claim (and a Prefer: wait hold), but
	// not a handler that has started: its context is the request's values
	// without the request's cancellation from then on (as the gateway's
	// upstream call). A handler that stopped writing when the caller hung
	// up would otherwise return normally with part of its answer, and that
	// part would be stored and replayed as the complete answer; run to its
	// end, its whole answer is stored for the caller's retry.
	ctx, cancel := context.WithCancel(context.WithoutCancel(r.Context()))
	defer cancel()
	detach := context.AfterFunc(r.Context(), cancel)
	defer detach()
	var rec *recorder
	res, err := m.c.Do(ctx, key, req, func(ctx context.Context, _ *client.Claim) (client.Response, error) {
		if !detach() {
			// The caller went away before the handler started: nothing ran,
			// so the key is released and the retry runs the handler.
			return client.Response{}, fmt.Errorf("%w: %w", client.ErrNoSideEffect, errCallerGone)
		}
		rec = newRecorder()
		r2 := r.WithContext(ctx)
		r2.Body = io.NopCloser(bytes.NewReader(body))
		r2.ContentLength = int64(len(body))
		next.ServeHTTP(rec, r2)
		if !frontdoor.StorableStatus(rec.status) {
			// Sent as it is, stored as not replayable: the handler ran, so
			// the key must neither be released nor left in flight.
			return unstorable(rec.status), nil
		}
		if !frontdoor.StoreStatus(rec.status, !m.opts.ReleaseServerErrors) {
			return client.Response{}, fmt.Errorf("%w: %w", client.ErrNoSideEffect, errReleased)
		}
		return m.stored(rec), nil
	})
	applied := res.WaitApplied
	var ce *client.Error
	if errors.As(err, &ce) && ce.WaitApplied > 0 {
		applied = ce.WaitApplied
	}
	if applied > 0 {
		w.Header().Set(frontdoor.HeaderPreferenceApplied, "wait="+strconv.Itoa(int(applied/time.Second)))
	}
	if rec != nil && errors.Is(err, client.ErrPayloadTooLarge) && frontdoor.StorableStatus(rec.status) {
		// The tenant's max_response_bytes is under MaxStoredBytes: store the
		// answer without its body, as one over MaxStoredBytes, so that the
		// retry is 409 response_not_replayable instead of a second run
		// once the claim's lease is over.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), 10*time.Second)
		_, err = m.c.Complete(ctx, key, res.FencingToken, notReplayable(rec.status, m.size(rec)))
		cancel()
	}
	switch {
	case rec != nil:
		if err != nil && !errors.Is(err, errReleased) {
			m.opts.Logger.ErrorContext(r.Context(), "idem: the handler ran but its response was not stored", "error", err)
		}
		rec.flushTo(w)
	case err == nil:
		frontdoor.WriteReplay(w, r, res.Response.Status, res.Response.Headers, res.Response.Body)
	default:
		m.writeClaimError(w, r, err)
	}
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

// stored is the response to store for rec: the whole of it, or without its
// body (marked frontdoor.HeaderNotReplayable) when it is over the limit.
func (m *middleware) stored(rec *recorder) client.Response {
	if size := m.size(rec); size > m.opts.MaxStoredBytes {
		return notReplayable(rec.status, size)
	}
	return client.Response{Status: rec.status, Headers: frontdoor.StoredHeaders(rec.header, m.opts.Headers), Body: rec.body.Bytes()}
}

// size is what storing rec whole takes: its body and stored headers.
func (m *middleware) size(rec *recorder) int {
	size := rec.body.Len()
	for k, v := range frontdoor.StoredHeaders(rec.header, m.opts.Headers) {
		size += len(k) + len(v)
	}
	return size
}

// notReplayable is the response stored in place of one too large to keep:
// its status, no body, marked frontdoor.HeaderNotReplayable.
func notReplayable(status, size int) client.Response {
	return client.Response{Status: status, Headers: map[string]string{
		frontdoor.HeaderNotReplayable: "response of " + strconv.Itoa(size) + " bytes not stored",
	}}
}

// unstorable is the response stored in place of one whose status idem
// cannot store (frontdoor.StorableStatus, frontdoor.Unstorable).
func unstorable(status int) client.Response {
	s, h := frontdoor.Unstorable(status)
	return client.Response{Status: s, Headers: h}
}

func writeErr(w http.ResponseWriter, r *http.Request, err error) {
	var e *frontdoor.Error
	if !errors.As(err, &e) {
		e = frontdoor.Errorf(frontdoor.CodeInvalidRequest, "%v", err)
	}
	frontdoor.WriteProblem(w, r, e)
}

// writeClaimError answers a claim that did not let the handler run.
func (m *middleware) writeClaimError(w http.ResponseWriter, r *http.Request, err error) {
	var ce *client.Error
	errors.As(err, &ce)
	switch {
	case errors.Is(err, client.ErrRequestInFlight):
		e := frontdoor.Errorf(frontdoor.CodeRequestInFlight, "a request with this idempotency key is being processed; retry later")
		if ce != nil {
			e.RetryAfter = ce.RetryAfter
		}
		frontdoor.WriteProblem(w, r, e)
	case errors.Is(err, client.ErrFingerprintMismatch):
		frontdoor.WriteProblem(w, r, &frontdoor.Error{Code: frontdoor.CodeFingerprintMismatch, Detail: frontdoor.MismatchDetail})
	case errors.Is(err, client.ErrPayloadTooLarge):
		// idem's request limit (IDEM_MAX_BODY_BYTES) is under MaxBodyBytes:
		// a retry cannot succeed, so not the retryable 503.
		frontdoor.WriteProblem(w, r, frontdoor.Errorf(frontdoor.CodePayloadTooLarge,
			"the request body is too large for the idempotency service to fingerprint"))
	case errors.Is(err, client.ErrInvalidKey):
		frontdoor.WriteProblem(w, r, frontdoor.Errorf(frontdoor.CodeInvalidKey, "%s", ce.Detail))
	case errors.Is(err, client.ErrStorageQuotaExceeded):
		// idem is up and refused the new key: a 503 store_unavailable
		// would have the caller retry what cannot succeed until the
		// tenant's usage falls.
		frontdoor.WriteProblem(w, r, frontdoor.Errorf(frontdoor.CodeStorageQuotaExceeded, "%s", frontdoor.StorageQuotaDetail))
	case errors.Is(err, client.ErrTenantUnknown):
		// The middleware's tenant does not exist or is disabled: idem is up
		// and refused, and no retry succeeds until an operator enables the
		// tenant, so not the retryable 503 (issue 21, hole 2's class).
		m.opts.Logger.ErrorContext(r.Context(), "idem: the idempotency service refused the middleware's tenant (it does not exist or is disabled)", "error", err)
		frontdoor.WriteProblem(w, r, frontdoor.Errorf(frontdoor.CodeTenantUnknown, "%s", frontdoor.TenantUnknownDetail))
	case errors.Is(err, client.ErrUnauthenticated) || errors.Is(err, client.ErrForbidden):
		// idem refused the middleware's own token (expired, signed with a
		// rotated secret, of a deleted tenant, or without keys:write). That
		// is a fault of this service's credentials, not of the caller's
		// request, and a rotation fixes it: fail closed with the retryable
		// 503 (nothing was claimed, so the retry with the same key is safe),
		// never a 401 or 403 that would blame the caller's own credentials.
		m.opts.Logger.ErrorContext(r.Context(), "idem: the idempotency service refused the middleware's token (check its expiry, tenant and the keys:write scope); failing closed", "error", err)
		m.writeUnavailable(w, r, ce)
	case ce != nil && ce.Code == client.CodeInvalidRequest && len(ce.Fields) > 0 && isDocumentField(ce.Fields[0].Field):
		// The body is not I-JSON: idem refused the fingerprint document
		// (request.body…), the one place that rule is checked.
		frontdoor.WriteProblem(w, r, &frontdoor.Error{Code: frontdoor.CodeInvalidRequest,
			Detail: "the request body cannot be fingerprinted: " + ce.Fields[0].Field + " " + ce.Fields[0].Message,
			Fields: []frontdoor.FieldError{{Field: "body", Message: ce.Fields[0].Message}}})
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
		frontdoor.WriteProblem(w, r, e)
	default:
		if r.Context().Err() == nil {
			m.opts.Logger.ErrorContext(r.Context(), "idem: the idempotency service is unavailable; failing closed", "error", err)
		}
		m.writeUnavailable(w, r, ce)
	}
}

// writeUnavailable answers the retryable 503 store_unavailable (fail
// closed), with Retry-After the longer of UnavailableRetryAfter and idem's
// own hint (ce may be nil).
func (m *middleware) writeUnavailable(w http.ResponseWriter, r *http.Request, ce *client.Error) {
	e := frontdoor.Errorf(frontdoor.CodeStoreUnavailable, "the request was not processed; retry later with the same idempotency key")
	e.RetryAfter = m.opts.UnavailableRetryAfter
	if ce != nil && ce.RetryAfter > e.RetryAfter {
		e.RetryAfter = ce.RetryAfter
	}
	frontdoor.WriteProblem(w, r, e)
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

// flushTo sends the buffered response with all its headers.
func (rec *recorder) flushTo(w http.ResponseWriter) {
	for k, v := range rec.header {
		w.Header()[k] = v
	}
	w.Header().Set("Content-Length", strconv.Itoa(rec.body.Len()))
	w.WriteHeader(rec.status)
	_, _ = w.Write(rec.body.Bytes())
}
