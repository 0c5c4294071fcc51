package frontdoor

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
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
// the path otherwise.
func Route(r *http.Request) string {
	p := r.Pattern
	if p == "" {
		return r.URL.Path
	}
	if i := strings.IndexAny(p, " \t"); i >= 0 {
		p = strings.TrimLeft(p[i:], " \t")
	}
	if i := strings.IndexByte(p, '/'); i > 0 {
		p = p[i:] // drop the host
	}
	return p
}

// Parts are the pieces of a request the fingerprint document is built
// from.
type Parts struct {
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

// Document returns the fingerprint document of a request:
//
//	{"query": <raw query or "">, "body": <the JSON value>}
//
// for a non-empty JSON body (see IsJSON), else
//
//	{"query": <raw query or "">, "body_sha256": <hex SHA-256 of the body bytes>}
//
// with the rules applied. Its fingerprint is idem.FingerprintJSON of the
// result; two requests that differ only in JSON key order, white space or
// number spelling have the same one. A JSON body that is not I-JSON
// (malformed, invalid UTF-8, lone surrogates, duplicate member names,
// numbers outside the double range) gives CodeInvalidRequest.
func Document(p Parts, rules Rules) (json.RawMessage, error) {
	doc := map[string]any{"query": p.Query}
	if len(p.Body) > 0 && IsJSON(p.ContentType) {
		if err := CheckIJSON(p.Body); err != nil {
			return nil, err
		}
		if len(rules.Exclude) == 0 {
			doc["body"] = json.RawMessage(p.Body)
		} else {
			dec := json.NewDecoder(bytes.NewReader(p.Body))
			dec.UseNumber()
			var v any
			if err := dec.Decode(&v); err != nil {
				return nil, Errorf(CodeInvalidRequest, "the JSON body cannot be read: %v", err)
			}
			for _, ptr := range rules.Exclude {
				toks, err := parsePointer(ptr)
				if err != nil {
					return nil, err
				}
				v = removePointer(v, toks)
			}
			doc["body"] = v
		}
	} else {
		sum := sha256.Sum256(p.Body)
		doc["body_sha256"] = hex.EncodeToString(sum[:])
	}
	if len(rules.Headers) > 0 {
		hs := map[string]string{}
		for _, name := range rules.Headers {
			if v := p.Header.Values(name); len(v) > 0 {
				hs[strings.ToLower(name)] = strings.Join(v, ", ")
			}
		}
		doc["headers"] = hs
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

// removePointer removes the value at toks from v and returns v.
func removePointer(v any, toks []string) any {
	if len(toks) == 0 {
		return v
	}
	last := len(toks) == 1
	switch c := v.(type) {
	case map[string]any:
		child, ok := c[toks[0]]
		if !ok {
			return v
		}
		if last {
			delete(c, toks[0])
		} else {
			c[toks[0]] = removePointer(child, toks[1:])
		}
	case []any:
		i, err := strconv.Atoi(toks[0])
		if err != nil || i < 0 || i >= len(c) || (len(toks[0]) > 1 && toks[0][0] == '0') {
			return v
		}
		if last {
			return append(c[:i:i], c[i+1:]...)
		}
		c[i] = removePointer(c[i], toks[1:])
	}
	return v
}

// CheckIJSON checks that b is one I-JSON value (RFC 7493): well-formed JSON,
// valid UTF-8, no lone surrogate escapes, no duplicate member names in an
// object, every number inside the IEEE 754 double range. Go's decoder
// silently repairs or accepts all of these, and two parsers that repair
// differently would fingerprint one body two ways.
func CheckIJSON(b []byte) error {
	if !utf8.Valid(b) {
		return Errorf(CodeInvalidRequest, "the JSON body is not valid UTF-8")
	}
	s := &scanner{b: b}
	s.ws()
	if err := s.value(0); err != nil {
		return err
	}
	s.ws()
	if s.i != len(b) {
		return s.fail("data after the JSON value")
	}
	return nil
}

const maxJSONDepth = 1000

type scanner struct {
	b []byte
	i int
}

func (s *scanner) fail(what string) error {
	return &Error{Code: CodeInvalidRequest, Detail: fmt.Sprintf("the JSON body is not I-JSON: %s at byte %d", what, s.i),
		Fields: []FieldError{{Field: "body", Message: what}}}
}

func (s *scanner) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

func (s *scanner) value(depth int) error {
	if depth > maxJSONDepth {
		return s.fail("nesting too deep")
	}
	if s.i >= len(s.b) {
		return s.fail("unexpected end")
	}
	switch c := s.b[s.i]; {
	case c == '{':
		s.i++
		seen := map[string]bool{}
		s.ws()
		if s.i < len(s.b) && s.b[s.i] == '}' {
			s.i++
			return nil
		}
		for {
			s.ws()
			if s.i >= len(s.b) || s.b[s.i] != '"' {
				return s.fail("expected a member name")
			}
			name, err := s.str()
			if err != nil {
				return err
			}
			if seen[name] {
				return s.fail(fmt.Sprintf("duplicate member name %q", name))
			}
			seen[name] = true
			s.ws()
			if s.i >= len(s.b) || s.b[s.i] != ':' {
				return s.fail("expected ':'")
			}
			s.i++
			s.ws()
			if err := s.value(depth + 1); err != nil {
				return err
			}
			s.ws()
			if s.i < len(s.b) && s.b[s.i] == ',' {
				s.i++
				continue
			}
			if s.i < len(s.b) && s.b[s.i] == '}' {
				s.i++
				return nil
			}
			return s.fail("expected ',' or '}'")
		}
	case c == '[':
		s.i++
		s.ws()
		if s.i < len(s.b) && s.b[s.i] == ']' {
			s.i++
			return nil
		}
		for {
			s.ws()
			if err := s.value(depth + 1); err != nil {
				return err
			}
			s.ws()
			if s.i < len(s.b) && s.b[s.i] == ',' {
				s.i++
				continue
			}
			if s.i < len(s.b) && s.b[s.i] == ']' {
				s.i++
				return nil
			}
			return s.fail("expected ',' or ']'")
		}
	case c == '"':
		_, err := s.str()
		return err
	case c == '-' || c >= '0' && c <= '9':
		return s.number()
	default:
		for _, lit := range []string{"true", "false", "null"} {
			if bytes.HasPrefix(s.b[s.i:], []byte(lit)) {
				s.i += len(lit)
				return nil
			}
		}
		return s.fail("unexpected character")
	}
}

// str reads a string at s.i (on its opening quote) and returns it decoded.
func (s *scanner) str() (string, error) {
	s.i++
	var out strings.Builder
	for s.i < len(s.b) {
		c := s.b[s.i]
		switch {
		case c == '"':
			s.i++
			return out.String(), nil
		case c < 0x20:
			return "", s.fail("control character in a string")
		case c == '\\':
			if s.i+1 >= len(s.b) {
				return "", s.fail("unexpected end")
			}
			e := s.b[s.i+1]
			s.i += 2
			switch e {
			case '"', '\\', '/':
				out.WriteByte(e)
			case 'b':
				out.WriteByte('\b')
			case 'f':
				out.WriteByte('\f')
			case 'n':
				out.WriteByte('\n')
			case 'r':
				out.WriteByte('\r')
			case 't':
				out.WriteByte('\t')
			case 'u':
				r, ok := s.hex4()
				if !ok {
					return "", s.fail("bad \\u escape")
				}
				switch {
				case r >= 0xD800 && r <= 0xDBFF:
					if s.i+1 >= len(s.b) || s.b[s.i] != '\\' || s.b[s.i+1] != 'u' {
						return "", s.fail("lone surrogate")
					}
					s.i += 2
					lo, ok := s.hex4()
					if !ok || lo < 0xDC00 || lo > 0xDFFF {
						return "", s.fail("lone surrogate")
					}
					out.WriteRune(0x10000 + (r-0xD800)<<10 + (lo - 0xDC00))
				case r >= 0xDC00 && r <= 0xDFFF:
					return "", s.fail("lone surrogate")
				default:
					out.WriteRune(r)
				}
			default:
				return "", s.fail("bad escape")
			}
		default:
			out.WriteByte(c)
			s.i++
		}
	}
	return "", s.fail("unterminated string")
}

func (s *scanner) hex4() (rune, bool) {
	if s.i+4 > len(s.b) {
		return 0, false
	}
	n, err := strconv.ParseUint(string(s.b[s.i:s.i+4]), 16, 32)
	if err != nil {
		return 0, false
	}
	s.i += 4
	return rune(n), true
}

func (s *scanner) number() error {
	start := s.i
	if s.b[s.i] == '-' {
		s.i++
	}
	digits := func() int {
		n := 0
		for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
			s.i++
			n++
		}
		return n
	}
	intStart := s.i
	n := digits()
	if n == 0 || (n > 1 && s.b[intStart] == '0') {
		return s.fail("malformed number")
	}
	if s.i < len(s.b) && s.b[s.i] == '.' {
		s.i++
		if digits() == 0 {
			return s.fail("malformed number")
		}
	}
	if s.i < len(s.b) && (s.b[s.i] == 'e' || s.b[s.i] == 'E') {
		s.i++
		if s.i < len(s.b) && (s.b[s.i] == '+' || s.b[s.i] == '-') {
			s.i++
		}
		if digits() == 0 {
			return s.fail("malformed number")
		}
	}
	if _, err := strconv.ParseFloat(string(s.b[start:s.i]), 64); err != nil {
		return s.fail("number outside the IEEE 754 double range")
	}
	return nil
}
