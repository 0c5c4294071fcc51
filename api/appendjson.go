package api

import (
	"strconv"

	"github.com/idem-dev/idem/internal/jsonenc"
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
	b = jsonenc.AppendString(b, c.Key)
	b = append(b, `,"state":`...)
	b = jsonenc.AppendString(b, string(c.State))
	b = append(b, `,"fencing_token":`...)
	b = strconv.AppendInt(b, c.FencingToken, 10)
	b = append(b, `,"attempt":`...)
	b = strconv.AppendInt(b, int64(c.Attempt), 10)
	b = append(b, `,"resumed":`...)
	b = strconv.AppendBool(b, c.Resumed)
	b = append(b, `,"lease_expires_at":`...)
	b = appendTime(b, c.LeaseExpiresAt)
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
	b = jsonenc.AppendString(b, r.Key)
	b = append(b, `,"state":`...)
	b = jsonenc.AppendString(b, string(r.State))
	b = append(b, `,"operation":`...)
	b = jsonenc.AppendString(b, r.Operation)
	b = append(b, `,"fingerprint":`...)
	b = jsonenc.AppendString(b, r.Fingerprint)
	b = append(b, `,"fencing_token":`...)
	b = strconv.AppendInt(b, r.FencingToken, 10)
	b = append(b, `,"attempt":`...)
	b = strconv.AppendInt(b, int64(r.Attempt), 10)
	b = append(b, `,"lease_expires_at":`...)
	b = appendTime(b, r.LeaseExpiresAt)
	b = append(b, `,"recovery_point":`...)
	b = appendStringOrNull(b, r.RecoveryPoint)
	if !r.RecoveryData.omitted {
		b = append(b, `,"recovery_data":null`...)
	}
	b = append(b, `,"created_at":`...)
	b = appendTime(b, r.CreatedAt)
	b = append(b, `,"completed_at":`...)
	b = appendTime(b, r.CompletedAt)
	b = append(b, `,"replay_until":`...)
	b = appendTime(b, r.ReplayUntil)
	b = append(b, `,"purge_after":`...)
	b = appendTime(b, r.PurgeAfter)
	b = append(b, `,"response":`...)
	if p := r.Response; p == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, `{"status":`...)
		b = strconv.AppendInt(b, int64(p.Status), 10)
		b = append(b, `,"headers":`...)
		b = jsonenc.AppendStringMap(b, p.Headers)
		b = append(b, `,"body":`...)
		b = jsonenc.AppendString(b, p.Body)
		b = append(b, `,"body_encoding":`...)
		b = jsonenc.AppendString(b, p.BodyEncoding)
		b = append(b, '}')
	}
	b = append(b, `,"review":`...)
	if v := r.Review; v == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, `{"note":`...)
		b = jsonenc.AppendString(b, v.Note)
		b = append(b, `,"at":`...)
		b = appendTime(b, v.At)
		b = append(b, '}')
	}
	b = append(b, '}')
	return b, true
}

func appendStringOrNull(b []byte, s *string) []byte {
	if s == nil {
		return append(b, "null"...)
	}
	return jsonenc.AppendString(b, *s)
}
