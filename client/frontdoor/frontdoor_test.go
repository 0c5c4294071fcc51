package frontdoor_test

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem/client/frontdoor"
)

func TestKeyForAppliesTheMethodRequirement(t *testing.T) {
	req := func(method, key string) *http.Request {
		r := httptest.NewRequest(method, "/x", nil)
		if key != "" {
			r.Header.Set(frontdoor.HeaderKey, key)
		}
		return r
	}
	m := frontdoor.Methods{}
	_, _, err := m.KeyFor(req(http.MethodPost, ""))
	assert.True(t, errors.Is(err, &frontdoor.Error{Code: frontdoor.CodeKeyMissing}))

	key, protected, err := m.KeyFor(req(http.MethodPost, `"k1"`))
	require.NoError(t, err)
	assert.True(t, protected)
	assert.Equal(t, "k1", key)

	_, protected, err = m.KeyFor(req(http.MethodPut, ""))
	require.NoError(t, err)
	assert.False(t, protected, "PUT without a key passes")

	_, _, err = m.KeyFor(req(http.MethodDelete, "a,b"))
	assert.True(t, errors.Is(err, &frontdoor.Error{Code: frontdoor.CodeInvalidKey}), "a malformed key on an optional method is refused")

	_, protected, err = m.KeyFor(req(http.MethodGet, "a,b"))
	require.NoError(t, err)
	assert.False(t, protected, "GET is never claimed, whatever its key")

	custom := frontdoor.Methods{Required: []string{http.MethodPut}, Optional: []string{}}
	assert.Equal(t, frontdoor.Required, custom.For(http.MethodPut))
	assert.Equal(t, frontdoor.Pass, custom.For(http.MethodPost))
	assert.Equal(t, frontdoor.Pass, frontdoor.Methods{Required: []string{http.MethodGet}}.For(http.MethodGet), "safe methods always pass")
}

func TestRouteUsesTheServeMuxPattern(t *testing.T) {
	mux := http.NewServeMux()
	var got string
	mux.HandleFunc("POST example.com/orders/{id}", func(w http.ResponseWriter, r *http.Request) { got = frontdoor.Route(r) })
	mux.HandleFunc("/plain/", func(w http.ResponseWriter, r *http.Request) { got = frontdoor.Route(r) })
	mux.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodPost, "http://example.com/orders/7?x=1", nil))
	assert.Equal(t, "/orders/{id}", got)
	mux.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodPost, "/plain/a/b", nil))
	assert.Equal(t, "/plain/", got)
	assert.Equal(t, "/no/pattern", frontdoor.Route(httptest.NewRequest(http.MethodPost, "/no/pattern?q=1", nil)))
}

func TestWriteReplay(t *testing.T) {
	r := httptest.NewRequest(http.MethodPost, "/x", nil)
	w := httptest.NewRecorder()
	frontdoor.WriteReplay(w, r, http.StatusCreated, map[string]string{"Content-Type": "application/json", "ETag": `"v1"`}, []byte(`{"id":1}`))
	assert.Equal(t, http.StatusCreated, w.Code)
	assert.Equal(t, "true", w.Header().Get(frontdoor.HeaderReplayed))
	assert.Equal(t, `"v1"`, w.Header().Get("ETag"))
	assert.Equal(t, `{"id":1}`, w.Body.String())

	w = httptest.NewRecorder()
	frontdoor.WriteReplay(w, r, http.StatusOK, map[string]string{frontdoor.HeaderNotReplayable: "body of 9000000 bytes not stored"}, nil)
	assert.Equal(t, http.StatusConflict, w.Code)
	assert.Contains(t, w.Body.String(), `"code":"response_not_replayable"`)
}

func TestWriteProblemRetryAfterAndRequestID(t *testing.T) {
	r := httptest.NewRequest(http.MethodPost, "/x", nil)
	r.Header.Set(frontdoor.HeaderRequestID, "bad id with spaces")
	w := httptest.NewRecorder()
	frontdoor.WriteProblem(w, r, &frontdoor.Error{Code: frontdoor.CodeRequestInFlight, RetryAfter: 2100e6})
	assert.Equal(t, "3", w.Header().Get("Retry-After"), "rounded up to whole seconds")
	id := w.Header().Get(frontdoor.HeaderRequestID)
	assert.Len(t, id, 32, "an invalid caller id is replaced")
	assert.Contains(t, w.Body.String(), `"instance":"urn:idem:request:`+id+`"`)
}

func TestRulesValidate(t *testing.T) {
	assert.NoError(t, frontdoor.Rules{Exclude: []string{"/a/b~1c"}, Headers: []string{"X-Account-Id"}}.Validate())
	assert.Error(t, frontdoor.Rules{Exclude: []string{"a"}}.Validate())
	assert.Error(t, frontdoor.Rules{Exclude: []string{""}}.Validate())
	assert.Error(t, frontdoor.Rules{Exclude: []string{"/a~2"}}.Validate())
	assert.Error(t, frontdoor.Rules{Headers: []string{"X Bad"}}.Validate())
}

func TestDocumentExclusionKeepsTheRestRaw(t *testing.T) {
	body := "{ \"a\":1, \"ts\":{\"x\":1}, \"a\":2,\"l\":[ {\"ts\":1,\"k\":\"\\ud800\"}, 2 ], \"n\":1e400 }"
	doc, err := frontdoor.Document(frontdoor.Parts{Path: "/p", ContentType: "application/json", Body: []byte(body)},
		frontdoor.Rules{Exclude: []string{"/ts", "/l/0/ts", "/l/1", "/missing/x"}})
	require.NoError(t, err)
	var got struct {
		Body json.RawMessage `json:"body"`
	}
	require.NoError(t, json.Unmarshal(doc, &got))
	assert.Equal(t, `{"a":1,"a":2,"l":[{"k":"\ud800"}],"n":1e400}`, string(got.Body),
		"duplicates, lone surrogates and out-of-range numbers reach the fingerprinter as sent")

	_, err = frontdoor.Document(frontdoor.Parts{ContentType: "application/json", Body: []byte(`{"a":`)}, frontdoor.Rules{Exclude: []string{"/a"}})
	assert.True(t, errors.Is(err, &frontdoor.Error{Code: frontdoor.CodeInvalidRequest}))
}

// TestStoredHeadersRoundTripBytes: whatever bytes a header value holds
// (ASCII, UTF-8, Latin-1 obs-text), the stored text is valid UTF-8 for the
// contract's JSON and WriteReplay sends the same bytes again; a value
// stored by other means with characters past Latin-1 is sent as its UTF-8.
func TestStoredHeadersRoundTripBytes(t *testing.T) {
	for _, v := range []string{"text/plain", "attachment; filename=\"r\xe9sum\xe9.pdf\"", "inline; filename=\"résumé.pdf\"", "\xff\x80\xc3"} {
		h := http.Header{}
		h.Set("Content-Disposition", v)
		stored := frontdoor.StoredHeaders(h, nil)
		b, err := json.Marshal(stored)
		require.NoError(t, err)
		var back map[string]string
		require.NoError(t, json.Unmarshal(b, &back))
		require.Equal(t, stored, back, "the stored text survives JSON")
		w := httptest.NewRecorder()
		frontdoor.WriteReplay(w, httptest.NewRequest(http.MethodPost, "/x", nil), 200, back, nil)
		assert.Equal(t, v, w.Header().Get("Content-Disposition"))
	}
	w := httptest.NewRecorder()
	frontdoor.WriteReplay(w, httptest.NewRequest(http.MethodPost, "/x", nil), 200, map[string]string{"Content-Disposition": "price in €"}, nil)
	assert.Equal(t, "price in €", w.Header().Get("Content-Disposition"))
}
