package api

import (
	"slices"
	"strconv"
	"unicode/utf8"
)

// The two bodies of the hot path (a claim's 201 and a record, the complete's
// answer) are written by hand instead of by encoding/json's reflection:
// byte for byte what json.Encoder writes for them (HTML-safe escaping, map
// keys sorted), which TestAppendJSONMatchesEncodingJSON checks on random
// values. A value they cannot write exactly (saved recovery data, whose
// compaction encoding/json owns) goes through encoding/json.

// appendBody appends the JSON of v and reports whether it could; it knows
// claimJSON and recordJSON (exact types: a struct embedding recordJSON is
// not a recordJSON).
func appendBody(b []byte, v any) ([]byte, bool) {
	switch v := v.(type) {
	case claimJSON:
		return v.appendJSON(b)
	case recordJSON:
		return v.appendJSON(b)
	}
	return b, false
}

func (c claimJSON) appendJSON(b []byte) ([]byte, bool) {
	if c.RecoveryData != nil {
		return b, false
	}
	b = append(b, `{"key":`...)
	b = appendString(b, c.Key)
	b = append(b, `,"state":`...)
	b = appendString(b, string(c.State))
	b = append(b, `,"fencing_token":`...)
	b = strconv.AppendInt(b, c.FencingToken, 10)
	b = append(b, `,"attempt":`...)
	b = strconv.AppendInt(b, int64(c.Attempt), 10)
	b = append(b, `,"resumed":`...)
	b = strconv.AppendBool(b, c.Resumed)
	b = append(b, `,"lease_expires_at":`...)
	b = appendStringOrNull(b, c.LeaseExpiresAt)
	b = append(b, `,"recovery_point":`...)
	b = appendStringOrNull(b, c.RecoveryPoint)
	b = append(b, `,"recovery_data":null}`...)
	return b, true
}

func (r recordJSON) appendJSON(b []byte) ([]byte, bool) {
	if !r.RecoveryData.omitted && len(r.RecoveryData.raw) > 0 {
		return b, false
	}
	b = append(b, `{"key":`...)
	b = appendString(b, r.Key)
	b = append(b, `,"state":`...)
	b = appendString(b, string(r.State))
	b = append(b, `,"operation":`...)
	b = appendString(b, r.Operation)
	b = append(b, `,"fingerprint":`...)
	b = appendString(b, r.Fingerprint)
	b = append(b, `,"fencing_token":`...)
	b = strconv.AppendInt(b, r.FencingToken, 10)
	b = append(b, `,"attempt":`...)
	b = strconv.AppendInt(b, int64(r.Attempt), 10)
	b = append(b, `,"lease_expires_at":`...)
	b = appendStringOrNull(b, r.LeaseExpiresAt)
	b = append(b, `,"recovery_point":`...)
	b = appendStringOrNull(b, r.RecoveryPoint)
	if !r.RecoveryData.omitted {
		b = append(b, `,"recovery_data":null`...)
	}
	b = append(b, `,"created_at":`...)
	b = appendStringOrNull(b, r.CreatedAt)
	b = append(b, `,"completed_at":`...)
	b = appendStringOrNull(b, r.CompletedAt)
	b = append(b, `,"replay_until":`...)
	b = appendStringOrNull(b, r.ReplayUntil)
	b = append(b, `,"purge_after":`...)
	b = appendStringOrNull(b, r.PurgeAfter)
	b = append(b, `,"response":`...)
	if p := r.Response; p == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, `{"status":`...)
		b = strconv.AppendInt(b, int64(p.Status), 10)
		b = append(b, `,"headers":`...)
		if p.Headers == nil {
			b = append(b, "null"...)
		} else {
			b = append(b, '{')
			keys := make([]string, 0, len(p.Headers))
			for k := range p.Headers {
				keys = append(keys, k)
			}
			slices.Sort(keys)
			for i, k := range keys {
				if i > 0 {
					b = append(b, ',')
				}
				b = appendString(b, k)
				b = append(b, ':')
				b = appendString(b, p.Headers[k])
			}
			b = append(b, '}')
		}
		b = append(b, `,"body":`...)
		b = appendString(b, p.Body)
		b = append(b, `,"body_encoding":`...)
		b = appendString(b, p.BodyEncoding)
		b = append(b, '}')
	}
	b = append(b, `,"review":`...)
	if v := r.Review; v == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, `{"note":`...)
		b = appendString(b, v.Note)
		b = append(b, `,"at":`...)
		b = appendStringOrNull(b, v.At)
		b = append(b, '}')
	}
	b = append(b, '}')
	return b, true
}

func appendStringOrNull(b []byte, s *string) []byte {
	if s == nil {
		return append(b, "null"...)
	}
	return appendString(b, *s)
}

// appendString appends s as a JSON string the way json.Encoder does with
// its default HTML escaping: `"` and `\` escaped, the control characters
// \b \f \n \r \t by name and the others, with <, > and &, as \u00XX; the
// line and paragraph separators U+2028 and U+2029 as \u2028 and \u2029;
// each invalid UTF-8 byte as \ufffd.
func appendString(b []byte, s string) []byte {
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
