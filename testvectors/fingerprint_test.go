// Package testvectors_test checks the shared front-door vectors against the
// server's fingerprint: the fingerprint each vector expects must be
// canon.Fingerprint of the document client/frontdoor builds, the value
// the idem server computes for a claim whose request is that document.
package testvectors_test

import (
	"encoding/base64"
	"encoding/json"
	"net/http"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem/canon"
	"github.com/idem-dev/idem/client/frontdoor"
	"github.com/idem-dev/idem/testvectors"
)

func TestFingerprintVectorsMatchTheServer(t *testing.T) {
	b, err := os.ReadFile("frontdoor/fingerprint.json")
	require.NoError(t, err)
	var file struct {
		Vectors []struct {
			Name        string              `json:"name"`
			Path        string              `json:"path"`
			Query       string              `json:"query"`
			ContentType string              `json:"content_type"`
			Body        *string             `json:"body"`
			BodyBase64  string              `json:"body_base64"`
			Headers     map[string][]string `json:"headers"`
			Rules       frontdoor.Rules     `json:"rules"`
			Expect      struct {
				Document    json.RawMessage `json:"document"`
				Fingerprint string          `json:"fingerprint"`
				Error       string          `json:"error"`
			} `json:"expect"`
		} `json:"vectors"`
	}
	require.NoError(t, json.Unmarshal(b, &file))
	require.NotEmpty(t, file.Vectors)
	for _, v := range file.Vectors {
		t.Run(v.Name, func(t *testing.T) {
			p := frontdoor.Parts{Path: v.Path, Query: v.Query, ContentType: v.ContentType, Header: http.Header(v.Headers)}
			if v.Body != nil {
				p.Body = []byte(*v.Body)
			} else {
				p.Body, err = base64.StdEncoding.DecodeString(v.BodyBase64)
				require.NoError(t, err)
			}
			if p.Header == nil {
				p.Header = http.Header{}
			}
			for k, vs := range p.Header {
				p.Header[http.CanonicalHeaderKey(k)] = vs
			}
			doc, err := frontdoor.Document(p, v.Rules)
			if v.Expect.Error != "" {
				// Malformed JSON is refused while the document is built;
				// a well-formed body that is not I-JSON is embedded as
				// sent and refused by the fingerprint (the server's rule).
				if err == nil {
					_, err = canon.Fingerprint(doc)
				}
				require.Error(t, err, "document %s", doc)
				return
			}
			require.NoError(t, err)
			got, err := canon.Fingerprint(doc)
			require.NoError(t, err)
			assert.Equal(t, v.Expect.Fingerprint, got)
			// The expected document itself has the same fingerprint.
			want, err := canon.Fingerprint(v.Expect.Document)
			require.NoError(t, err)
			assert.Equal(t, v.Expect.Fingerprint, want)
		})
	}
}

// TestTargetVectorsMatchTheServer: the fingerprint each request-target
// vector expects is canon.Fingerprint of the document client/frontdoor
// builds from the expected path and query, and frontdoor.Target reads that
// path and query from the request line.
func TestTargetVectorsMatchTheServer(t *testing.T) {
	for _, v := range testvectors.Targets(t) {
		t.Run(v.Name, func(t *testing.T) {
			r := &http.Request{Method: http.MethodPost, RequestURI: v.Target}
			path, query := frontdoor.Target(r)
			doc, err := frontdoor.Document(frontdoor.Parts{Path: path, Query: query, ContentType: "application/json", Body: []byte("{}"), Header: http.Header{}}, frontdoor.Rules{})
			require.NoError(t, err)
			var got struct{ Path, Query string }
			require.NoError(t, json.Unmarshal(doc, &got))
			assert.Equal(t, v.Expect.Path, got.Path)
			assert.Equal(t, v.Expect.Query, got.Query)
			fp, err := canon.Fingerprint(doc)
			require.NoError(t, err)
			assert.Equal(t, v.Expect.Fingerprint, fp)
		})
	}
}
