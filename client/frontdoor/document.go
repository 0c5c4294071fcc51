package frontdoor

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"unicode/utf8"
)

// MaxOperationBytes is the longest operation label idem accepts; Operation
// cuts longer labels.
const MaxOperationBytes = 128

// Operation returns the operation label of a request: METHOD + " " +
// route, where route is the route pattern when the framework knows it and
// the path otherwise, never the query. A label over 128 bytes is cut at a
// character boundary.
func Operation(method, route string) string {
	op := strings.ToUpper(method) + " " + route
	if len(op) <= MaxOperationBytes {
		return op
	}
	cut := MaxOperationBytes
	for cut > 0 && !utf8.RuneStart(op[cut]) {
		cut--
	}
	return op[:cut]
}

// Route returns the route of r for Operation: the net/http ServeMux pattern
// that matched (r.Pattern, without its method and host) when there is one,
// PathRoute otherwise.
func Route(r *http.Request) string {
	p := r.Pattern
	if p == "" {
		return PathRoute(r)
	}
	if i := strings.IndexAny(p, " \t"); i >= 0 {
		p = strings.TrimLeft(p[i:], " \t")
	}
	if i := strings.IndexByte(p, '/'); i > 0 {
		p = p[i:] // drop the host
	}
	return p
}

// PathRoute returns the route of a request no route pattern names, for
// Operation (testvectors/frontdoor/operations.json, the same in every front
// door): its decoded path (r.URL.Path), the label front doors have always
// built, as long as that is valid label text; else the path as it arrived
// on the request line (Target), escapes kept, every byte outside printable
// ASCII escaped (EscapeLabel). The decoded path of /pay%00, /pay%0A or
// /pay%FF holds a control character or bytes that are not UTF-8, which idem
// refuses in an operation (idem.ValidateOperation): such a request would
// never be served, and the answer used to be a retryable 503. Every path
// whose decoding is valid label text keeps its label, so a key claimed
// before an upgrade still matches its retry after it (one on /pay%FF, sent
// as U+FFFD before, answers 422 instead: never a second run).
func PathRoute(r *http.Request) string {
	if p := r.URL.Path; ValidLabelText(p) {
		return p
	}
	path, _ := Target(r)
	return EscapeLabel(path)
}

// ValidLabelText reports whether s may stand in an operation label as it
// is: valid UTF-8 without control characters (C0, DEL, C1), the rule of
// idem.ValidateOperation (text.go) but for the length, which Operation
// cuts.
func ValidLabelText(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if r < 0x20 || r >= 0x7F && r <= 0x9F {
			return false
		}
	}
	return true
}

// EscapeLabel returns a raw path with every byte outside printable ASCII
// (0x21-0x7E) written as %XX in upper-case hex and every other byte, '%'
// included, as it is: valid label text for any bytes, and the path a
// request line carried stays recognisable.
func EscapeLabel(path string) string {
	const hexDigits = "0123456789ABCDEF"
	var b strings.Builder
	for i := 0; i < len(path); i++ {
		c := path[i]
		if c < 0x21 || c > 0x7E {
			b.WriteByte('%')
			b.WriteByte(hexDigits[c>>4])
			b.WriteByte(hexDigits[c&15])
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}

// Target returns the path and the raw query of r as they arrived on the
// request line (r.RequestURI): escapes kept as sent, nothing escaped that
// came raw, bytes outside ASCII as they are (Document reads them as
// Latin-1), as the Python and Node.js front doors see them
// (testvectors/frontdoor/targets.json). r.URL.EscapedPath would re-escape
// what Go's URL rules escape (a raw '{', '|', '"' or byte outside ASCII,
// and then every other character it escapes): one request would have one
// fingerprint here and another there, and a raw byte and its escape would
// look alike. An absolute-form target loses its scheme and authority; a
// request built in a program (no RequestURI) takes r.URL.
func Target(r *http.Request) (path, query string) {
	t := r.RequestURI
	if t == "" || t == "*" {
		return r.URL.EscapedPath(), r.URL.RawQuery
	}
	if !strings.HasPrefix(t, "/") {
		if _, rest, ok := strings.Cut(t, "://"); ok {
			t = "/"
			if i := strings.IndexAny(rest, "/?"); i >= 0 {
				t = rest[i:]
			}
		}
	}
	path, query, _ = strings.Cut(t, "?")
	if path == "" {
		path = "/"
	}
	return path, query
}

// Parts are the pieces of a request the fingerprint document is built
// from.
type Parts struct {
	// Path is the request path as received (as on the request line, see
	// Target), without the query: one key used on /orders/7 and on /orders/8
	// names two different requests.
	Path string
	// Query is the raw query string (without "?"), "" when none.
	Query string
	// ContentType is the Content-Type header.
	ContentType string
	// Body is the raw request body.
	Body []byte
	// Header is the request's header, read only for Rules.Headers.
	Header http.Header
}

// Rules are per-route fingerprint options.
type Rules struct {
	// Exclude lists RFC 6901 JSON pointers removed from a JSON body before
	// fingerprinting (volatile fields such as a client timestamp). A
	// pointer that matches nothing is ignored.
	Exclude []string `json:"exclude,omitempty" yaml:"exclude"`
	// Headers names request headers whose values take part: they are added
	// as "headers": {lowercased name: value}, several values joined with
	// ", ", absent headers left out.
	Headers []string `json:"headers,omitempty" yaml:"headers"`
}

// Validate checks the rules' pointers and header names.
func (r Rules) Validate() error {
	for _, p := range r.Exclude {
		if _, err := parsePointer(p); err != nil {
			return err
		}
	}
	for _, h := range r.Headers {
		if h == "" || strings.ContainsAny(h, " \t:") {
			return fmt.Errorf("fingerprint header %q is not a header name", h)
		}
	}
	return nil
}

// IsJSON reports whether a Content-Type names a JSON body:
// application/json or any */*+json, parameters ignored.
func IsJSON(contentType string) bool {
	mt, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		return false
	}
	if mt == "application/json" {
		return true
	}
	_, sub, ok := strings.Cut(mt, "/")
	return ok && strings.HasSuffix(sub, "+json")
}

// document is the fingerprint document (Document). Its members are in
// the order encoding/json gave the map it replaced (sorted), and a
// member is absent exactly when the map had none: the same bytes, without
// the map's allocations and key sort on every protected request
// (docs/benchmarks.md, issue 23; TestDocumentMatchesTheMapEncoding).
type document struct {
	Body       *json.RawMessage   `json:"body,omitempty"`
	BodySHA256 string             `json:"body_sha256,omitempty"`
	Headers    *map[string]string `json:"headers,omitempty"`
	Path       string             `json:"path"`
	Query      string             `json:"query"`
}

// Document returns the fingerprint document of a request:
//
//	{"path": <path>, "query": <raw query or "">, "body": <the JSON value>}
//
// for a non-empty JSON body (see IsJSON), else
//
//	{"path": <path>, "query": <raw query or "">, "body_sha256": <hex SHA-256 of the body bytes>}
//
// with the rules applied. Its fingerprint is idem.FingerprintJSON of the
// result; two requests that differ only in JSON key order, white space or
// number spelling have the same one.
//
// The JSON body is embedded as the caller sent it (exclusions cut out
// member by member, the rest left raw), so whoever fingerprints the
// document — idem.FingerprintJSON in the gateway, the idem server for
// idemhttp — sees duplicate member names, invalid UTF-8, lone surrogates
// and out-of-range numbers and refuses them with 400 invalid_request. The
// I-JSON rule lives there, once. Only JSON that is not well-formed gives
// CodeInvalidRequest here.
func Document(p Parts, rules Rules) (json.RawMessage, error) {
	// The query and header values are read as Latin-1 (each byte one
	// character, as the Python front door reads them): as bytes that are
	// not UTF-8 they would all become U+FFFD in the JSON document, and two
	// different requests would share a fingerprint.
	doc := document{Path: latin1Text(p.Path), Query: latin1Text(p.Query)}
	if len(p.Body) > 0 && IsJSON(p.ContentType) {
		if !json.Valid(p.Body) {
			return nil, &Error{Code: CodeInvalidRequest, Detail: "the JSON body is not well-formed JSON",
				Fields: []FieldError{{Field: "body", Message: "not well-formed JSON"}}}
		}
		body := json.RawMessage(bytes.TrimSpace(p.Body))
		for _, ptr := range rules.Exclude {
			toks, err := parsePointer(ptr)
			if err != nil {
				return nil, err
			}
			if body, err = removeRaw(body, toks); err != nil {
				return nil, Errorf(CodeInvalidRequest, "the JSON body cannot be read: %v", err)
			}
		}
		doc.Body = &body
	} else {
		sum := sha256.Sum256(p.Body)
		doc.BodySHA256 = hex.EncodeToString(sum[:])
	}
	if len(rules.Headers) > 0 {
		hs := map[string]string{}
		for _, name := range rules.Headers {
			if v := p.Header.Values(name); len(v) > 0 {
				hs[strings.ToLower(name)] = latin1Text(strings.Join(v, ", "))
			}
		}
		doc.Headers = &hs
	}
	out, err := json.Marshal(doc)
	if err != nil {
		return nil, Errorf(CodeInvalidRequest, "the fingerprint document cannot be built: %v", err)
	}
	return out, nil
}

// parsePointer splits an RFC 6901 JSON pointer into its unescaped tokens.
func parsePointer(p string) ([]string, error) {
	if p == "" {
		return nil, fmt.Errorf("JSON pointer is empty: the whole body cannot be excluded")
	}
	if p[0] != '/' {
		return nil, fmt.Errorf("JSON pointer %q does not start with '/'", p)
	}
	toks := strings.Split(p[1:], "/")
	for i, t := range toks {
		for j := 0; j < len(t); j++ {
			if t[j] == '~' && (j+1 == len(t) || (t[j+1] != '0' && t[j+1] != '1')) {
				return nil, fmt.Errorf("JSON pointer %q has a '~' not followed by 0 or 1", p)
			}
		}
		toks[i] = strings.ReplaceAll(strings.ReplaceAll(t, "~1", "/"), "~0", "~")
	}
	return toks, nil
}

// removeRaw returns the well-formed JSON value raw without the value at
// toks (raw itself when nothing matches). Every other member name and
// value is copied byte for byte, duplicates included, so removing a field
// repairs nothing the I-JSON check must see. A member name that appears
// twice on the pointer's way is followed (or removed) in both places.
func removeRaw(raw json.RawMessage, toks []string) (json.RawMessage, error) {
	raw = bytes.TrimSpace(raw)
	if len(toks) == 0 || len(raw) == 0 || (raw[0] != '{' && raw[0] != '[') {
		return raw, nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	if _, err := dec.Token(); err != nil { // '{' or '['
		return nil, err
	}
	var out bytes.Buffer
	out.WriteByte(raw[0])
	first := true
	for i := 0; dec.More(); i++ {
		var name json.RawMessage // raw member name with its quotes, nil in an array
		match := false
		if raw[0] == '{' {
			start := dec.InputOffset()
			tok, err := dec.Token()
			if err != nil {
				return nil, err
			}
			name = bytes.Trim(raw[start:dec.InputOffset()], " \t\r\n,")
			match = tok.(string) == toks[0]
		} else {
			match = strconv.Itoa(i) == toks[0]
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, err
		}
		if match && len(toks) == 1 {
			continue
		}
		if match {
			var err error
			if v, err = removeRaw(v, toks[1:]); err != nil {
				return nil, err
			}
		}
		if !first {
			out.WriteByte(',')
		}
		first = false
		if name != nil {
			out.Write(name)
			out.WriteByte(':')
		}
		out.Write(v)
	}
	if _, err := dec.Token(); err != nil { // '}' or ']'
		return nil, err
	}
	out.WriteByte(raw[len(raw)-1])
	return out.Bytes(), nil
}

// ReadBody reads the whole request body of a protected request, which the
// fingerprint and a replay-safe re-run both need, within limit bytes: a
// larger body is CodePayloadTooLarge, a body that cannot be read
// CodeInvalidRequest. The gateway and idemhttp answer these the same way.
func ReadBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, Errorf(CodePayloadTooLarge, "the request body is larger than %d bytes", mbe.Limit)
		}
		return nil, Errorf(CodeInvalidRequest, "the request body could not be read")
	}
	return body, nil
}
