package frontdoor

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// mapDocument is Document as it was built before the document struct:
// a map encoded by encoding/json. Kept here as the reference the struct
// must match byte for byte, so that no fingerprint changes.
func mapDocument(p Parts, rules Rules) (json.RawMessage, error) {
	doc := map[string]any{"path": latin1Text(p.Path), "query": latin1Text(p.Query)}
	if len(p.Body) > 0 && IsJSON(p.ContentType) {
		if !json.Valid(p.Body) {
			return nil, &Error{Code: CodeInvalidRequest}
		}
		body := json.RawMessage(bytes.TrimSpace(p.Body))
		for _, ptr := range rules.Exclude {
			toks, err := parsePointer(ptr)
			if err != nil {
				return nil, err
			}
			if body, err = removeRaw(body, toks); err != nil {
				return nil, err
			}
		}
		doc["body"] = body
	} else {
		sum := sha256.Sum256(p.Body)
		doc["body_sha256"] = hex.EncodeToString(sum[:])
	}
	if len(rules.Headers) > 0 {
		hs := map[string]string{}
		for _, name := range rules.Headers {
			if v := p.Header.Values(name); len(v) > 0 {
				hs[strings.ToLower(name)] = latin1Text(strings.Join(v, ", "))
			}
		}
		doc["headers"] = hs
	}
	return json.Marshal(doc)
}

// TestDocumentMatchesTheMapEncoding: the fingerprint document is the same
// bytes as the map encoding it replaced, for JSON and other bodies,
// exclusions, headers present, absent and repeated, and the characters
// encoding/json escapes or that are not UTF-8.
func TestDocumentMatchesTheMapEncoding(t *testing.T) {
	t.Parallel()
	h := http.Header{}
	h.Add("X-Tenant", "acme <&> \u2028")
	h.Add("X-Tenant", "two")
	h.Set("X-Raw", "caf\xe9")
	ct := "application/json"
	cases := []struct {
		name  string
		parts Parts
		rules Rules
	}{
		{"json body", Parts{Path: "/orders", ContentType: ct, Body: []byte(` {"amount": 1250, "currency":"EUR"} `)}, Rules{}},
		{"json body escapes", Parts{Path: "/a<b>&c", Query: "q=<x>&y=\u2028", ContentType: ct,
			Body: []byte(`{"note":"<b>&amp;</b>\u2028","n":1.50e3}`)}, Rules{}},
		{"json exclusions", Parts{Path: "/orders", ContentType: ct, Body: []byte(`{"a":1,"ts":"2026","nested":{"x":[1,2],"y":null}}`)},
			Rules{Exclude: []string{"/ts", "/nested/y", "/missing"}}},
		{"json scalar", Parts{Path: "/", ContentType: "application/problem+json", Body: []byte(`null`)}, Rules{}},
		{"not json", Parts{Path: "/upload", Query: "a=1", ContentType: "text/plain", Body: []byte("hello")}, Rules{}},
		{"empty body", Parts{Path: "/orders", ContentType: ct}, Rules{}},
		{"headers", Parts{Path: "/orders", ContentType: ct, Body: []byte(`{}`), Header: h},
			Rules{Headers: []string{"X-Tenant", "x-raw", "X-Absent"}}},
		{"headers all absent", Parts{Path: "/orders", Body: []byte("x"), Header: http.Header{}}, Rules{Headers: []string{"X-Absent"}}},
		{"not UTF-8", Parts{Path: "/caf\xe9", Query: "q=\xff", ContentType: ct, Body: []byte("{\"s\":\"\xff\"}")}, Rules{}},
	}
	for _, tc := range cases {
		want, werr := mapDocument(tc.parts, tc.rules)
		got, gerr := Document(tc.parts, tc.rules)
		require.Equal(t, werr == nil, gerr == nil, tc.name)
		require.Equal(t, string(want), string(got), tc.name)
	}
}

// BenchmarkDocument: building the fingerprint document of a small JSON
// request, the struct against the map it replaced.
// go test -run '^$' -bench Document -benchmem ./client/frontdoor/
func BenchmarkDocument(b *testing.B) {
	p := Parts{Path: "/orders", ContentType: "application/json",
		Body: []byte(`{"customer":"c-1","items":[{"sku":"a","qty":2}],"amount":1250,"currency":"EUR"}`)}
	for _, v := range []struct {
		name string
		f    func(Parts, Rules) (json.RawMessage, error)
	}{{"struct", Document}, {"map", mapDocument}} {
		b.Run(v.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := v.f(p, Rules{}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
