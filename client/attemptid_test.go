package client_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"regexp"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem/client"
)

// claimRecorder answers claims 201 (with failEvery > 0: every
// failEvery-th request from the first on is a retryable 503 instead) and
// records every attempt_id it was sent ("-" when none).
type claimRecorder struct {
	mu  sync.Mutex
	ids []string
}

func (cr *claimRecorder) server(t *testing.T, failEvery int) *httptest.Server {
	t.Helper()
	n := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body map[string]any
		require.NoError(t, json.NewDecoder(r.Body).Decode(&body))
		cr.mu.Lock()
		id, ok := body["attempt_id"].(string)
		if !ok {
			id = "-"
		}
		cr.ids = append(cr.ids, id)
		n++
		fail := failEvery > 0 && n%failEvery == 1
		cr.mu.Unlock()
		if fail {
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte(`{"title":"x","status":503,"code":"store_unavailable","retryable":true}`))
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"key":"k","state":"in_flight","fencing_token":1,"attempt":1}`))
	}))
	t.Cleanup(srv.Close)
	return srv
}

func (cr *claimRecorder) sent() []string {
	cr.mu.Lock()
	defer cr.mu.Unlock()
	return append([]string(nil), cr.ids...)
}

var uuidV4 = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

func TestClaimSendsOneRandomAttemptIDPerCall(t *testing.T) {
	ctx := context.Background()
	rec := &claimRecorder{}
	srv := rec.server(t, 2) // every call's first attempt fails and is retried
	c, _, _ := newTestClient(t, srv.URL, client.RetryPolicy{})
	_, err := c.Claim(ctx, "k", client.Request{})
	require.NoError(t, err)
	_, err = c.Claim(ctx, "k", client.Request{})
	require.NoError(t, err)
	ids := rec.sent()
	require.Len(t, ids, 4)
	require.Regexp(t, uuidV4, ids[0])
	require.Equal(t, ids[0], ids[1], "a retry of one call sends the same attempt_id")
	require.Equal(t, ids[2], ids[3])
	require.NotEqual(t, ids[0], ids[2], "another call, another attempt_id")

	_, err = c.Claim(ctx, "k", client.Request{AttemptID: "mine"})
	require.NoError(t, err)
	require.Equal(t, []string{"mine", "mine"}, rec.sent()[4:], "the caller's own is sent as is")
}

func TestWithAttemptIDsOffSendsNone(t *testing.T) {
	rec := &claimRecorder{}
	srv := rec.server(t, 0)
	c, _, _ := newTestClient(t, srv.URL, client.RetryPolicy{}, client.WithAttemptIDs(false))
	_, err := c.Claim(context.Background(), "k", client.Request{})
	require.NoError(t, err)
	require.Equal(t, []string{"-"}, rec.sent())
}
