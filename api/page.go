package api

import (
	"encoding/base64"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/go-json-experiment/json"

	"github.com/idem-dev/idem"
)

// Listings are paginated by keyset: the store is asked for one row more
// than the page holds, and that extra row says whether an opaque cursor
// (the position of the page's last row) is returned for the next page.

// Page sizes of listings.
const (
	DefaultPageLimit = 50
	MaxPageLimit     = 500
)

// pageParams are the limit and cursor query parameters of a listing.
type pageParams struct {
	limit int
	after *idem.Cursor
}

// cursorJSON is the content of an opaque cursor (base64url of this JSON).
type cursorJSON struct {
	Time   time.Time `json:"t"`
	Tenant string    `json:"n,omitempty"`
	Key    string    `json:"k"`
	ID     int64     `json:"i,omitempty"`
}

func encodeCursor(c idem.Cursor) *string {
	b, _ := json.Marshal(cursorJSON{Time: c.Time.UTC(), Tenant: c.TenantID, Key: c.Key, ID: c.ID})
	s := base64.RawURLEncoding.EncodeToString(b)
	return &s
}

func (p *pageParams) bind(r *http.Request) (err error) {
	p.limit, err = bindPage(r.URL.Query(), func(b []byte) error {
		var c cursorJSON
		err := json.Unmarshal(b, &c)
		if err == nil && c.Time.IsZero() {
			err = fmt.Errorf("incomplete cursor")
		}
		if err == nil {
			// The cursor's text goes to the store as a query parameter:
			// hold it to the rules of what it names.
			err = idem.ValidateKey(c.Key)
		}
		if err == nil && c.Tenant != "" {
			err = idem.ValidateTenantID(c.Tenant)
		}
		if err == nil {
			p.after = &idem.Cursor{Time: c.Time, TenantID: c.Tenant, Key: c.Key, ID: c.ID}
		}
		return err
	})
	return err
}

// bindPage binds ?limit= and hands ?cursor=, when there is one, to decode
// as the bytes its base64url text holds: a cursor that is not base64url,
// or that decode refuses, is an invalid_request naming it.
func bindPage(q url.Values, decode func([]byte) error) (int, error) {
	limit, err := bindLimit(q)
	if err != nil {
		return 0, err
	}
	if v := q.Get("cursor"); v != "" {
		b, err := base64.RawURLEncoding.DecodeString(v)
		if err == nil {
			err = decode(b)
		}
		if err != nil {
			return 0, fieldError("cursor", "is not a cursor returned by this endpoint", err)
		}
	}
	return limit, nil
}

// pageOf returns the page of a listing from the rows the store returned for
// a limit of limit+1: at most limit items, and a cursor after the last one
// when the extra row shows that more follow.
func pageOf[R, T any](recs []R, limit int, encode func(R) T, cursor func(last R) idem.Cursor) listJSON[T] {
	if len(recs) <= limit {
		return listOf(recs, encode)
	}
	out := listOf(recs[:limit], encode)
	out.NextCursor = encodeCursor(cursor(recs[limit-1]))
	return out
}

// listOf is a listing of all of recs, encoded by encode, without a next
// page.
func listOf[R, T any](recs []R, encode func(R) T) listJSON[T] {
	out := listJSON[T]{Items: make([]T, 0, len(recs))}
	for _, r := range recs {
		out.Items = append(out.Items, encode(r))
	}
	return out
}

// bindAll binds the parts of a request in turn; the first error is the
// answer.
func bindAll(r *http.Request, parts ...binder) error {
	for _, p := range parts {
		if err := p.bind(r); err != nil {
			return err
		}
	}
	return nil
}

// bindLimit reads the page size of ?limit=: DefaultPageLimit when absent.
func bindLimit(q url.Values) (int, error) {
	if !q.Has("limit") {
		return DefaultPageLimit, nil
	}
	n, err := strconv.Atoi(q.Get("limit"))
	if err != nil || n < 1 || n > MaxPageLimit {
		return 0, fieldError("limit", fmt.Sprintf("must be an integer between 1 and %d", MaxPageLimit), err)
	}
	return n, nil
}

// bindTenantFilter reads the optional ?tenant= of the operator's listings:
// "" when absent.
func bindTenantFilter(q url.Values) (string, error) {
	if !q.Has("tenant") {
		return "", nil
	}
	v := q.Get("tenant")
	if err := idem.ValidateTenantID(v); err != nil {
		return "", fieldError("tenant", "must be 1-64 characters of [a-z0-9_-]", err)
	}
	return v, nil
}

// bindID reads the {id} of a tenant's webhook endpoint or completer: 1-64
// characters; what says what it names, for the error.
func bindID(r *http.Request, what string) (string, error) {
	id := chi.URLParam(r, "id")
	if id == "" || len(id) > 64 {
		return "", fieldError("id", "must be a "+what+" id", nil)
	}
	return id, nil
}

// listJSON is a page of a listing.
type listJSON[T any] struct {
	Items      []T     `json:"items"`
	NextCursor *string `json:"next_cursor"`
}
