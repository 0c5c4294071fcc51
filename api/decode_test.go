package api_test

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/auth"
)

// TestBodyRefusals pins the problem of each kind of body the decoder
// refuses, detail and field, through real HTTP: what issue 22 moved onto
// json v2 (unknown members, duplicate names, invalid UTF-8 and lone
// surrogates, null, wrong types, data after the value) answers as it did
// on encoding/json. When a body has several problems, the first check to
// fail names it: syntax, then the request's shape, then trailing data,
// then I-JSON, then null.
func TestBodyRefusals(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tok := b.token(t, "acme", auth.ScopeKeysWrite)
	token := b.claim(t, tok, "held", nil)
	require.Equal(t, int64(1), token)

	cases := []struct {
		name, path, body, detail, field string
	}{
		{"unknown member", "claim", `{"operation":"x","colour":"red"}`, "colour is not a known field", "colour"},
		{"unknown member, nested: named alone", "complete", `{"fencing_token":1,"response":{"status":200,"colour":1}}`, "colour is not a known field", "colour"},
		{"names are matched exactly", "claim", `{"Operation":"x"}`, "Operation is not a known field", "Operation"},
		{"wrong type", "claim", `{"lease_seconds":"30"}`, "lease_seconds must be of JSON type integer", "lease_seconds"},
		{"wrong type, nested", "complete", `{"fencing_token":1,"response":{"status":"200"}}`, "response.status must be of JSON type integer", "response.status"},
		{"wrong type, object", "complete", `{"fencing_token":1,"response":5}`, "response must be of JSON type object", "response"},
		{"wrong type, a header", "complete", `{"fencing_token":1,"response":{"status":200,"headers":{"X-A":1}}}`, "response.headers.X-A must be of JSON type string", "response.headers.X-A"},
		{"not an integer", "release", `{"fencing_token":1.5}`, "fencing_token must be of JSON type integer", "fencing_token"},
		{"not an object", "claim", `[1,2]`, "the request body is not valid for this endpoint", ""},
		{"null body", "claim", `null`, "the request body must be a JSON object, not null", ""},
		{"null member", "claim", `{"operation":null}`, "operation must not be null; leave it out instead", "operation"},
		{"null header", "complete", `{"fencing_token":1,"response":{"status":200,"headers":{"X-A":null}}}`, "response.headers.X-A must not be null; leave it out instead", "response.headers.X-A"},
		{"duplicate member", "checkpoint", `{"fencing_token":1,"fencing_token":1,"recovery_point":"p"}`, "fencing_token is given more than once; duplicate member names are not I-JSON", "fencing_token"},
		{"duplicate in data", "checkpoint", `{"fencing_token":1,"recovery_point":"p","data":{"v":1,"v":2}}`, "data.v is given more than once; duplicate member names are not I-JSON", "data.v"},
		{"invalid UTF-8", "checkpoint", "{\"fencing_token\":1,\"recovery_point\":\"p\",\"data\":[\"\xff\"]}", "data[0] is a string that is not valid UTF-8 (byte 0xff at offset 49)", "data[0]"},
		{"lone surrogate in a body", "complete", `{"fencing_token":1,"response":{"status":200,"body":"\ud800"}}`, "response.body is a string that holds the lone UTF-16 surrogate \\ud800; send binary bodies with body_encoding base64", "response.body"},
		{"trailing data", "claim", `{"operation":"x"} {}`, "the request body holds data after the JSON value", ""},
		{"trailing garbage", "claim", `{"operation":"x"}x`, "the request body holds data after the JSON value", ""},
		{"ends early", "claim", `{"operation":`, "the JSON body ends early", ""},
		{"malformed", "claim", `{"operation":"x",}`, "malformed JSON at byte 18", ""},
		// The first check to fail names the problem.
		{"syntax before type", "claim", `{"lease_seconds":"x","a":}`, "malformed JSON at byte 26", ""},
		{"type before trailing data", "claim", `{"lease_seconds":"x"} {}`, "lease_seconds must be of JSON type integer", "lease_seconds"},
		{"unknown before duplicate", "claim", `{"operation":"x","operation":"y","colour":1}`, "colour is not a known field", "colour"},
		{"trailing data before duplicate", "claim", `{"operation":"x","operation":"y"} 1`, "the request body holds data after the JSON value", ""},
		{"null after the string \"null\"", "claim", `{"operation":"null","attempt_id":null}`, "attempt_id must not be null; leave it out instead", "attempt_id"},
		{"the string \"null\" beside an unknown member", "claim", `{"operation":"null","colour":"red"}`, "colour is not a known field", "colour"},
		{"duplicate before null", "claim", `{"operation":null,"attempt_id":"a","attempt_id":"b"}`, "attempt_id is given more than once; duplicate member names are not I-JSON", "attempt_id"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := b.req(t, http.MethodPost, "/v1/keys/held/"+tc.path, tok, tc.body)
			p := requireProblem(t, r, http.StatusBadRequest, idem.CodeInvalidRequest, false)
			require.Equal(t, tc.detail, p["detail"], "body %s", tc.body)
			if tc.field == "" {
				return
			}
			requireField(t, p, tc.field)
			require.Len(t, p["errors"], 1)
		})
	}

	// Nothing of the refused requests was stored: the key is still held
	// by its first claim.
	r := b.req(t, http.MethodGet, "/v1/keys/held", b.token(t, "acme", auth.ScopeKeysRead), nil)
	require.Equal(t, "in_flight", r.json(t)["state"])
	require.Equal(t, float64(1), r.json(t)["fencing_token"])
	require.Nil(t, r.json(t)["recovery_point"])
}
