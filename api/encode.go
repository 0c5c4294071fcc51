package api

import (
	"bytes"
	"encoding/base64"
	"net/http"
	"time"
	"unicode/utf8"

	"github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"

	"github.com/idem-dev/idem"
)

// answerOptions write answers byte for byte as encoding/json did before
// them, so no client sees a change: map keys sorted; <, >, &, U+2028 and
// U+2029 escaped; nil slices and maps as null; invalid UTF-8 as U+FFFD
// (which the server does not hold: request bodies refuse it). Each answer
// ends with a newline, as json.Encoder's did.
var answerOptions = json.JoinOptions(
	json.Deterministic(true),
	jsontext.EscapeForHTML(true),
	jsontext.EscapeForJS(true),
	json.FormatNilSliceAsNull(true),
	json.FormatNilMapAsNull(true),
	jsontext.AllowInvalidUTF8(true),
)

// jsonTime is a time as the API writes it: RFC 3339 in UTC with the
// fraction it has, or null when it is zero.
type jsonTime time.Time

func timeJSON(t time.Time) jsonTime { return jsonTime(t) }

// MarshalJSONTo writes t: null for the zero time.
func (t jsonTime) MarshalJSONTo(enc *jsontext.Encoder) error {
	tt := time.Time(t)
	if tt.IsZero() {
		return enc.WriteToken(jsontext.Null)
	}
	var buf [48]byte
	b := tt.UTC().AppendFormat(append(buf[:0], '"'), time.RFC3339Nano)
	return enc.WriteValue(append(b, '"'))
}

func stringOrNull(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// rawOrNull returns raw, or nil (encoded as null) when it is empty.
func rawOrNull(raw []byte) jsontext.Value {
	if len(raw) == 0 {
		return nil
	}
	return raw
}

// responseJSON is a stored response as it travels in JSON.
type responseJSON struct {
	Status       int               `json:"status"`
	Headers      map[string]string `json:"headers"`
	Body         string            `json:"body"`
	BodyEncoding string            `json:"body_encoding"`
}

func encodeResponse(r *idem.Response) *responseJSON {
	if r == nil {
		return nil
	}
	out := &responseJSON{Status: r.Status, Headers: r.Headers}
	if out.Headers == nil {
		out.Headers = map[string]string{}
	}
	if r.BodyEncoding == idem.BodyEncodingBase64 || !utf8.Valid(r.Body) {
		out.Body, out.BodyEncoding = base64.StdEncoding.EncodeToString(r.Body), idem.BodyEncodingBase64
	} else {
		out.Body, out.BodyEncoding = string(r.Body), idem.BodyEncodingUTF8
	}
	return out
}

// recoveryJSON is the recovery_data of a record: the JSON saved with the
// last checkpoint, or null when there is none. Listings leave the member out
// (omitted, with omitzero) so a page stays small whatever the records hold:
// checkpoint data may be as large as the tenant's max_response_bytes, and
// GET /v1/keys/{key} returns it whole.
type recoveryJSON struct {
	raw     []byte
	omitted bool
}

// IsZero reports whether the member is left out (omitzero).
func (r recoveryJSON) IsZero() bool { return r.omitted }

// MarshalJSONTo writes the saved JSON, or null.
func (r recoveryJSON) MarshalJSONTo(enc *jsontext.Encoder) error {
	if len(r.raw) == 0 {
		return enc.WriteToken(jsontext.Null)
	}
	return enc.WriteValue(jsontext.Value(r.raw))
}

// recordJSON is the full record of GET /v1/keys/{key}; listings leave out
// recovery_data (see recoveryJSON).
type recordJSON struct {
	Key            string        `json:"key"`
	State          idem.State    `json:"state"`
	Operation      string        `json:"operation"`
	Fingerprint    string        `json:"fingerprint"`
	FencingToken   int64         `json:"fencing_token"`
	Attempt        int           `json:"attempt"`
	LeaseExpiresAt jsonTime      `json:"lease_expires_at"`
	RecoveryPoint  *string       `json:"recovery_point"`
	RecoveryData   recoveryJSON  `json:"recovery_data,omitzero"`
	CreatedAt      jsonTime      `json:"created_at"`
	CompletedAt    jsonTime      `json:"completed_at"`
	ReplayUntil    jsonTime      `json:"replay_until"`
	PurgeAfter     jsonTime      `json:"purge_after"`
	Response       *responseJSON `json:"response"`
	// Review is the review flag a person (or the completer, giving up)
	// set; null when there is none.
	Review *reviewJSON `json:"review"`
	// Completer is the completer's hold on the record (completer.go);
	// null when the completer never took it or let it go.
	Completer *completionJSON `json:"completer"`
}

// completionJSON is the completer's hold on a record.
type completionJSON struct {
	State         idem.CompletionState `json:"state"`
	CompleterID   string               `json:"completer_id"`
	Attempts      int                  `json:"attempts"`
	NextAttemptAt jsonTime             `json:"next_attempt_at"`
	Deadline      jsonTime             `json:"deadline"`
}

// reviewJSON is the review flag of a record.
type reviewJSON struct {
	Note string   `json:"note"`
	At   jsonTime `json:"at"`
}

// orphanJSON is one item of GET /v1/admin/orphans: a listed record (no
// recovery data) with its tenant and without a response member.
type orphanJSON struct {
	Tenant string `json:"tenant"`
	recordJSON
	// Response shadows recordJSON's member of the same name (a shallower
	// field wins in json, as in Go) and, always zero, is left out: an orphan
	// has no response.
	Response struct{} `json:"response,omitzero"`
}

func encodeOrphan(r idem.Record) orphanJSON {
	return orphanJSON{Tenant: r.TenantID, recordJSON: encodeListed(r)}
}

// encodeListed encodes a record of a listing: without recovery_data (the
// store does not read it for listings).
func encodeListed(r idem.Record) recordJSON {
	out := encodeRecord(r)
	out.RecoveryData.omitted = true
	return out
}

func encodeRecord(r idem.Record) recordJSON {
	out := recordJSON{
		Key:           r.Key,
		State:         r.APIState(),
		Operation:     r.Operation,
		Fingerprint:   r.Fingerprint,
		FencingToken:  r.FencingToken,
		Attempt:       r.Attempt,
		RecoveryPoint: stringOrNull(r.RecoveryPoint),
		RecoveryData:  recoveryJSON{raw: r.RecoveryData},
		CreatedAt:     timeJSON(r.CreatedAt),
		CompletedAt:   timeJSON(r.CompletedAt),
		ReplayUntil:   timeJSON(r.ReplayUntil),
		PurgeAfter:    timeJSON(r.PurgeAfter),
		Response:      encodeResponse(r.Response),
	}
	if r.State == idem.StateInFlight {
		out.LeaseExpiresAt = timeJSON(r.LeaseExpiresAt)
	}
	if r.Review != nil {
		out.Review = &reviewJSON{Note: r.Review.Note, At: timeJSON(r.Review.At)}
	}
	if c := r.Completion; c != nil {
		out.Completer = &completionJSON{State: c.State, CompleterID: c.CompleterID, Attempts: c.Attempts, Deadline: timeJSON(c.Deadline)}
		if c.State == idem.CompletionUnknown {
			out.Completer.NextAttemptAt = timeJSON(c.NextAttemptAt)
		}
	}
	return out
}

// claimJSON is the 201 body of a claim.
type claimJSON struct {
	Key            string         `json:"key"`
	State          idem.State     `json:"state"`
	FencingToken   int64          `json:"fencing_token"`
	Attempt        int            `json:"attempt"`
	Resumed        bool           `json:"resumed"`
	LeaseExpiresAt jsonTime       `json:"lease_expires_at"`
	RecoveryPoint  *string        `json:"recovery_point"`
	RecoveryData   jsontext.Value `json:"recovery_data"`
}

// tenantJSON is a tenant as the API shows it.
type tenantJSON struct {
	ID        string        `json:"id"`
	Name      string        `json:"name"`
	Settings  idem.Settings `json:"settings"`
	Disabled  bool          `json:"disabled"`
	Usage     usageJSON     `json:"usage"`
	CreatedAt jsonTime      `json:"created_at"`
	UpdatedAt jsonTime      `json:"updated_at"`
}

// usageJSON is what a tenant's records take against its quotas.
type usageJSON struct {
	// StoredBytes counts against settings.storage_quota_bytes.
	StoredBytes int64 `json:"stored_bytes"`
}

func encodeTenant(t idem.Tenant) tenantJSON {
	return tenantJSON{
		ID: t.ID, Name: t.Name, Settings: t.Settings, Disabled: t.Disabled,
		Usage:     usageJSON{StoredBytes: t.StoredBytes},
		CreatedAt: timeJSON(t.CreatedAt), UpdatedAt: timeJSON(t.UpdatedAt),
	}
}

// responseInput is the response of a complete request.
type responseInput struct {
	Status       *int              `json:"status"`
	Headers      map[string]string `json:"headers"`
	Body         jsontext.Value    `json:"body"`
	BodyEncoding string            `json:"body_encoding"`
}

// decode validates the response and returns it; field names start with
// "response.".
func (in *responseInput) decode() (idem.Response, error) {
	if in == nil {
		return idem.Response{}, fieldError("response", "is required", nil)
	}
	if in.Status == nil {
		return idem.Response{}, fieldError("response.status", "is required", nil)
	}
	if err := idem.ValidateResponseStatus(*in.Status); err != nil {
		return idem.Response{}, err
	}
	if err := idem.ValidateResponseHeaders(in.Headers); err != nil {
		return idem.Response{}, err
	}
	out := idem.Response{Status: *in.Status, Headers: in.Headers, BodyEncoding: in.BodyEncoding}
	if out.Headers == nil {
		out.Headers = map[string]string{}
	}
	if out.BodyEncoding == "" {
		out.BodyEncoding = idem.BodyEncodingUTF8
	}
	var text string
	if len(in.Body) > 0 && !bytes.Equal(in.Body, []byte("null")) {
		if err := json.Unmarshal(in.Body, &text); err != nil {
			return idem.Response{}, fieldError("response.body", "must be a string", err)
		}
	}
	switch out.BodyEncoding {
	case idem.BodyEncodingUTF8:
		// decodeBody refused invalid UTF-8 and lone surrogates (I-JSON), so
		// text is the body as sent.
		out.Body = []byte(text)
	case idem.BodyEncodingBase64:
		b, err := base64.StdEncoding.DecodeString(text)
		if err != nil {
			return idem.Response{}, fieldError("response.body", "is not valid standard base64", err)
		}
		out.Body = b
	default:
		return idem.Response{}, fieldError("response.body_encoding", `must be "utf8" or "base64"`, nil)
	}
	return out, nil
}

// reply is a JSON body answered with another status than 200 (a created
// claim or tenant) or, for a replayed claim, with Idempotent-Replayed:
// true. writeJSON encodes the body itself: there is one encoding path.
type reply struct {
	status   int
	replayed bool
	body     any
}

func (c reply) statusCode() int { return c.status }

func (c reply) writeHeader(h http.Header) {
	if c.replayed {
		h.Set("Idempotent-Replayed", "true")
	}
}

func (c reply) jsonBody() any { return c.body }
