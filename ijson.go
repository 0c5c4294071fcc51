package idem

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"
)

// IJSONError says where and why a JSON document is not I-JSON (RFC 7493),
// the input RFC 8785 canonicalization requires. encoding/json accepts such
// documents silently — it keeps the last of duplicate member names and
// replaces invalid UTF-8 and lone surrogates with U+FFFD — so two different
// payloads could otherwise share a fingerprint or be stored as something the
// caller did not send.
type IJSONError struct {
	// Path is the dotted path of the offending value or member, e.g.
	// "request.amount" or "items[2]"; "" for the document itself.
	Path string
	// Reason says what is wrong, e.g. `holds the member name "amount" twice`.
	Reason string
}

// Error implements error.
func (e *IJSONError) Error() string {
	if e.Path == "" {
		return "the JSON document " + e.Reason
	}
	return e.Path + " " + e.Reason
}

// maxIJSONDepth bounds nesting like encoding/json does, so a hostile
// document cannot exhaust the stack.
const maxIJSONDepth = 10000

// CheckIJSON reports whether doc is one I-JSON value (RFC 7493 §2.1-2.3): all
// text valid UTF-8, no escaped lone surrogate (\ud800 alone), no object with
// the same member name twice (compared after unescaping). It returns an
// *IJSONError naming the path of the first problem, or nil. A document that
// is not JSON at all is refused too (Path "", Reason "is not valid JSON"),
// but callers that must name syntax errors precisely decode first.
func CheckIJSON(doc []byte) error {
	s := ijsonScanners.Get().(*ijsonScanner)
	s.data = doc
	s.skipSpace()
	err := s.value()
	if err == nil {
		s.skipSpace()
		if s.pos != len(s.data) {
			err = s.syntax()
		}
	}
	if cap(s.names) <= maxPooledScratch {
		*s = ijsonScanner{names: s.names[:0], spans: s.spans[:0], path: s.path[:0]}
		ijsonScanners.Put(s)
	}
	return err
}

var ijsonScanners = sync.Pool{New: func() any { return new(ijsonScanner) }}

// ijsonScanner is a minimal JSON reader that keeps what encoding/json
// throws away: the raw bytes of strings and every member name. It knows
// where it is (path) but writes that out as a dotted path only for an
// error.
type ijsonScanner struct {
	data  []byte
	pos   int
	depth int
	// names holds the unescaped member names of the objects being read,
	// spans where each is in names, innermost object last.
	names []byte
	spans []nameSpan
	// path is where the scanner is: a member (the span of its name) or an
	// array element per level.
	path []pathStep
}

type nameSpan struct{ start, end int }

// pathStep is one level of ijsonScanner.path: the member named by span, or
// element index when index >= 0.
type pathStep struct {
	span  nameSpan
	index int
}

var errIJSONSyntax = errors.New("not JSON")

// pathString is the dotted path of where the scanner is, e.g. "request.x[2]".
func (s *ijsonScanner) pathString() string {
	var b strings.Builder
	for _, st := range s.path {
		if st.index >= 0 {
			b.WriteByte('[')
			b.WriteString(strconv.Itoa(st.index))
			b.WriteByte(']')
			continue
		}
		if b.Len() > 0 {
			b.WriteByte('.')
		}
		b.Write(s.names[st.span.start:st.span.end])
	}
	return b.String()
}

func (s *ijsonScanner) syntax() error {
	return &IJSONError{Path: s.pathString(), Reason: "is not valid JSON"}
}

func (s *ijsonScanner) skipSpace() {
	for s.pos < len(s.data) {
		switch s.data[s.pos] {
		case ' ', '\t', '\n', '\r':
			s.pos++
		default:
			return
		}
	}
}

func (s *ijsonScanner) value() error {
	if s.pos >= len(s.data) {
		return s.syntax()
	}
	switch c := s.data[s.pos]; {
	case c == '{':
		return s.object()
	case c == '[':
		return s.array()
	case c == '"':
		s.pos++
		return s.str(false)
	case c == '-' || c >= '0' && c <= '9':
		return s.number()
	default:
		for _, lit := range [...]string{"true", "false", "null"} {
			if bytes.HasPrefix(s.data[s.pos:], []byte(lit)) {
				s.pos += len(lit)
				return nil
			}
		}
		return s.syntax()
	}
}

func (s *ijsonScanner) enter() error {
	s.depth++
	if s.depth > maxIJSONDepth {
		return &IJSONError{Path: s.pathString(), Reason: fmt.Sprintf("is nested deeper than %d levels", maxIJSONDepth)}
	}
	return nil
}

// open enters an object or array whose opening byte is at s.pos and reports
// whether it is empty (closer follows at once; then it is already left).
func (s *ijsonScanner) open(closer byte) (empty bool, err error) {
	if err := s.enter(); err != nil {
		return false, err
	}
	s.pos++ // { or [
	s.skipSpace()
	if s.pos < len(s.data) && s.data[s.pos] == closer {
		s.pos++
		s.depth--
		return true, nil
	}
	return false, nil
}

// next reads what follows a member or element: a comma (more to come) or
// closer (done, and the object or array is left); anything else is a
// syntax error.
func (s *ijsonScanner) next(closer byte) (done bool, err error) {
	s.skipSpace()
	if s.pos >= len(s.data) {
		return false, s.syntax()
	}
	switch s.data[s.pos] {
	case ',':
		s.pos++
		return false, nil
	case closer:
		s.pos++
		s.depth--
		return true, nil
	}
	return false, s.syntax()
}

// maxLinearNames is how many member names an object's duplicate check
// compares one by one before it puts them in a map.
const maxLinearNames = 16

func (s *ijsonScanner) object() error {
	if empty, err := s.open('}'); empty || err != nil {
		return err
	}
	base, namesBase := len(s.spans), len(s.names)
	defer func() { s.spans, s.names = s.spans[:base], s.names[:namesBase] }()
	var seen map[string]struct{} // once the object has many members
	for {
		s.skipSpace()
		if s.pos >= len(s.data) || s.data[s.pos] != '"' {
			return s.syntax()
		}
		s.pos++
		sp := nameSpan{start: len(s.names)}
		if err := s.str(true); err != nil {
			return err
		}
		sp.end = len(s.names)
		name := s.names[sp.start:sp.end]
		dup := false
		if seen != nil {
			_, dup = seen[string(name)]
			seen[string(name)] = struct{}{}
		} else {
			for _, o := range s.spans[base:] {
				if bytes.Equal(s.names[o.start:o.end], name) {
					dup = true
					break
				}
			}
			if len(s.spans)-base == maxLinearNames {
				seen = make(map[string]struct{}, 2*maxLinearNames)
				for _, o := range s.spans[base:] {
					seen[string(s.names[o.start:o.end])] = struct{}{}
				}
				seen[string(name)] = struct{}{}
			}
		}
		s.spans = append(s.spans, sp)
		s.path = append(s.path, pathStep{span: sp, index: -1})
		if dup {
			return &IJSONError{Path: s.pathString(), Reason: "is given more than once; duplicate member names are not I-JSON"}
		}
		s.skipSpace()
		if s.pos >= len(s.data) || s.data[s.pos] != ':' {
			s.path = s.path[:len(s.path)-1]
			return s.syntax()
		}
		s.pos++
		s.skipSpace()
		if err := s.value(); err != nil {
			return err
		}
		s.path = s.path[:len(s.path)-1]
		if done, err := s.next('}'); done || err != nil {
			return err
		}
	}
}

func (s *ijsonScanner) array() error {
	if empty, err := s.open(']'); empty || err != nil {
		return err
	}
	for i := 0; ; i++ {
		s.skipSpace()
		s.path = append(s.path, pathStep{index: i})
		if err := s.value(); err != nil {
			return err
		}
		s.path = s.path[:len(s.path)-1]
		if done, err := s.next(']'); done || err != nil {
			return err
		}
	}
}

func (s *ijsonScanner) number() error {
	start := s.pos
	for s.pos < len(s.data) {
		c := s.data[s.pos]
		if c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E' || c >= '0' && c <= '9' {
			s.pos++
			continue
		}
		break
	}
	if !validJSONNumber(s.data[start:s.pos]) {
		return s.syntax()
	}
	return nil
}

// validJSONNumber reports whether b is a JSON number (RFC 8259 §6).
func validJSONNumber(b []byte) bool {
	n := JSONNumberLen(b)
	return n > 0 && n == len(b)
}

// JSONNumberLen returns the length of the JSON number (RFC 8259 §6) b
// starts with, or 0 when it starts with none: the one number grammar of
// the I-JSON check, the canonical form and the API's claim decoder.
func JSONNumberLen(b []byte) int {
	i := 0
	if i < len(b) && b[i] == '-' {
		i++
	}
	digits := func() int {
		n := 0
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
			n++
		}
		return n
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case digits() == 0:
		return 0
	}
	if i < len(b) && b[i] == '.' {
		i++
		if digits() == 0 {
			return 0
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if digits() == 0 {
			return 0
		}
	}
	return i
}

// str reads a string whose opening quote was consumed. A member name
// (isName) is reported against the object's path and its unescaped text is
// appended to s.names; a string value is reported against its own path.
func (s *ijsonScanner) str(isName bool) error {
	bad := func(reason string) error {
		what := "is a string that"
		if isName {
			what = "has a member name that"
		}
		return &IJSONError{Path: s.pathString(), Reason: what + " " + reason}
	}
	for s.pos < len(s.data) {
		// A run of plain ASCII.
		start := s.pos
		for s.pos < len(s.data) {
			c := s.data[s.pos]
			if c == '"' || c == '\\' || c < 0x20 || c >= utf8.RuneSelf {
				break
			}
			s.pos++
		}
		if isName {
			s.names = append(s.names, s.data[start:s.pos]...)
		}
		if s.pos >= len(s.data) {
			break
		}
		c := s.data[s.pos]
		switch {
		case c == '"':
			s.pos++
			return nil
		case c < 0x20:
			return s.syntax()
		case c == '\\':
			r, err := s.escape()
			if err != nil {
				return s.syntax()
			}
			if r < 0 {
				return bad(fmt.Sprintf("holds the lone UTF-16 surrogate \\u%04x", -r))
			}
			if isName {
				s.names = utf8.AppendRune(s.names, r)
			}
		default:
			r, size := utf8.DecodeRune(s.data[s.pos:])
			if r == utf8.RuneError && size == 1 {
				return bad(fmt.Sprintf("is not valid UTF-8 (byte 0x%02x at offset %d)", c, s.pos))
			}
			if isName {
				s.names = append(s.names, s.data[s.pos:s.pos+size]...)
			}
			s.pos += size
		}
	}
	return s.syntax()
}

// escape reads one escape sequence at s.pos (a backslash) and returns the
// rune it stands for, or minus the code unit of a lone surrogate.
func (s *ijsonScanner) escape() (rune, error) {
	if s.pos+1 >= len(s.data) {
		return 0, errIJSONSyntax
	}
	c := s.data[s.pos+1]
	s.pos += 2
	switch c {
	case '"', '\\', '/':
		return rune(c), nil
	case 'b':
		return '\b', nil
	case 'f':
		return '\f', nil
	case 'n':
		return '\n', nil
	case 'r':
		return '\r', nil
	case 't':
		return '\t', nil
	case 'u':
	default:
		return 0, errIJSONSyntax
	}
	u, ok := s.hex4()
	if !ok {
		return 0, errIJSONSyntax
	}
	switch {
	case u >= 0xDC00 && u <= 0xDFFF:
		return -u, nil
	case u >= 0xD800 && u <= 0xDBFF:
		if s.pos+1 < len(s.data) && s.data[s.pos] == '\\' && s.data[s.pos+1] == 'u' {
			save := s.pos
			s.pos += 2
			if lo, ok := s.hex4(); ok && lo >= 0xDC00 && lo <= 0xDFFF {
				return 0x10000 + (u-0xD800)<<10 + (lo - 0xDC00), nil
			}
			s.pos = save
		}
		return -u, nil
	}
	return u, nil
}

func (s *ijsonScanner) hex4() (rune, bool) {
	if s.pos+4 > len(s.data) {
		return 0, false
	}
	var r rune
	for _, c := range s.data[s.pos : s.pos+4] {
		var d byte
		switch {
		case c >= '0' && c <= '9':
			d = c - '0'
		case c >= 'a' && c <= 'f':
			d = c - 'a' + 10
		case c >= 'A' && c <= 'F':
			d = c - 'A' + 10
		default:
			return 0, false
		}
		r = r<<4 | rune(d)
	}
	s.pos += 4
	return r, true
}
