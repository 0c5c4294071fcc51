// Package idemhttp is net/http middleware (chi-compatible) that gives an
// existing Go HTTP API Stripe-style Idempotency-Key semantics by calling the
// idem service through a *client.Client.
//
// For a request of an unsafe method (POST, PUT, PATCH, DELETE) that carries
// an Idempotency-Key header the middleware:
//
//   - claims the key (prefixed by Options.Scope, if set) with an operation
//     label of method plus route (the chi route pattern or the ServeMux
//     pattern when known, the path otherwise) and a fingerprint
//     "sha256:<hex>" over the method, the path with its query and the
//     SHA-256 of the body;
//   - on a fresh claim or takeover runs the handler, buffering its whole
//     response, completes the key with the status, the allowlisted headers
//     (Options.Headers, default DefaultHeaders: Content-Type, Content-Language,
//     Content-Disposition, Content-Encoding, Location, ETag, Last-Modified,
//     Cache-Control) and the body, and only then sends the response — so a
//     client never sees an answer the service has not stored. The lease is
//     renewed while a slow handler runs (client.Do's lease keeper);
//   - on a completed key replays the stored response verbatim with
//     Idempotent-Replayed: true, without running the handler;
//   - answers 409 problem+json with Retry-After while another request with
//     the key is in flight, and 422 problem+json when the key was used with
//     another request (fingerprint or operation);
//   - answers 400 problem+json for a malformed key.
//
// Choices (documented defaults, each an option):
//
//   - A request of a method in Options.Methods (default POST and PATCH)
//     without the header gets 400 problem+json (code
//     idempotency_key_missing): an unsafe request that cannot be retried
//     safely is refused rather than run unprotected. Options.AllowMissingKey
//     passes such requests to the handler instead. Unsafe methods outside
//     Options.Methods (PUT, DELETE by default) are protected when they carry
//     the header and passed through when they do not. Safe methods (GET,
//     HEAD, OPTIONS, TRACE) are never claimed.
//   - A handler answer of 5xx is not stored: the key is released so that the
//     client's retry runs the handler again (a 5xx says the handler failed,
//     we assume before its side effect). A handler that can fail after a
//     side effect should answer 2xx/4xx, or set Options.StoreServerErrors to
//     store 5xx answers and replay them (Stripe's behaviour).
//   - A handler that panics leaves the claim to expire into an orphan that
//     operators can see; the panic propagates.
//   - When the idem service cannot be reached or refuses the middleware's
//     own credentials, the middleware fails closed: 503 problem+json with
//     Retry-After (Options.UnavailableRetryAfter, default 2 s) and the
//     handler does not run.
//   - If completing fails after the handler ran (the lease was lost, the
//     response is over the tenant's max_response_bytes, the service went
//     away), the handler's response is still sent — the work is done and
//     the caller should know — and the error is logged.
//
// Streaming handlers (http.Flusher, hijacking) are not supported: the
// response is buffered whole.
package idemhttp

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/idem-dev/idem/client"
)

// HeaderKey is the request header that carries the idempotency key, and
// HeaderReplayed the response header set on replays.
const (
	HeaderKey      = "Idempotency-Key"
	HeaderReplayed = "Idempotent-Replayed"
)

// Options configure Middleware. Zero values take the documented defaults.
type Options struct {
	// Methods are the methods that require a key (default POST, PATCH).
	Methods []string
	// AllowMissingKey passes a request of a required method that has no key
	// to the handler instead of answering 400.
	AllowMissingKey bool
	// Headers are the response headers stored and replayed (canonical
	// names); nil takes DefaultHeaders.
	Headers []string
	// StoreServerErrors stores and replays 5xx answers instead of releasing
	// the key.
	StoreServerErrors bool
	// Scope returns a prefix that keeps the keys of different callers of
	// your API apart (e.g. the authenticated account id): keys are claimed
	// as client.Key(scope, key). Without it every caller shares one key
	// space in the idem tenant. An error answers 400.
	Scope func(r *http.Request) (string, error)
	// Operation returns the operation label; default method + " " + route.
	Operation func(r *http.Request) string
	// Lease is the lease asked for; zero takes the tenant's default.
	Lease time.Duration
	// MaxBodyBytes bounds the request body read for the fingerprint
	// (default 10 MiB); a larger body gets 413.
	MaxBodyBytes int64
	// UnavailableRetryAfter is the Retry-After of the 503 sent when the idem
	// service cannot be reached (default 2 s).
	UnavailableRetryAfter time.Duration
	// Logger receives errors of the service; nil discards them.
	Logger *slog.Logger
}

// DefaultHeaders returns the response headers stored and replayed by
// default. Set-Cookie and other per-caller headers are left out on purpose.
func DefaultHeaders() []string {
	return []string{"Content-Type", "Content-Language", "Content-Disposition", "Content-Encoding", "Location", "Etag", "Last-Modified", "Cache-Control"}
}

// Middleware returns middleware that protects handlers with the idem
// service reached through c. See the package doc for the behaviour.
func Middleware(c *client.Client, opts Options) func(http.Handler) http.Handler {
	if len(opts.Methods) == 0 {
		opts.Methods = []string{http.MethodPost, http.MethodPatch}
	}
	if opts.Headers == nil {
		opts.Headers = DefaultHeaders()
	}
	if opts.MaxBodyBytes <= 0 {
		opts.MaxBodyBytes = 10 << 20
	}
	if opts.UnavailableRetryAfter <= 0 {
		opts.UnavailableRetryAfter = 2 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
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

func safeMethod(m string) bool {
	switch m {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return true
	}
	return false
}

func (m *middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	if safeMethod(r.Method) {
		next.ServeHTTP(w, r)
		return
	}
	raw := r.Header.Get(HeaderKey)
	if raw == "" {
		if m.opts.AllowMissingKey || !slices.Contains(m.opts.Methods, r.Method) {
			next.ServeHTTP(w, r)
			return
		}
		writeProblem(w, http.StatusBadRequest, "idempotency_key_missing", "Idempotency key missing",
			fmt.Sprintf("%s %s requires an %s header", r.Method, r.URL.Path, HeaderKey), false, 0)
		return
	}
	if err := client.ValidateKey(raw); err != nil {
		writeProblem(w, http.StatusBadRequest, string(client.CodeInvalidKey), "Invalid idempotency key", keyDetail(err), false, 0)
		return
	}
	key := raw
	if m.opts.Scope != nil {
		scope, err := m.opts.Scope(r)
		if err == nil {
			key, err = client.Key(scope, raw)
		}
		if err != nil {
			writeProblem(w, http.StatusBadRequest, string(client.CodeInvalidKey), "Invalid idempotency key", "the key cannot be scoped to the caller", false, 0)
			return
		}
	}

	body, err := io.ReadAll(io.LimitReader(r.Body, m.opts.MaxBodyBytes+1))
	if err != nil {
		writeProblem(w, http.StatusBadRequest, "invalid_request", "Unreadable body", "the request body could not be read", false, 0)
		return
	}
	if int64(len(body)) > m.opts.MaxBodyBytes {
		writeProblem(w, http.StatusRequestEntityTooLarge, string(client.CodePayloadTooLarge), "Payload too large", "the request body is too large", false, 0)
		return
	}
	_ = r.Body.Close()

	req := client.Request{
		Operation:   m.operation(r),
		Fingerprint: fingerprint(r, body),
		Lease:       m.opts.Lease,
		NoWait:      true,
	}
	var (
		rec     *recorder
		ran     bool
		errNoSE = errors.New("handler answered 5xx")
	)
	res, err := m.c.Do(r.Context(), key, req, func(ctx context.Context, claim *client.Claim) (client.Response, error) {
		ran = true
		rec = newRecorder()
		r2 := r.WithContext(ctx)
		r2.Body = io.NopCloser(bytes.NewReader(body))
		r2.ContentLength = int64(len(body))
		next.ServeHTTP(rec, r2)
		if rec.status >= 500 && !m.opts.StoreServerErrors {
			return client.Response{}, fmt.Errorf("%w: %w", client.ErrNoSideEffect, errNoSE)
		}
		return client.Response{Status: rec.status, Headers: m.selectHeaders(rec.header), Body: rec.body.Bytes()}, nil
	})
	switch {
	case err == nil && res.Replayed:
		writeStored(w, res.Response)
	case ran:
		if err != nil && !errors.Is(err, errNoSE) {
			m.opts.Logger.ErrorContext(r.Context(), "idem: the handler ran but its response was not stored", "error", err)
		}
		rec.flushTo(w)
	default:
		m.writeClaimError(w, r, err)
	}
}

func (m *middleware) writeClaimError(w http.ResponseWriter, r *http.Request, err error) {
	var e *client.Error
	switch {
	case errors.Is(err, client.ErrRequestInFlight):
		ra := time.Second
		if errors.As(err, &e) && e.RetryAfter > 0 {
			ra = e.RetryAfter
		}
		writeProblem(w, http.StatusConflict, string(client.CodeRequestInFlight), "Request in flight",
			"a request with this idempotency key is being processed; retry later", true, ra)
	case errors.Is(err, client.ErrFingerprintMismatch):
		writeProblem(w, http.StatusUnprocessableEntity, string(client.CodeFingerprintMismatch), "Idempotency key reused",
			"this idempotency key was used with a different request", false, 0)
	case errors.Is(err, client.ErrInvalidKey):
		writeProblem(w, http.StatusBadRequest, string(client.CodeInvalidKey), "Invalid idempotency key", keyDetail(err), false, 0)
	case r.Context().Err() != nil:
		// The caller went away; nobody reads this answer.
		writeProblem(w, http.StatusServiceUnavailable, "request_cancelled", "Request cancelled", "the request was cancelled", true, m.opts.UnavailableRetryAfter)
	default:
		m.opts.Logger.ErrorContext(r.Context(), "idem: the idempotency service is unavailable; failing closed", "error", err)
		ra := m.opts.UnavailableRetryAfter
		if errors.As(err, &e) && e.RetryAfter > ra {
			ra = e.RetryAfter
		}
		writeProblem(w, http.StatusServiceUnavailable, "idempotency_unavailable", "Idempotency service unavailable",
			"the request was not processed; retry later with the same idempotency key", true, ra)
	}
}

func keyDetail(err error) string {
	var e *client.Error
	if errors.As(err, &e) && e.Detail != "" {
		return "Idempotency-Key: " + e.Detail
	}
	return "Idempotency-Key must be 1-255 printable ASCII characters"
}

// operation returns method + route, at most 128 bytes.
func (m *middleware) operation(r *http.Request) string {
	var op string
	if m.opts.Operation != nil {
		op = m.opts.Operation(r)
	} else {
		route := r.URL.Path
		if rc := chi.RouteContext(r.Context()); rc != nil && rc.RoutePattern() != "" {
			route = rc.RoutePattern()
		} else if r.Pattern != "" {
			route = r.Pattern
		}
		op = r.Method + " " + route
	}
	if len(op) > 128 {
		op = op[:128]
	}
	return op
}

// fingerprint is sha256 over method, path with query, and the body digest.
func fingerprint(r *http.Request, body []byte) string {
	bd := sha256.Sum256(body)
	h := sha256.New()
	fmt.Fprintf(h, "%s\n%s\n%s", r.Method, r.URL.RequestURI(), hex.EncodeToString(bd[:]))
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

func (m *middleware) selectHeaders(h http.Header) map[string]string {
	out := map[string]string{}
	for _, name := range m.opts.Headers {
		if v := h.Values(name); len(v) > 0 {
			out[http.CanonicalHeaderKey(name)] = strings.Join(v, ", ")
		}
	}
	return out
}

// writeStored replays a stored response, marked with HeaderReplayed.
func writeStored(w http.ResponseWriter, resp client.Response) {
	for k, v := range resp.Headers {
		w.Header().Set(k, v)
	}
	w.Header().Set(HeaderReplayed, "true")
	w.Header().Set("Content-Length", strconv.Itoa(len(resp.Body)))
	status := resp.Status
	if status == 0 {
		status = http.StatusOK
	}
	w.WriteHeader(status)
	_, _ = w.Write(resp.Body)
}

func writeProblem(w http.ResponseWriter, status int, code, title, detail string, retryable bool, retryAfter time.Duration) {
	if retryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(retryAfter.Seconds()))))
	}
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{
		"type": "urn:idem:idemhttp:" + code, "title": title, "status": status, "detail": detail, "code": code, "retryable": retryable,
	})
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

func (rec *recorder) WriteHeader(status int) {
	if rec.wrote {
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
