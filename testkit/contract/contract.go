// Package contract checks live HTTP exchanges against idem's published
// contract, the OpenAPI document idem.OpenAPISpec (openapi.yaml), with
// kin-openapi's openapi3filter. It is what keeps the spec from drifting away
// from the code: every end-to-end request that goes through the transport
// is validated, and so is every response.
//
// Plug it into a test's HTTP client:
//
//	client := &http.Client{Transport: contract.Transport(t, http.DefaultTransport)}
//	resp, err := client.Post(srv.URL()+"/v1/keys/order-42/claim", "application/json", body)
//
// or, for a client that takes a transport option (the Go SDK in client/),
// hand it the same RoundTripper. The transport never changes an exchange; it
// reports mismatches with t.Errorf (safe from any goroutine), naming the
// method, path and status and the schema path that failed.
//
// The rules:
//
//   - A request the spec accepts must get a response the spec documents: its
//     status must be listed for the operation, and its headers
//     (X-Request-Id, Retry-After, Idempotent-Replayed where required) and
//     body must match the response schema.
//   - A request the spec refuses (an unknown field, a bad key, no bearer
//     token, …) is allowed — tests send them on purpose — but the server must
//     refuse it too, with a 4xx that itself matches the spec. A 2xx or 5xx
//     answer to it is a mismatch.
//   - A problem+json body's type must be /docs/errors#<code> and its status
//     must be the HTTP status.
//   - A path the spec does not know must be answered 404 or 405, except the
//     static sites under /docs/ and /dashboard/, which pass unchecked.
package contract

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/legacy"

	"github.com/idem-dev/idem"
)

// unchecked reports whether path belongs to the static sites the server
// serves beside the API; the OpenAPI document does not describe them.
func unchecked(path string) bool {
	for _, p := range []string{"/docs/", "/dashboard/"} {
		if strings.HasPrefix(path, p) || path+"/" == p {
			return true
		}
	}
	return false
}

// Transport returns an http.RoundTripper that sends every request through
// base (http.DefaultTransport when nil) and validates the request and its
// response against idem.OpenAPISpec, reporting each mismatch with t.Errorf.
// It fails the test at once (t.Fatalf) when the spec itself does not load.
func Transport(t testing.TB, base http.RoundTripper) http.RoundTripper {
	t.Helper()
	router, err := newRouter(idem.OpenAPISpec)
	if err != nil {
		t.Fatalf("contract: %v", err)
	}
	if base == nil {
		base = http.DefaultTransport
	}
	return &transport{t: t, base: base, router: router}
}

// newRouter loads and validates the OpenAPI document and routes by path
// only: the document's servers entry is relative and tests listen on
// 127.0.0.1 with a random port.
func newRouter(spec []byte) (routers.Router, error) {
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromData(spec)
	if err != nil {
		return nil, fmt.Errorf("load openapi.yaml: %w", err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		return nil, fmt.Errorf("openapi.yaml is not a valid OpenAPI document: %w", err)
	}
	doc.Servers = nil
	router, err := legacy.NewRouter(doc)
	if err != nil {
		return nil, fmt.Errorf("build openapi router: %w", err)
	}
	return router, nil
}

// findRoute routes on the escaped path, so that a key holding an escaped
// slash ("a%2Fb") stays one path segment, then unescapes the parameters.
func findRoute(router routers.Router, req *http.Request) (*routers.Route, map[string]string, error) {
	escaped := *req
	u := *req.URL
	u.Path = req.URL.EscapedPath()
	u.RawPath = ""
	escaped.URL = &u
	route, params, err := router.FindRoute(&escaped)
	if err != nil {
		return nil, nil, err
	}
	for name, v := range params {
		plain, err := url.PathUnescape(v)
		if err != nil {
			return nil, nil, fmt.Errorf("path parameter %s: %w", name, err)
		}
		params[name] = plain
	}
	return route, params, nil
}

type transport struct {
	t      testing.TB
	base   http.RoundTripper
	router routers.Router
}

// RoundTrip implements http.RoundTripper.
func (tr *transport) RoundTrip(req *http.Request) (*http.Response, error) {
	reqBody, err := readBody(&req.Body)
	if err != nil {
		return nil, fmt.Errorf("contract: read request body: %w", err)
	}
	if req.GetBody == nil && reqBody != nil {
		req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(reqBody)), nil }
	}

	// Validate a copy, so that the request sent is byte for byte the caller's.
	vreq := req.Clone(req.Context())
	vreq.Body = io.NopCloser(bytes.NewReader(reqBody))
	route, pathParams, routeErr := findRoute(tr.router, vreq)
	var input *openapi3filter.RequestValidationInput
	var reqErr error
	if routeErr == nil {
		input = &openapi3filter.RequestValidationInput{
			Request:    vreq,
			PathParams: pathParams,
			Route:      route,
			Options: &openapi3filter.Options{
				MultiError:         true,
				AuthenticationFunc: bearerAuth,
			},
		}
		reqErr = openapi3filter.ValidateRequest(req.Context(), input)
	}

	resp, err := tr.base.RoundTrip(req)
	if err != nil {
		return resp, err
	}
	respBody, err := readBody(&resp.Body)
	if err != nil {
		return nil, fmt.Errorf("contract: read response body: %w", err)
	}

	exchange := fmt.Sprintf("%s %s -> %d", req.Method, req.URL.RequestURI(), resp.StatusCode)
	for _, problem := range check(req, routeErr, input, reqErr, resp, respBody) {
		tr.t.Errorf("contract: %s: %s", exchange, problem)
	}
	return resp, nil
}

// check returns every way the exchange breaks the contract.
func check(req *http.Request, routeErr error, input *openapi3filter.RequestValidationInput, reqErr error, resp *http.Response, body []byte) []string {
	var problems []string
	if routeErr != nil {
		if unchecked(req.URL.Path) {
			return nil
		}
		var re *routers.RouteError
		if errors.As(routeErr, &re) && (resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusMethodNotAllowed) {
			return nil
		}
		return []string{fmt.Sprintf("the spec has no such operation (%v) but the server answered %d, not 404/405", routeErr, resp.StatusCode)}
	}

	if reqErr != nil && (resp.StatusCode < 400 || resp.StatusCode >= 500) {
		problems = append(problems, fmt.Sprintf("the spec refuses this request but the server answered %d (want a 4xx); request errors:\n%v", resp.StatusCode, indent(reqErr)))
	}

	respInput := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: input,
		Status:                 resp.StatusCode,
		Header:                 resp.Header,
		Body:                   io.NopCloser(bytes.NewReader(body)),
		Options: &openapi3filter.Options{
			MultiError:            true,
			IncludeResponseStatus: true,
		},
	}
	if err := openapi3filter.ValidateResponse(context.Background(), respInput); err != nil {
		problems = append(problems, fmt.Sprintf("the response does not match the spec:\n%v\nbody: %s", indent(err), clip(body)))
	}
	problems = append(problems, checkProblem(resp, body)...)
	return problems
}

// checkProblem checks what the schema cannot: a problem's type names its
// code and its status is the HTTP status.
func checkProblem(resp *http.Response, body []byte) []string {
	mt, _, err := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if err != nil || mt != "application/problem+json" {
		if resp.StatusCode >= 400 {
			return []string{fmt.Sprintf("an error response must be application/problem+json, got %q", resp.Header.Get("Content-Type"))}
		}
		return nil
	}
	var p struct {
		Type   string `json:"type"`
		Status int    `json:"status"`
		Code   string `json:"code"`
	}
	if err := json.Unmarshal(body, &p); err != nil {
		return []string{fmt.Sprintf("problem body is not JSON: %v", err)}
	}
	var problems []string
	if want := "/docs/errors#" + p.Code; p.Type != want {
		problems = append(problems, fmt.Sprintf("problem type is %q, want %q", p.Type, want))
	}
	if p.Status != resp.StatusCode {
		problems = append(problems, fmt.Sprintf("problem status is %d but the HTTP status is %d", p.Status, resp.StatusCode))
	}
	return problems
}

// bearerAuth accepts any request that carries a bearer token: whether the
// token is good is the server's business, and a 401 is a documented answer.
func bearerAuth(_ context.Context, in *openapi3filter.AuthenticationInput) error {
	h := in.RequestValidationInput.Request.Header.Get("Authorization")
	scheme, token, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(token) == "" {
		return errors.New("no bearer token in the Authorization header")
	}
	return nil
}

// readBody reads *body in full and replaces it with a fresh reader over the
// same bytes. A nil or http.NoBody body gives nil.
func readBody(body *io.ReadCloser) ([]byte, error) {
	if *body == nil || *body == http.NoBody {
		return nil, nil
	}
	b, err := io.ReadAll(*body)
	_ = (*body).Close()
	if err != nil {
		return nil, err
	}
	*body = io.NopCloser(bytes.NewReader(b))
	return b, nil
}

func indent(err error) string {
	return "    " + strings.ReplaceAll(strings.TrimSpace(err.Error()), "\n", "\n    ")
}

func clip(b []byte) string {
	const max = 2000
	if len(b) > max {
		return string(b[:max]) + "…"
	}
	return string(b)
}
