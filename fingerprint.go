package idem

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"sync"
	"unicode/utf16"
	"unicode/utf8"
)

// FingerprintPrefix starts every fingerprint the server computes.
const FingerprintPrefix = "sha256:"

// FingerprintJSON computes the server-side fingerprint of a JSON request
// value: "sha256:" followed by the hex SHA-256 of its RFC 8785 (JCS)
// canonical form. Two documents that differ only in key order, white space
// or number spelling (1.0 vs 1) have the same fingerprint.
func FingerprintJSON(request json.RawMessage) (string, error) {
	bp := canonicalBuffers.Get().(*[]byte)
	canon, err := appendCanonical((*bp)[:0], request)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(canon)
	if cap(canon) <= maxPooledScratch {
		*bp = canon
		canonicalBuffers.Put(bp)
	}
	var fp [len(FingerprintPrefix) + 2*sha256.Size]byte
	copy(fp[:], FingerprintPrefix)
	hex.Encode(fp[len(FingerprintPrefix):], sum[:])
	return string(fp[:]), nil
}

// canonicalBuffers holds FingerprintJSON's canonical forms between calls.
var canonicalBuffers = sync.Pool{New: func() any { return new([]byte) }}

// CanonicalJSON returns the RFC 8785 JSON Canonicalization Scheme form of a
// JSON document: object members sorted by their UTF-16 code units, no
// insignificant white space, numbers in ECMAScript shortest form, strings
// with minimal escaping. The document must be I-JSON (see CheckIJSON):
// duplicate member names, invalid UTF-8 and lone surrogates are refused
// rather than normalised, so two different documents never share a form.
func CanonicalJSON(doc []byte) ([]byte, error) {
	return appendCanonical(make([]byte, 0, len(doc)), doc)
}

// appendCanonical appends the canonical form of doc to dst: in one pass
// when it can, by the two-pass path otherwise (which also names what is
// wrong).
func appendCanonical(dst, doc []byte) ([]byte, error) {
	if out, ok := canonicalOnePass(dst, doc); ok {
		return out, nil
	}
	canon, err := canonicalTwoPass(doc)
	if err != nil {
		return dst, err
	}
	return append(dst, canon...), nil
}

// canonicalTwoPass is CanonicalJSON by the book: decode with encoding/json,
// check I-JSON, write the decoded value canonically. It is the path that
// names what is wrong with a document canonicalOnePass does not accept, and
// the reference the one-pass path is tested against.
func canonicalTwoPass(doc []byte) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("canonical json: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("canonical json: trailing data after the value")
	}
	if err := CheckIJSON(doc); err != nil {
		return nil, fmt.Errorf("canonical json: %w", err)
	}
	var buf bytes.Buffer
	if err := writeCanonical(&buf, v); err != nil {
		return nil, fmt.Errorf("canonical json: %w", err)
	}
	return buf.Bytes(), nil
}

func writeCanonical(buf *bytes.Buffer, v any) error {
	switch v := v.(type) {
	case nil:
		buf.WriteString("null")
	case bool:
		buf.WriteString(strconv.FormatBool(v))
	case json.Number:
		f, err := strconv.ParseFloat(string(v), 64)
		if err != nil || math.IsInf(f, 0) {
			return fmt.Errorf("number %s is outside the IEEE 754 double range", v)
		}
		buf.Write(appendES6Number(buf.AvailableBuffer(), f))
	case string:
		writeCanonicalString(buf, v)
	case []any:
		buf.WriteByte('[')
		for i, e := range v {
			if i > 0 {
				buf.WriteByte(',')
			}
			if err := writeCanonical(buf, e); err != nil {
				return err
			}
		}
		buf.WriteByte(']')
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		slices.SortFunc(keys, func(a, b string) int { return compareUTF16([]byte(a), []byte(b)) })
		buf.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				buf.WriteByte(',')
			}
			writeCanonicalString(buf, k)
			buf.WriteByte(':')
			if err := writeCanonical(buf, v[k]); err != nil {
				return err
			}
		}
		buf.WriteByte('}')
	default:
		return fmt.Errorf("unexpected JSON value of type %T", v)
	}
	return nil
}

// compareUTF16 orders UTF-8 strings by their UTF-16 code units, as RFC 8785
// requires for object member names, without encoding them: up to the first
// rune that differs the code units are equal, and there the order of the
// two runes' first code units decides (utf16Lead), or their code points when
// those are equal too (both above U+FFFF with one high surrogate, where
// the low surrogates follow the code points). A string that ends first
// sorts first.
func compareUTF16(a, b []byte) int {
	for len(a) > 0 && len(b) > 0 {
		if a[0] < utf8.RuneSelf && b[0] < utf8.RuneSelf {
			// ASCII: one code unit each.
			if a[0] != b[0] {
				return cmp.Compare(a[0], b[0])
			}
			a, b = a[1:], b[1:]
			continue
		}
		ra, na := utf8.DecodeRune(a)
		rb, nb := utf8.DecodeRune(b)
		if ra != rb {
			if c := cmp.Compare(utf16Lead(ra), utf16Lead(rb)); c != 0 {
				return c
			}
			return cmp.Compare(ra, rb)
		}
		a, b = a[na:], b[nb:]
	}
	return cmp.Compare(len(a), len(b))
}

// utf16Lead is the first UTF-16 code unit of r.
func utf16Lead(r rune) rune {
	if r < 0x10000 {
		return r
	}
	hi, _ := utf16.EncodeRune(r)
	return hi
}

// appendES6Number appends a double formatted as ECMAScript's
// Number.prototype.toString does, which is what RFC 8785 prescribes.
func appendES6Number(b []byte, f float64) []byte {
	if f == 0 {
		return append(b, '0') // also for -0
	}
	abs := math.Abs(f)
	if abs >= 1e-6 && abs < 1e21 {
		return strconv.AppendFloat(b, f, 'f', -1, 64)
	}
	n := len(b)
	b = strconv.AppendFloat(b, f, 'e', -1, 64)
	// Go writes e+07 / e-07; ECMAScript writes e+7 / e-7.
	e := n + bytes.IndexByte(b[n:], 'e')
	exp := e + 2 // the first exponent digit, after the sign
	zeros := 0
	for exp+zeros < len(b)-1 && b[exp+zeros] == '0' {
		zeros++
	}
	return append(b[:exp], b[exp+zeros:]...)
}

func writeCanonicalString(buf *bytes.Buffer, s string) {
	b := append(buf.AvailableBuffer(), '"')
	for _, r := range s {
		b = appendCanonicalRune(b, r)
	}
	buf.Write(append(b, '"'))
}

// appendCanonicalRune appends r as it stands inside a canonical string:
// the two-character escapes where JSON has them, \u00xx for the other
// control characters, the character itself otherwise.
func appendCanonicalRune(b []byte, r rune) []byte {
	const hexDigits = "0123456789abcdef"
	switch r {
	case '"':
		return append(b, `\"`...)
	case '\\':
		return append(b, `\\`...)
	case '\b':
		return append(b, `\b`...)
	case '\f':
		return append(b, `\f`...)
	case '\n':
		return append(b, `\n`...)
	case '\r':
		return append(b, `\r`...)
	case '\t':
		return append(b, `\t`...)
	}
	if r < 0x20 {
		return append(b, '\\', 'u', '0', '0', hexDigits[r>>4], hexDigits[r&0xF])
	}
	return utf8.AppendRune(b, r)
}
