package client_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem/client"
)

// A complete's 2xx answer as idem sends it: the whole record with the
// response it has just stored.
const completedRecord = `{"key":"k","state":"completed","operation":"op","fingerprint":"sha256:x","fencing_token":7,"attempt":1,` +
	`"created_at":"2026-12-01T10:00:00Z","completed_at":"2026-12-01T10:00:01Z","replay_until":"2026-12-02T10:00:01Z",` +
	`"purge_after":"2026-12-03T10:00:01Z","response":{"status":201,"headers":{"Content-Type":"application/json"},` +
	`"body":"{\"id\":\"order-1\",\"amount\":1250,\"currency\":\"EUR\"}","body_encoding":"utf8"}}`

// TestCompleteNoRecordChecksTheState: CompleteNoRecord (what Do and
// idemhttp call) does not decode the record, but a 2xx answer that is not
// a completed record is ErrInvalidAnswer, never a success: the caller
// would tell its client the response was stored. Do, which took any 2xx
// answer to its complete, says so too.
func TestCompleteNoRecordChecksTheState(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, answer string
		ok           bool
	}{
		{"completed record", completedRecord, true},
		{"in flight", `{"key":"k","state":"in_flight","fencing_token":7,"attempt":1}`, false},
		{"no state", `{"key":"k","fencing_token":7}`, false},
		{"null", `null`, false},
		{"not an object", `["completed"]`, false},
		{"not JSON", `{"state":"completed"`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var completes atomic.Int64
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				if strings.HasSuffix(r.URL.Path, "/complete") {
					completes.Add(1)
					_, _ = io.WriteString(w, tc.answer)
					return
				}
				w.WriteHeader(http.StatusCreated)
				_, _ = io.WriteString(w, `{"key":"k","state":"in_flight","fencing_token":7,"attempt":1}`)
			}))
			defer srv.Close()
			c, err := client.New(srv.URL, client.WithRetryPolicy(client.RetryPolicy{MaxAttempts: 1, BaseDelay: time.Millisecond}))
			require.NoError(t, err)
			err = c.CompleteNoRecord(context.Background(), "k", 7, client.Response{Status: 201})
			_, derr := c.Do(context.Background(), "k", client.Request{Operation: "op", Fingerprint: "x"},
				func(context.Context, *client.Claim) (client.Response, error) {
					return client.Response{Status: 201}, nil
				})
			require.Equal(t, int64(2), completes.Load())
			if tc.ok {
				require.NoError(t, err)
				require.NoError(t, derr)
				return
			}
			require.ErrorIs(t, err, client.ErrInvalidAnswer)
			require.ErrorIs(t, derr, client.ErrInvalidAnswer)
		})
	}
}

// BenchmarkCompleteAnswer: what reading a complete's answer costs a
// caller, the whole record (Complete) against the state alone
// (CompleteNoRecord). go test -run '^$' -bench CompleteAnswer -benchmem ./client/
func BenchmarkCompleteAnswer(b *testing.B) {
	data := []byte(completedRecord)
	b.Run("record", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var r client.Record
			if err := json.Unmarshal(data, &r); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("state", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var a struct {
				State client.State `json:"state"`
			}
			if err := json.Unmarshal(data, &a); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkClaimAnswer: decoding a claim's 201 answer.
// go test -run '^$' -bench ClaimAnswer -benchmem ./client/
func BenchmarkClaimAnswer(b *testing.B) {
	data := []byte(`{"key":"k","state":"in_flight","operation":"op","fingerprint":"sha256:x","fencing_token":7,"attempt":2,` +
		`"resumed":true,"lease_expires_at":"2026-12-01T10:00:30Z","recovery_point":"charged","recovery_data":{"charge":"ch_1"},` +
		`"created_at":"2026-12-01T10:00:00Z","purge_after":"2026-12-03T10:00:00Z"}`)
	b.ReportAllocs()
	for b.Loop() {
		var cr client.ClaimResult
		if err := json.Unmarshal(data, &cr); err != nil {
			b.Fatal(err)
		}
	}
}

// TestClaimAnswerDecodes: a claim's answer decodes to the record, resumed
// and recovery data as sent; a null recovery_data is none.
func TestClaimAnswerDecodes(t *testing.T) {
	t.Parallel()
	var cr client.ClaimResult
	require.NoError(t, json.Unmarshal([]byte(`{"key":"k","state":"in_flight","fencing_token":7,"attempt":2,"resumed":true,`+
		`"lease_expires_at":"2026-12-01T10:00:30Z","recovery_point":"charged","recovery_data":{"charge":"ch_1"}}`), &cr))
	require.Equal(t, "k", cr.Key)
	require.Equal(t, client.StateInFlight, cr.State)
	require.Equal(t, int64(7), cr.FencingToken)
	require.Equal(t, 2, cr.Attempt)
	require.True(t, cr.Resumed)
	require.Equal(t, "charged", cr.RecoveryPoint)
	require.JSONEq(t, `{"charge":"ch_1"}`, string(cr.RecoveryData))
	require.Equal(t, time.Date(2026, 12, 1, 10, 0, 30, 0, time.UTC), cr.LeaseExpiresAt.UTC())
	cr = client.ClaimResult{}
	require.NoError(t, json.Unmarshal([]byte(`{"key":"k","state":"in_flight","fencing_token":1,"attempt":1,"recovery_data":null}`), &cr))
	require.Nil(t, cr.RecoveryData)
	require.False(t, cr.Resumed)
	require.Error(t, json.Unmarshal([]byte(`{"key":"k","state":"in_flight","fencing_token":"1"}`), &cr))
}
