package idem

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// checkIJSONReference is CheckIJSON as it was before it built paths only
// for errors: the oracle TestCheckIJSONMatchesReference compares it with.
func checkIJSONReference(doc []byte) error {
	s := ijsonRefScanner{data: doc}
	s.skipSpace()
	if err := s.value(""); err != nil {
		return err
	}
	s.skipSpace()
	if s.pos != len(s.data) {
		return s.syntax("")
	}
	return nil
}

// ijsonRefScanner is a minimal JSON reader that keeps what encoding/json
// throws away: the raw bytes of strings and every member name.
type ijsonRefScanner struct {
	data  []byte
	pos   int
	depth int
	name  strings.Builder
}

var errIJSONRefSyntax = errors.New("not JSON")

func (s *ijsonRefScanner) syntax(path string) error {
	return &IJSONError{Path: path, Reason: "is not valid JSON"}
}

func (s *ijsonRefScanner) skipSpace() {
	for s.pos < len(s.data) {
		switch s.data[s.pos] {
		case ' ', '\t', '\n', '\r':
			s.pos++
		default:
			return
		}
	}
}

func joinRefPath(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}

func (s *ijsonRefScanner) value(path string) error {
	if s.pos >= len(s.data) {
		return s.syntax(path)
	}
	switch c := s.data[s.pos]; {
	case c == '{':
		return s.object(path)
	case c == '[':
		return s.array(path)
	case c == '"':
		s.pos++
		return s.str(path, false)
	case c == '-' || c >= '0' && c <= '9':
		return s.number(path)
	default:
		for _, lit := range [...]string{"true", "false", "null"} {
			if strings.HasPrefix(string(s.data[s.pos:min(len(s.data), s.pos+5)]), lit) {
				s.pos += len(lit)
				return nil
			}
		}
		return s.syntax(path)
	}
}

func (s *ijsonRefScanner) enter(path string) error {
	s.depth++
	if s.depth > maxIJSONDepth {
		return &IJSONError{Path: path, Reason: fmt.Sprintf("is nested deeper than %d levels", maxIJSONDepth)}
	}
	return nil
}

// open enters an object or array whose opening byte is at s.pos and reports
// whether it is empty (closer follows at once; then it is already left).
func (s *ijsonRefScanner) open(path string, closer byte) (empty bool, err error) {
	if err := s.enter(path); err != nil {
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
// syntax error at path.
func (s *ijsonRefScanner) next(path string, closer byte) (done bool, err error) {
	s.skipSpace()
	if s.pos >= len(s.data) {
		return false, s.syntax(path)
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
	return false, s.syntax(path)
}

func (s *ijsonRefScanner) object(path string) error {
	if empty, err := s.open(path, '}'); empty || err != nil {
		return err
	}
	var seen map[string]struct{}
	for {
		s.skipSpace()
		if s.pos >= len(s.data) || s.data[s.pos] != '"' {
			return s.syntax(path)
		}
		s.pos++
		if err := s.str(path, true); err != nil {
			return err
		}
		name := s.name.String()
		if seen == nil {
			seen = make(map[string]struct{})
		}
		if _, dup := seen[name]; dup {
			return &IJSONError{Path: joinRefPath(path, name), Reason: "is given more than once; duplicate member names are not I-JSON"}
		}
		seen[name] = struct{}{}
		s.skipSpace()
		if s.pos >= len(s.data) || s.data[s.pos] != ':' {
			return s.syntax(path)
		}
		s.pos++
		s.skipSpace()
		if err := s.value(joinRefPath(path, name)); err != nil {
			return err
		}
		if done, err := s.next(path, '}'); done || err != nil {
			return err
		}
	}
}

func (s *ijsonRefScanner) array(path string) error {
	if empty, err := s.open(path, ']'); empty || err != nil {
		return err
	}
	for i := 0; ; i++ {
		s.skipSpace()
		if err := s.value(path + "[" + strconv.Itoa(i) + "]"); err != nil {
			return err
		}
		if done, err := s.next(path, ']'); done || err != nil {
			return err
		}
	}
}

func (s *ijsonRefScanner) number(path string) error {
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
		return s.syntax(path)
	}
	return nil
}

// str reads a string whose opening quote was consumed. A member name
// (isName) is reported against the object's path and its unescaped text is
// left in s.name; a string value is reported against its own path.
func (s *ijsonRefScanner) str(path string, isName bool) error {
	what := "is a string that"
	if isName {
		what = "has a member name that"
		s.name.Reset()
	}
	bad := func(reason string) error { return &IJSONError{Path: path, Reason: what + " " + reason} }
	for s.pos < len(s.data) {
		c := s.data[s.pos]
		switch {
		case c == '"':
			s.pos++
			return nil
		case c < 0x20:
			return s.syntax(path)
		case c == '\\':
			r, err := s.escape()
			if err != nil {
				return s.syntax(path)
			}
			if r < 0 {
				return bad(fmt.Sprintf("holds the lone UTF-16 surrogate \\u%04x", -r))
			}
			if isName {
				s.name.WriteRune(r)
			}
		case c < utf8.RuneSelf:
			s.pos++
			if isName {
				s.name.WriteByte(c)
			}
		default:
			r, size := utf8.DecodeRune(s.data[s.pos:])
			if r == utf8.RuneError && size == 1 {
				return bad(fmt.Sprintf("is not valid UTF-8 (byte 0x%02x at offset %d)", c, s.pos))
			}
			s.pos += size
			if isName {
				s.name.WriteRune(r)
			}
		}
	}
	return s.syntax(path)
}

// escape reads one escape sequence at s.pos (a backslash) and returns the
// rune it stands for, or minus the code unit of a lone surrogate.
func (s *ijsonRefScanner) escape() (rune, error) {
	if s.pos+1 >= len(s.data) {
		return 0, errIJSONRefSyntax
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
		return 0, errIJSONRefSyntax
	}
	u, ok := s.hex4()
	if !ok {
		return 0, errIJSONRefSyntax
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

func (s *ijsonRefScanner) hex4() (rune, bool) {
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
