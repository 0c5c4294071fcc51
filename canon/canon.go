// Package canon holds the server's fingerprint of a JSON value and the
// I-JSON check of what it stores: both on github.com/go-json-experiment/json
// (the encoding/json/v2 prototype), which canonicalises per RFC 8785
// (jsontext.Value.Canonicalize) and, by default, refuses what RFC 7493
// refuses (duplicate member names, invalid UTF-8, lone surrogates). The
// package adds only what the library does not say: a path to the problem
// in the form the API reports fields ("request.items[2].sku"), and the
// refusal of numbers outside the double range, which Canonicalize would
// round to ±1.7976931348623157e+308 and so give two different documents one
// fingerprint.
package canon

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/go-json-experiment/json/jsontext"
)

// FingerprintPrefix starts every fingerprint the server computes.
const FingerprintPrefix = "sha256:"

// Error says where and why a JSON document is not I-JSON (RFC 7493), the
// input RFC 8785 canonicalization requires, or not JSON at all.
// encoding/json accepts such documents silently — it keeps the last of
// duplicate member names and replaces invalid UTF-8 and lone surrogates
// with U+FFFD — so two different payloads could otherwise share a
// fingerprint or be stored as something the caller did not send.
type Error struct {
	// Path is the dotted path of the offending value or member, e.g.
	// "request.amount" or "items[2]"; "" for the document itself.
	Path string
	// Reason says what is wrong, e.g. "is given more than once; duplicate
	// member names are not I-JSON".
	Reason string
	// Err is the library's error, when it reported one.
	Err error
}

// Error implements error.
func (e *Error) Error() string {
	if e.Path == "" {
		return "the JSON document " + e.Reason
	}
	return e.Path + " " + e.Reason
}

// Unwrap returns the library's error.
func (e *Error) Unwrap() error { return e.Err }

// CheckIJSON reports whether doc is one I-JSON value (RFC 7493 §2.1-2.3):
// all text valid UTF-8, no escaped lone surrogate (\ud800 alone), no object
// with the same member name twice (compared after unescaping). It returns an
// *Error naming the path of the first problem, or nil. A document that is
// not JSON at all is refused too (Reason "is not valid JSON"), but callers
// that must name syntax errors precisely decode first. Numbers are not
// bounded here (I-JSON only advises against numbers beyond the double
// range); Fingerprint refuses them.
func CheckIJSON(doc []byte) error {
	if jsontext.Value(doc).IsValid() {
		return nil
	}
	return explain(doc, false)
}

// Fingerprint computes the server-side fingerprint of a JSON value:
// "sha256:" followed by the hex SHA-256 of its RFC 8785 (JCS) canonical
// form. Two documents that differ only in member order, white space or
// number spelling (1.0 vs 1) have the same fingerprint. It refuses what
// JSON refuses with an *Error.
func Fingerprint(doc []byte) (string, error) {
	bp := buffers.Get().(*[]byte)
	canon, err := appendCanonical((*bp)[:0], doc)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(canon)
	if cap(canon) <= maxPooled {
		*bp = canon
		buffers.Put(bp)
	}
	var fp [len(FingerprintPrefix) + 2*sha256.Size]byte
	copy(fp[:], FingerprintPrefix)
	hex.Encode(fp[len(FingerprintPrefix):], sum[:])
	return string(fp[:]), nil
}

// buffers holds Fingerprint's canonical forms between calls; maxPooled is
// the largest one kept.
var buffers = sync.Pool{New: func() any { return new([]byte) }}

const maxPooled = 64 << 10

// JSON returns the RFC 8785 JSON Canonicalization Scheme form of a JSON
// document: object members sorted by their UTF-16 code units, no
// insignificant white space, numbers in ECMAScript shortest form, strings
// with minimal escaping. The document must be I-JSON (see CheckIJSON) with
// every number within the double range: anything else is refused with an
// *Error rather than normalised, so two different documents never share a
// form.
func JSON(doc []byte) ([]byte, error) {
	return appendCanonical(make([]byte, 0, len(doc)), doc)
}

// maxDouble is how Canonicalize writes a number beyond the double range
// (it rounds to the largest double), and the largest double itself.
var maxDouble = []byte("1.7976931348623157e+308")

// appendCanonical appends the canonical form of doc to dst (the library
// canonicalises in place, so doc is copied first: it is the caller's).
func appendCanonical(dst, doc []byte) ([]byte, error) {
	v := jsontext.Value(append(dst, doc...))
	if err := v.Canonicalize(); err != nil {
		if e := explain(doc, true); e != nil {
			return dst, e
		}
		return dst, &Error{Reason: "is not valid JSON", Err: err}
	}
	// Rare, so checked again only when it shows: a number that overflowed
	// reads as the largest double.
	if bytes.Contains(v[len(dst):], maxDouble) {
		if err := explain(doc, true); err != nil {
			return dst, err
		}
	}
	return v, nil
}

// maxDepth is the library's nesting limit (jsontext refuses deeper values).
const maxDepth = 10000

// explain reads doc again token by token to say where and why it is
// refused: the library's errors carry a JSON Pointer, which does not tell
// a member named "0" from an array's first element, and the API reports
// fields as dotted paths. With numbers, a number outside the double range
// is refused too. It returns nil if it finds nothing wrong.
func explain(doc []byte, numbers bool) error {
	dec := jsontext.NewDecoder(bytes.NewReader(doc))
	// names[i] is the last member name read at nesting level i+1 (unused
	// for arrays).
	var names []string
	read := false // the top-level value
	for {
		depth := dec.StackDepth()
		kind, n := dec.StackIndex(depth)
		isName := depth > 0 && kind == '{' && n%2 == 0
		tok, err := dec.ReadToken()
		if read {
			if err == io.EOF {
				return nil
			}
			// The library reads a stream of values; a document is one.
			return &Error{Reason: "is not valid JSON", Err: errors.New("data after the top-level value")}
		}
		if err != nil {
			return describe(doc, dec, names, isName, err)
		}
		switch k := tok.Kind(); {
		case k == '}' || k == ']':
			names = names[:len(names)-1]
		case isName:
			names[len(names)-1] = tok.String()
		case k == '{' || k == '[':
			names = append(names, "")
		case k == '0' && numbers:
			raw := tok.String()
			if _, err := strconv.ParseFloat(raw, 64); err != nil {
				return &Error{Path: path(dec, names, false, true), Reason: "is the number " + raw + ", outside the IEEE 754 double range", Err: err}
			}
		}
		read = dec.StackDepth() == 0
	}
}

// path is the dotted path of where dec is: of the token just read (done)
// or of the one it is about to read; a member name being read is reported
// against its object (atName).
func path(dec *jsontext.Decoder, names []string, atName, done bool) string {
	var b strings.Builder
	depth := dec.StackDepth()
	for i := 1; i <= depth; i++ {
		kind, n := dec.StackIndex(i)
		last := i == depth
		if kind == '[' {
			idx := n - 1 // the element being read, at an outer level
			if last && !done {
				idx = n
			}
			b.WriteByte('[')
			b.WriteString(strconv.FormatInt(idx, 10))
			b.WriteByte(']')
			continue
		}
		if last && atName {
			break
		}
		if b.Len() > 0 {
			b.WriteByte('.')
		}
		b.WriteString(names[i-1])
	}
	return b.String()
}

// describe turns the library's error at dec's position into an *Error.
func describe(doc []byte, dec *jsontext.Decoder, names []string, isName bool, err error) error {
	var se *jsontext.SyntacticError
	if !errors.As(err, &se) {
		// io.EOF before any value, or io.ErrUnexpectedEOF.
		return &Error{Path: path(dec, names, isName, false), Reason: "is not valid JSON", Err: err}
	}
	what := "is a string that"
	if isName {
		what = "has a member name that"
	}
	off := int(se.ByteOffset)
	switch {
	case se.Err == jsontext.ErrDuplicateName:
		p := path(dec, names, true, false)
		name := se.JSONPointer.LastToken()
		if p != "" {
			p += "."
		}
		return &Error{Path: p + name, Reason: "is given more than once; duplicate member names are not I-JSON", Err: err}
	case strings.Contains(se.Err.Error(), "UTF-8") && invalidUTF8(doc, off):
		return &Error{Path: path(dec, names, isName, false), Reason: fmt.Sprintf("%s is not valid UTF-8 (byte 0x%02x at offset %d)", what, doc[off], off), Err: err}
	case dec.StackDepth() >= maxDepth:
		return &Error{Path: path(dec, names, isName, false), Reason: fmt.Sprintf("is nested deeper than %d levels", maxDepth), Err: err}
	}
	if u, ok := loneSurrogate(doc, off); ok {
		return &Error{Path: path(dec, names, isName, false), Reason: fmt.Sprintf("%s holds the lone UTF-16 surrogate \\u%04x", what, u), Err: err}
	}
	return &Error{Path: path(dec, names, isName, false), Reason: "is not valid JSON", Err: err}
}

// invalidUTF8 reports whether doc holds, at off, a byte that starts no
// valid UTF-8 sequence (the library's offset for ErrInvalidUTF8, which it
// does not export).
func invalidUTF8(doc []byte, off int) bool {
	if off < 0 || off >= len(doc) {
		return false
	}
	r, size := utf8.DecodeRune(doc[off:])
	return r == utf8.RuneError && size == 1
}

// loneSurrogate reports whether doc holds, at off, an escaped UTF-16
// surrogate (\uXXXX) that the library refused: one not paired.
func loneSurrogate(doc []byte, off int) (rune, bool) {
	if off < 0 || off+6 > len(doc) || doc[off] != '\\' || doc[off+1] != 'u' {
		return 0, false
	}
	u, err := strconv.ParseUint(string(doc[off+2:off+6]), 16, 16)
	if err != nil || !utf16.IsSurrogate(rune(u)) {
		return 0, false
	}
	return rune(u), true
}
