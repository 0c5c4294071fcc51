package api

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"reflect"
	"slices"
	"strings"

	"github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/canon"
)

// Endpoints follow the riverui apiframe pattern: each endpoint is a request
// struct and an execute function; handle does everything else.
//
// A request struct may implement binder (path and query parameters, read
// after the body so the body can never set them) and validator (checks that
// need no store). Parameters live in unexported fields; a struct of them
// embedded in a request is tagged `json:"-"` (json refuses to decode into a
// struct with no member it can see unless a tag says so). A response may implement statusCoder and headerWriter; a
// response whose status is 204 has no body.

type binder interface {
	bind(r *http.Request) error
}

type validator interface {
	validate() error
}

type statusCoder interface {
	statusCode() int
}

type headerWriter interface {
	writeHeader(h http.Header)
}

// noContent is the response of endpoints that answer 204.
type noContent struct{}

func (noContent) statusCode() int { return http.StatusNoContent }

// handle returns the handler of one JSON endpoint: it refuses a body over
// MaxBodyBytes (413) and reserves it against the server-wide in-flight
// budget (503 server_busy) before reading it, requires application/json for
// a non-empty body (415), treats an empty body as {}, decodes with unknown
// fields refused and no trailing data (400 naming the field when it can),
// binds path and query parameters, validates, executes and encodes the
// response. The body's budget, and what the answer's stored bytes were
// charged (holdAnswer), are given back once the answer is written.
func handle[Req any, Resp any](s *service, exec func(ctx context.Context, req *Req) (Resp, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		req := new(Req)
		// The bytes held for the request count in its tenant's share.
		owner := principalFrom(r.Context()).Tenant
		held, err := s.decodeBody(w, r, owner, req)
		defer func() {
			s.inflight.Release(owner, held)
			if a, ok := any(req).(answerHolder); ok {
				s.inflight.Release(a.answerHeld())
			}
		}()
		if a, ok := any(req).(answerHolder); ok {
			a.setAnswerOwner(owner)
		}
		if err != nil {
			s.writeProblem(w, r, err)
			return
		}
		if b, ok := any(req).(binder); ok {
			if err := b.bind(r); err != nil {
				s.writeProblem(w, r, err)
				return
			}
		}
		if v, ok := any(req).(validator); ok {
			if err := v.validate(); err != nil {
				s.writeProblem(w, r, err)
				return
			}
		}
		resp, err := exec(r.Context(), req)
		if err != nil {
			s.writeProblem(w, r, err)
			return
		}
		s.writeJSON(w, r, resp)
	}
}

func (s *service) writeJSON(w http.ResponseWriter, r *http.Request, resp any) {
	status := http.StatusOK
	if sc, ok := resp.(statusCoder); ok {
		status = sc.statusCode()
	}
	if hw, ok := resp.(headerWriter); ok {
		hw.writeHeader(w.Header())
	}
	h := w.Header()
	h["Cache-Control"] = noStore
	if status == http.StatusNoContent {
		w.WriteHeader(status)
		return
	}
	if bw, ok := resp.(bodyWrapper); ok {
		resp = bw.jsonBody()
	}
	buf := s.buffers.Get().(*bytes.Buffer)
	defer func() {
		if buf.Cap() <= maxPooledBuffer {
			buf.Reset()
			s.buffers.Put(buf)
		}
	}()
	buf.Reset()
	if err := json.MarshalWrite(buf, resp, answerOptions); err != nil {
		s.writeProblem(w, r, fmt.Errorf("encode response: %w", err))
		return
	}
	buf.WriteByte('\n')
	h["Content-Type"] = contentTypeJSON
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// The values of the headers every answer carries, shared by all answers
// rather than a slice allocated per header per answer (Header.Set). No one
// writes into a header's values in place; Header.Add of one more value
// copies (the slices are full).
var (
	noStore         = []string{"no-store"}
	contentTypeJSON = []string{"application/json"}
)

// maxPooledBuffer is the largest response buffer kept for reuse; buffers
// that grew past it (large listings or stored responses) are dropped.
const maxPooledBuffer = 64 << 10

// bodyWrapper is a response that only adds a status or headers to a JSON
// body; writeJSON encodes the body directly.
type bodyWrapper interface {
	jsonBody() any
}

// decodeBody reads at most MaxBodyBytes of the body and decodes it into dst.
// It returns the in-flight budget it holds for the body, to be released by
// the caller once the request is answered (also on error).
func (s *service) decodeBody(w http.ResponseWriter, r *http.Request, owner string, dst any) (held int64, err error) {
	body, held, err := s.readBody(w, r, owner)
	if err != nil {
		return held, err
	}
	return held, decodeRequest(body, r.Header.Get("Content-Type"), dst)
}

// decodeRequest decodes a request body sent as contentType into dst; an
// empty body is {}.
func decodeRequest(body []byte, contentType string, dst any) error {
	if len(bytes.TrimSpace(body)) == 0 {
		body = []byte("{}")
	} else if err := checkJSONContentType(contentType); err != nil {
		return err
	} else if bytes.Equal(bytes.TrimSpace(body), []byte("null")) {
		// json takes a null body as the zero request.
		return idem.Errorf(idem.CodeInvalidRequest, "the request body must be a JSON object, not null")
	}
	opts := strictRequest
	if !bytes.Contains(body, nullLiteral) {
		// No null token can be in a body without these four bytes (a
		// string's escapes spell other bytes), so refuseNull would refuse
		// nothing; without it json calls no function per value, each call
		// an interface conversion that allocates.
		opts = strictNoNull
	}
	if err := json.Unmarshal(body, dst, opts); err != nil {
		return refusal(body, dst, err)
	}
	return nil
}

// nullLiteral is JSON's null token.
var nullLiteral = []byte("null")

// strictRequest is how request bodies decode: one JSON value that is I-JSON
// (RFC 7493: no duplicate member names, no invalid UTF-8 or lone
// surrogates; json's defaults), no member the request type does not have,
// and no null where the contract does not allow it (refuseNull). What is
// fingerprinted and stored is then what the caller sent.
var strictRequest = json.JoinOptions(json.RejectUnknownMembers(true), json.WithUnmarshalers(refuseNull))

// strictNoNull is strictRequest for a body that holds no null.
var strictNoNull = json.RejectUnknownMembers(true)

// errNull is refuseNull's refusal.
var errNull = errors.New("must not be null; leave it out instead")

// refuseNull refuses a member that is null, unless its field is a
// jsontext.Value: the contract allows null only where a field says
// nullable (the JSON values request, data, response.body), and json takes
// null as the zero value, which would read as "absent". It is called
// before every value is decoded; array elements are left to their type,
// as they always were.
var refuseNull = json.UnmarshalFromFunc(func(dec *jsontext.Decoder, v any) error {
	if dec.PeekKind() != 'n' {
		return json.SkipFunc
	}
	if _, nullable := v.(*jsontext.Value); nullable {
		return json.SkipFunc
	}
	if kind, _ := dec.StackIndex(dec.StackDepth()); kind != '{' {
		return json.SkipFunc
	}
	return errNull
})

// lenient reads JSON without the I-JSON checks (refusal checks them on
// their own).
var lenient = json.JoinOptions(jsontext.AllowDuplicateNames(true), jsontext.AllowInvalidUTF8(true))

// refusal says why json refused body, naming the field when it can. json
// stops at the first problem in the document; the API names the problem of
// the first check that fails, in this order: the body is JSON, it fits the
// request type (member types, no unknown member), it holds one value, it
// is I-JSON, it holds no null where the contract does not allow it. So the
// body is read again check by check; only refused bodies pay for this.
func refusal(body []byte, dst any, err error) error {
	dec := jsontext.NewDecoder(bytes.NewReader(body), lenient)
	value, serr := dec.ReadValue()
	var se *jsontext.SyntacticError
	switch {
	case errors.Is(serr, io.ErrUnexpectedEOF):
		return &idem.Error{Code: idem.CodeInvalidRequest, Detail: "the JSON body ends early", Err: serr}
	case errors.As(serr, &se):
		return &idem.Error{Code: idem.CodeInvalidRequest, Detail: fmt.Sprintf("malformed JSON at byte %d", se.ByteOffset+1), Err: serr}
	case serr != nil:
		return &idem.Error{Code: idem.CodeInvalidRequest, Detail: "the request body could not be read", Err: serr}
	}
	fresh := reflect.New(reflect.TypeOf(dst).Elem()).Interface()
	if terr := json.Unmarshal(value, fresh, json.RejectUnknownMembers(true), lenient); terr != nil {
		return decodeError(terr)
	}
	if _, terr := dec.ReadToken(); terr != io.EOF {
		return idem.Errorf(idem.CodeInvalidRequest, "the request body holds data after the JSON value")
	}
	if ierr := canon.CheckIJSON(body); ierr != nil {
		return ijsonError(ierr)
	}
	return decodeError(err) // a null refuseNull refused
}

// ijsonError turns a CheckIJSON error into an invalid_request naming the
// field it found.
func ijsonError(err error) error {
	var ie *canon.Error
	if !errors.As(err, &ie) || ie.Path == "" {
		return &idem.Error{Code: idem.CodeInvalidRequest, Detail: "the request body is not I-JSON (RFC 7493): " + err.Error(), Err: err}
	}
	msg := ie.Reason
	if ie.Path == "response.body" {
		msg += "; send binary bodies with body_encoding base64"
	}
	return fieldError(ie.Path, msg, err)
}

// readBody reads the whole body within MaxBodyBytes and the in-flight
// budget, in owner's share. A declared Content-Length is checked and
// reserved before a byte is read and read into a buffer of exactly that
// size, within a read deadline proportional to it when it is large
// (bodyDeadline); a body of unknown length is reserved chunk by chunk as it
// is read.
func (s *service) readBody(w http.ResponseWriter, r *http.Request, owner string) (body []byte, held int64, err error) {
	tooLarge := func(limit int64) error {
		return idem.Errorf(idem.CodePayloadTooLarge, "the request body is larger than %d bytes", limit)
	}
	unreadable := func(err error) error {
		return &idem.Error{Code: idem.CodeInvalidRequest, Detail: "the request body could not be read", Err: err}
	}
	switch n := r.ContentLength; {
	case n == 0:
		return nil, 0, nil
	case n > s.maxBody:
		return nil, 0, tooLarge(s.maxBody)
	case n > 0:
		held = n * BodyMemoryFactor
		if !s.inflight.Acquire(owner, held) {
			return nil, 0, busy()
		}
		s.bodyDeadline(w, n)
		body = make([]byte, n)
		if _, err := io.ReadFull(r.Body, body); err != nil {
			return nil, held, unreadable(err)
		}
		return body, held, nil
	}
	mb := &meteredBody{r: r.Body, budget: s.inflight, owner: owner, limit: s.maxBody}
	body, err = io.ReadAll(http.MaxBytesReader(w, io.NopCloser(mb), s.maxBody))
	held = mb.held
	var mbe *http.MaxBytesError
	switch {
	case errors.Is(err, errBusy):
		return nil, held, busy()
	case errors.As(err, &mbe):
		return nil, held, tooLarge(mbe.Limit)
	case err != nil:
		return nil, held, unreadable(err)
	}
	return body, held, nil
}

func checkJSONContentType(ct string) error {
	if ct == "application/json" {
		return nil // what ParseMediaType would say, without parsing
	}
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil || mt != "application/json" {
		return idem.Errorf(idem.CodeUnsupportedMediaType, "a request body must be sent as application/json")
	}
	return nil
}

// decodeError turns json's error for a body that is JSON but does not fit
// its request type into an invalid_request that names the field when it
// can: the JSON Pointer json reports, as a dotted path
// ("response.headers.X-A").
func decodeError(err error) error {
	var se *json.SemanticError
	if !errors.As(err, &se) {
		return &idem.Error{Code: idem.CodeInvalidRequest, Detail: "the request body is not valid for this endpoint", Err: err}
	}
	field := strings.Join(slices.Collect(se.JSONPointer.Tokens()), ".")
	switch {
	case se.Err == json.ErrUnknownName:
		// Named by the member alone, as it always was.
		return fieldError(se.JSONPointer.LastToken(), "is not a known field", err)
	case field == "":
		return &idem.Error{Code: idem.CodeInvalidRequest, Detail: "the request body is not valid for this endpoint", Err: err}
	case se.Err == errNull:
		return fieldError(field, errNull.Error(), err)
	}
	return fieldError(field, "must be of JSON type "+jsonTypeName(se.GoType), err)
}

// jsonTypeName is the JSON type a Go type decodes from.
func jsonTypeName(t reflect.Type) string {
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == nil {
		return "value"
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return "integer"
	case reflect.Float32, reflect.Float64:
		return "number"
	case reflect.String:
		return "string"
	case reflect.Bool:
		return "boolean"
	case reflect.Map, reflect.Struct:
		return "object"
	case reflect.Slice, reflect.Array:
		return "array"
	}
	return t.Kind().String()
}

// fieldError is an invalid_request naming one field.
func fieldError(field, message string, cause error) *idem.Error {
	return &idem.Error{
		Code:   idem.CodeInvalidRequest,
		Detail: field + " " + message,
		Fields: []idem.FieldError{{Field: field, Message: message}},
		Err:    cause,
	}
}

// The tenants, webhook endpoints and completers handlers are one store
// call each: answer, answerList, answerCreated and answerDone turn what
// the call returned into the endpoint's answer, its error wrapped with
// what was being done, so each handler keeps only what is its own.

// answer encodes v, or wraps err with doing.
func answer[T, J any](v T, err error, doing string, encode func(T) J) (J, error) {
	if err != nil {
		var zero J
		return zero, fmt.Errorf("%s: %w", doing, err)
	}
	return encode(v), nil
}

// answerList encodes every item of vs as one page, or wraps err with doing.
func answerList[T, J any](vs []T, err error, doing string, encode func(T) J) (listJSON[J], error) {
	return answer(vs, err, doing, func(vs []T) listJSON[J] { return listOf(vs, encode) })
}

// answerCreated answers 201 with v encoded, or wraps err with doing.
func answerCreated[T, J any](v T, err error, doing string, encode func(T) J) (reply, error) {
	body, err := answer(v, err, doing, encode)
	if err != nil {
		return reply{}, err
	}
	return reply{status: http.StatusCreated, body: body}, nil
}

// answerDone answers 204, or wraps err with doing.
func answerDone(err error, doing string) (noContent, error) {
	if err != nil {
		return noContent{}, fmt.Errorf("%s: %w", doing, err)
	}
	return noContent{}, nil
}
