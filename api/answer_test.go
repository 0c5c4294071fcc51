package api

import (
	"bytes"
	"testing"
	"time"

	"github.com/go-json-experiment/json"
	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem"
)

// TestAnswerBytes pins the bytes of a record and a claim answer as json v2
// writes them with answerOptions: what encoding/json wrote before issue 22
// moved the answers (a one-off comparison of the two on random records,
// tenants, webhooks, deliveries, audit entries and problems found no
// difference): sorted header names; <, >, & and U+2028 escaped; recovery
// data compacted; times in UTC with the fraction they have; zero times and
// absent values null; a newline at the end.
func TestAnswerBytes(t *testing.T) {
	at := time.Date(2026, 11, 29, 10, 0, 30, 120_000_000, time.FixedZone("CET", 3600))
	rec := idem.Record{
		Key: "k<1>", State: idem.StateCompleted, Operation: "POST /v1/a&b", Fingerprint: "sha256:ab", FencingToken: 2, Attempt: 1,
		RecoveryPoint: "step\u20282", RecoveryData: []byte(`{"b": [1, 2.50], "a": "<x>"}`),
		CreatedAt: at, CompletedAt: at.Add(time.Second),
		Response: &idem.Response{Status: 201, Headers: map[string]string{"X-B": "2", "Content-Type": "application/json"}, Body: []byte(`{"id":"ord_1"}`)},
	}
	encode := func(v any) string {
		var buf bytes.Buffer
		require.NoError(t, json.MarshalWrite(&buf, v, answerOptions))
		buf.WriteByte('\n')
		return buf.String()
	}
	require.Equal(t, `{"key":"k\u003c1\u003e","state":"expired","operation":"POST /v1/a\u0026b","fingerprint":"sha256:ab","fencing_token":2,"attempt":1,`+
		`"lease_expires_at":null,"recovery_point":"step\u20282","recovery_data":{"b":[1,2.50],"a":"\u003cx\u003e"},"created_at":"2026-11-29T09:00:30.12Z",`+
		`"completed_at":"2026-11-29T09:00:31.12Z","replay_until":null,"purge_after":null,`+
		`"response":{"status":201,"headers":{"Content-Type":"application/json","X-B":"2"},"body":"{\"id\":\"ord_1\"}","body_encoding":"utf8"},"review":null,"completer":null}`+"\n",
		encode(encodeRecord(rec)))
	require.Equal(t, `{"key":"k","state":"in_flight","fencing_token":1,"attempt":1,"resumed":false,"lease_expires_at":"2026-11-29T09:00:30.12Z","recovery_point":null,"recovery_data":null}`+"\n",
		encode(claimJSON{Key: "k", State: idem.StateInFlight, FencingToken: 1, Attempt: 1, LeaseExpiresAt: timeJSON(at), RecoveryData: rawOrNull(nil)}))
	require.Equal(t, `{"items":[],"next_cursor":null}`+"\n", encode(listJSON[recordJSON]{Items: []recordJSON{}}))
}
