// Package jsonenc writes the JSON of the hot path's few value shapes by
// hand, byte for byte what encoding/json writes for them, without its
// reflection and allocations: the API's answers (package api) and the
// stored response headers (both stores).
package jsonenc

import (
	"slices"
	"unicode/utf8"
)

// AppendStringMap appends m as json.Marshal writes a map[string]string:
// null for a nil map, otherwise an object with the members in key order.
func AppendStringMap(b []byte, m map[string]string) []byte {
	if m == nil {
		return append(b, "null"...)
	}
	var arr [8]string
	keys := arr[:0]
	size := 2 // room for the members unless they need escaping
	for k, v := range m {
		keys = append(keys, k)
		size += len(k) + len(v) + 6
	}
	b = slices.Grow(b, size)
	slices.Sort(keys)
	b = append(b, '{')
	for i, k := range keys {
		if i > 0 {
			b = append(b, ',')
		}
		b = AppendString(b, k)
		b = append(b, ':')
		b = AppendString(b, m[k])
	}
	return append(b, '}')
}

// AppendString appends s as a JSON string the way json.Encoder does with
// its default HTML escaping: `"` and `\` escaped, the control characters
// \b \f \n \r \t by name and the others, with <, > and &, as \u00XX; the
// line and paragraph separators U+2028 and U+2029 as \u2028 and \u2029;
// each invalid UTF-8 byte as \ufffd.
func AppendString(b []byte, s string) []byte {
	const hexDigits = "0123456789abcdef"
	b = append(b, '"')
	done := 0 // s[:done] is in b
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
				i++
				continue
			}
			b = append(b, s[done:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, `\b`...)
			case '\f':
				b = append(b, `\f`...)
			case '\n':
				b = append(b, `\n`...)
			case '\r':
				b = append(b, `\r`...)
			case '\t':
				b = append(b, `\t`...)
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			done = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			b = append(b, s[done:i]...)
			b = append(b, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			b = append(b, s[done:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
		default:
			i += size
			continue
		}
		i += size
		done = i
	}
	b = append(b, s[done:]...)
	return append(b, '"')
}
