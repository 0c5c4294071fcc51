package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"reflect"
	"strings"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/canon"
)

// Endpoints follow the riverui apiframe pattern: each endpoint is a request
// struct and an execute function; handle does everything else.
//
// A request struct may implement binder (path and query parameters, read
// after the body so the body can never set them) and validator (checks that
// need no store). A response may implement statusCoder and headerWriter; a
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
	w.Header().Set("Cache-Control", "no-store")
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
	if err := json.NewEncoder(buf).Encode(resp); err != nil {
		// Encode writes what json.Marshal returns plus a newline.
		s.writeProblem(w, r, fmt.Errorf("encode response: %w", err))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

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
	if len(bytes.TrimSpace(body)) == 0 {
		body = []byte("{}")
	} else if err := checkJSONContentType(r.Header.Get("Content-Type")); err != nil {
		return held, err
	} else if bytes.Equal(bytes.TrimSpace(body), []byte("null")) {
		// encoding/json decodes null into a struct as "nothing to do".
		return held, idem.Errorf(idem.CodeInvalidRequest, "the request body must be a JSON object, not null")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(dst); err != nil {
		return held, decodeError(err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return held, idem.Errorf(idem.CodeInvalidRequest, "the request body holds data after the JSON value")
	}
	// encoding/json keeps the last of duplicate member names and replaces
	// invalid UTF-8 and lone surrogates silently; refuse them instead, so
	// what is fingerprinted and stored is what the caller sent.
	if err := canon.CheckIJSON(body); err != nil {
		return held, ijsonError(err)
	}
	// encoding/json takes null for "absent" everywhere; the contract allows
	// it only where a field says nullable (the JSON values request, data,
	// response.body).
	if bytes.Contains(body, []byte("null")) {
		if field := nullField(body, reflect.TypeOf(dst), ""); field != "" {
			return held, fieldError(field, "must not be null; leave it out instead", nil)
		}
	}
	return held, nil
}

var rawMessageType = reflect.TypeFor[json.RawMessage]()

// nullField returns the path of the first member of the JSON object doc
// that is null where t's field is not a json.RawMessage, or "". It follows
// nested objects into struct and map fields; doc has already decoded into
// t, so anything it cannot read is left to that decoding.
func nullField(doc []byte, t reflect.Type, path string) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	var members map[string]json.RawMessage
	if json.Unmarshal(doc, &members) != nil {
		return ""
	}
	for name, raw := range members {
		var ft reflect.Type
		switch t.Kind() {
		case reflect.Struct:
			ft = jsonField(t, name)
		case reflect.Map:
			ft = t.Elem()
		}
		if ft == nil || ft == rawMessageType {
			continue
		}
		p := name
		if path != "" {
			p = path + "." + name
		}
		if isNull(raw) {
			return p
		}
		if v := bytes.TrimSpace(raw); len(v) > 0 && v[0] == '{' {
			if f := nullField(v, ft, p); f != "" {
				return f
			}
		}
	}
	return ""
}

// jsonField returns the type of t's field that decodes the member name (as
// encoding/json matches it, embedded structs included), or nil.
func jsonField(t reflect.Type, name string) reflect.Type {
	for i := range t.NumField() {
		f := t.Field(i)
		if f.Anonymous && f.Type.Kind() == reflect.Struct {
			if ft := jsonField(f.Type, name); ft != nil {
				return ft
			}
			continue
		}
		if !f.IsExported() {
			continue
		}
		tag, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if tag == "-" {
			continue
		}
		if tag == "" {
			tag = f.Name
		}
		if strings.EqualFold(tag, name) {
			return f.Type
		}
	}
	return nil
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

// decodeError turns a JSON decoding error into an invalid_request that names
// the field when it can.
func decodeError(err error) error {
	var typeErr *json.UnmarshalTypeError
	var syntaxErr *json.SyntaxError
	switch {
	case errors.As(err, &typeErr) && typeErr.Field != "":
		return fieldError(typeErr.Field, "must be of JSON type "+jsonTypeName(typeErr.Type.Kind().String()), err)
	case errors.As(err, &syntaxErr):
		return &idem.Error{Code: idem.CodeInvalidRequest, Detail: fmt.Sprintf("malformed JSON at byte %d", syntaxErr.Offset), Err: err}
	case errors.Is(err, io.ErrUnexpectedEOF):
		return &idem.Error{Code: idem.CodeInvalidRequest, Detail: "the JSON body ends early", Err: err}
	}
	if name, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		name = strings.Trim(name, `"`)
		return fieldError(name, "is not a known field", err)
	}
	var fe *idem.Error
	if errors.As(err, &fe) {
		return fe
	}
	return &idem.Error{Code: idem.CodeInvalidRequest, Detail: "the request body is not valid for this endpoint", Err: err}
}

func jsonTypeName(kind string) string {
	switch {
	case strings.HasPrefix(kind, "int"), strings.HasPrefix(kind, "uint"):
		return "integer"
	case strings.HasPrefix(kind, "float"):
		return "number"
	case kind == "string":
		return "string"
	case kind == "bool":
		return "boolean"
	case kind == "map", kind == "struct":
		return "object"
	case kind == "slice":
		return "array"
	}
	return kind
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
