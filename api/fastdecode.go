package api

import (
	"encoding/json"
	"strconv"
	"unicode/utf8"

	"github.com/idem-dev/idem"
)

// The bodies of the two hot-path requests (claim, complete) are read first
// by a small strict reader that takes only the plain form of each: members
// named exactly as the contract names them, strings without escapes,
// integers without fraction or exponent, no null. For such a body it fills
// the request exactly as encoding/json would (FuzzFastDecode compares them);
// anything else — an unknown or differently cased member, an escape, a
// null, a number encoding/json would refuse, data after the object — makes
// it give up, and decodeBody decodes with encoding/json as for every other
// endpoint, so every error message comes from one place. The checks that
// follow decoding (I-JSON, nulls, validate) run on both paths.

// fastDecoder is a request body with such a reader; decodeFast reports
// whether it read body, and leaves the request unchanged when it did not.
type fastDecoder interface {
	decodeFast(body []byte) bool
}

func (c *claimRequest) decodeFast(body []byte) bool {
	var out claimRequest
	r := jreader{b: body}
	ok := r.object(func(name string) bool {
		switch name {
		case "operation":
			s, ok := r.str()
			out.Operation = s
			return ok
		case "fingerprint":
			s, ok := r.str()
			out.Fingerprint = &s
			return ok
		case "request":
			raw, ok := r.raw()
			out.Request = raw
			return ok
		case "lease_seconds":
			n, ok := r.int()
			out.LeaseSeconds = int(n)
			return ok
		case "attempt_id":
			s, ok := r.str()
			out.AttemptID = &s
			return ok
		case "wait_seconds":
			n, ok := r.int()
			w := int(n)
			out.WaitSeconds = &w
			return ok
		}
		return false
	})
	if !ok || !r.end() {
		return false
	}
	*c = out
	return true
}

func (c *completeRequest) decodeFast(body []byte) bool {
	var out completeRequest
	r := jreader{b: body}
	ok := r.object(func(name string) bool {
		switch name {
		case "fencing_token":
			n, ok := r.int()
			out.FencingToken = &n
			return ok
		case "response":
			if out.Response == nil {
				out.Response = new(responseInput)
			}
			in := out.Response
			return r.object(func(name string) bool {
				switch name {
				case "status":
					n, ok := r.int()
					st := int(n)
					in.Status = &st
					return ok
				case "headers":
					if in.Headers == nil {
						in.Headers = map[string]string{}
					}
					return r.object(func(name string) bool {
						v, ok := r.str()
						in.Headers[name] = v
						return ok
					})
				case "body":
					raw, ok := r.raw()
					in.Body = raw
					return ok
				case "body_encoding":
					s, ok := r.str()
					in.BodyEncoding = s
					return ok
				}
				return false
			})
		}
		return false
	})
	if !ok || !r.end() {
		return false
	}
	*c = out
	return true
}

// jreader reads the plain JSON decodeFast takes; each method reports false
// where that form ends, without saying why.
type jreader struct {
	b []byte
	i int
}

func (r *jreader) space() {
	for r.i < len(r.b) {
		switch r.b[r.i] {
		case ' ', '\t', '\n', '\r':
			r.i++
		default:
			return
		}
	}
}

// next skips white space and consumes c.
func (r *jreader) next(c byte) bool {
	r.space()
	if r.i < len(r.b) && r.b[r.i] == c {
		r.i++
		return true
	}
	return false
}

// end reports whether only white space is left.
func (r *jreader) end() bool {
	r.space()
	return r.i == len(r.b)
}

// object reads an object, calling member for the value of each member
// (its name a plain string, see str).
func (r *jreader) object(member func(name string) bool) bool {
	if !r.next('{') {
		return false
	}
	if r.next('}') {
		return true
	}
	for {
		name, ok := r.str()
		if !ok || !r.next(':') || !member(name) {
			return false
		}
		if r.next('}') {
			return true
		}
		if !r.next(',') {
			return false
		}
	}
}

// str reads a string of printable ASCII without escapes: what it holds is
// what it decodes to.
func (r *jreader) str() (string, bool) {
	if !r.next('"') {
		return "", false
	}
	start := r.i
	for ; r.i < len(r.b); r.i++ {
		switch c := r.b[r.i]; {
		case c == '"':
			s := string(r.b[start:r.i])
			r.i++
			return s, true
		case c < 0x20 || c == '\\' || c >= utf8.RuneSelf:
			return "", false
		}
	}
	return "", false
}

// int reads an integer of at most 18 digits (no fraction, no exponent, no
// leading zero), which fits any Go int on 64 bits.
func (r *jreader) int() (int64, bool) {
	r.space()
	start := r.i
	if r.i < len(r.b) && r.b[r.i] == '-' {
		r.i++
	}
	digits := r.i
	for r.i < len(r.b) && r.b[r.i] >= '0' && r.b[r.i] <= '9' {
		r.i++
	}
	n := r.i - digits
	if n == 0 || n > 18 || n > 1 && r.b[digits] == '0' {
		return 0, false
	}
	if r.i < len(r.b) {
		switch r.b[r.i] {
		case '.', 'e', 'E':
			return 0, false
		}
	}
	v, err := strconv.ParseInt(string(r.b[start:r.i]), 10, 64)
	return v, err == nil
}

// raw reads any JSON value but null and returns its bytes (a
// json.RawMessage, as encoding/json keeps it: the value without the white
// space around it).
func (r *jreader) raw() (json.RawMessage, bool) {
	r.space()
	start := r.i
	if r.i < len(r.b) && r.b[r.i] == 'n' {
		return nil, false
	}
	if !r.skip(0) {
		return nil, false
	}
	return json.RawMessage(r.b[start:r.i]), true
}

// maxFastDepth bounds the nesting skip follows; deeper values are left to
// encoding/json.
const maxFastDepth = 64

// skip consumes one JSON value of any kind, checking its syntax fully
// (strings with every escape, numbers by the JSON grammar).
func (r *jreader) skip(depth int) bool {
	if depth > maxFastDepth {
		return false
	}
	r.space()
	if r.i >= len(r.b) {
		return false
	}
	switch c := r.b[r.i]; {
	case c == '{':
		r.i++
		if r.next('}') {
			return true
		}
		for {
			r.space()
			if !r.skipString() || !r.next(':') || !r.skip(depth+1) {
				return false
			}
			if r.next('}') {
				return true
			}
			if !r.next(',') {
				return false
			}
		}
	case c == '[':
		r.i++
		if r.next(']') {
			return true
		}
		for {
			if !r.skip(depth + 1) {
				return false
			}
			if r.next(']') {
				return true
			}
			if !r.next(',') {
				return false
			}
		}
	case c == '"':
		return r.skipString()
	case c == '-' || c >= '0' && c <= '9':
		return r.skipNumber()
	}
	for _, lit := range []string{"true", "false", "null"} {
		if len(r.b)-r.i >= len(lit) && string(r.b[r.i:r.i+len(lit)]) == lit {
			r.i += len(lit)
			return true
		}
	}
	return false
}

// skipString consumes a string at r.i: no control character, escapes
// among \" \\ \/ \b \f \n \r \t and \u with four hex digits. (Invalid UTF-8
// passes, as it does encoding/json's syntax check; the I-JSON check after
// decoding refuses it.)
func (r *jreader) skipString() bool {
	if r.i >= len(r.b) || r.b[r.i] != '"' {
		return false
	}
	for r.i++; r.i < len(r.b); r.i++ {
		switch c := r.b[r.i]; {
		case c == '"':
			r.i++
			return true
		case c < 0x20:
			return false
		case c == '\\':
			r.i++
			if r.i >= len(r.b) {
				return false
			}
			switch r.b[r.i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				if len(r.b)-r.i < 5 {
					return false
				}
				for _, h := range r.b[r.i+1 : r.i+5] {
					if !('0' <= h && h <= '9' || 'a' <= h && h <= 'f' || 'A' <= h && h <= 'F') {
						return false
					}
				}
				r.i += 4
			default:
				return false
			}
		}
	}
	return false
}

// skipNumber consumes -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func (r *jreader) skipNumber() bool {
	n := idem.JSONNumberLen(r.b[r.i:])
	r.i += n
	return n > 0
}

// plainString decodes a JSON string token whose escapes are among \" \\ \/
// \b \f \n \r \t and whose text is valid UTF-8, as json.Unmarshal would;
// false for anything else (\u escapes included), left to json.Unmarshal.
func plainString(tok []byte) (string, bool) {
	if len(tok) < 2 || tok[0] != '"' || tok[len(tok)-1] != '"' {
		return "", false
	}
	in := tok[1 : len(tok)-1]
	out := make([]byte, 0, len(in))
	for i := 0; i < len(in); i++ {
		c := in[i]
		switch {
		case c == '"' || c < 0x20:
			return "", false
		case c != '\\':
			out = append(out, c)
			continue
		}
		i++
		if i == len(in) {
			return "", false
		}
		switch in[i] {
		case '"', '\\', '/':
			out = append(out, in[i])
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		default:
			return "", false
		}
	}
	if !utf8.Valid(out) {
		return "", false
	}
	return string(out), true
}
