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
	"strings"
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
	canon, err := CanonicalJSON(request)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(canon)
	return FingerprintPrefix + hex.EncodeToString(sum[:]), nil
}

// CanonicalJSON returns the RFC 8785 JSON Canonicalization Scheme form of a
// JSON document: object members sorted by their UTF-16 code units, no
// insignificant white space, numbers in ECMAScript shortest form, strings
// with minimal escaping. The document must be I-JSON (see CheckIJSON):
// duplicate member names, invalid UTF-8 and lone surrogates are refused
// rather than normalised, so two different documents never share a form.
func CanonicalJSON(doc []byte) ([]byte, error) {
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
		buf.WriteString(formatES6Number(f))
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
		slices.SortFunc(keys, compareUTF16)
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

// compareUTF16 orders strings by their UTF-16 code units, as RFC 8785
// requires for object member names, without encoding them: up to the first
// rune that differs the code units are equal, and there the order of the
// two runes' first code units decides (utf16Lead), or their code points when
// those are equal too (both above U+FFFF with one high surrogate, where
// the low surrogates follow the code points). A string that ends first
// sorts first.
func compareUTF16(a, b string) int {
	for a != "" && b != "" {
		ra, na := utf8.DecodeRuneInString(a)
		rb, nb := utf8.DecodeRuneInString(b)
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

// formatES6Number formats a double as ECMAScript's Number.prototype.toString
// does, which is what RFC 8785 prescribes.
func formatES6Number(f float64) string {
	if f == 0 {
		return "0" // also for -0
	}
	abs := math.Abs(f)
	if abs >= 1e-6 && abs < 1e21 {
		return strconv.FormatFloat(f, 'f', -1, 64)
	}
	s := strconv.FormatFloat(f, 'e', -1, 64)
	// Go writes e+07 / e-07; ECMAScript writes e+7 / e-7.
	mantissa, exp, _ := strings.Cut(s, "e")
	sign := exp[0]
	exp = strings.TrimLeft(exp[1:], "0")
	return mantissa + "e" + string(sign) + exp
}

func writeCanonicalString(buf *bytes.Buffer, s string) {
	const hexDigits = "0123456789abcdef"
	buf.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			buf.WriteString(`\"`)
		case '\\':
			buf.WriteString(`\\`)
		case '\b':
			buf.WriteString(`\b`)
		case '\f':
			buf.WriteString(`\f`)
		case '\n':
			buf.WriteString(`\n`)
		case '\r':
			buf.WriteString(`\r`)
		case '\t':
			buf.WriteString(`\t`)
		default:
			if r < 0x20 {
				buf.WriteString(`\u00`)
				buf.WriteByte(hexDigits[r>>4])
				buf.WriteByte(hexDigits[r&0xF])
			} else {
				buf.WriteRune(r)
			}
		}
	}
	buf.WriteByte('"')
}
