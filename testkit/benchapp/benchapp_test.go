package benchapp_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem/testkit/benchapp"
	"github.com/idem-dev/idem/testkit/pgtest"
)

// TestLibrary: the bench's in-process layer is a fair yardstick only if it
// keeps the promises idem keeps: one handler run per key under concurrent
// retries, the stored answer replayed, another request under the key
// refused.
func TestLibrary(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, err := pgxpool.New(ctx, pgtest.URL(t))
	require.NoError(t, err)
	t.Cleanup(db.Close)
	require.NoError(t, benchapp.Migrate(ctx, db))
	h, err := benchapp.New(benchapp.Config{Variant: benchapp.Library, DB: db})
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)

	post := func(key, body string) (int, string, http.Header) {
		req, err := http.NewRequest(http.MethodPost, srv.URL+"/orders", strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Idempotency-Key", key)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(b), resp.Header
	}
	const body = `{"amount":1000,"currency":"usd"}`

	// 16 keys, each sent by 8 callers released at once.
	var wg sync.WaitGroup
	start := make(chan struct{})
	statuses := make([]int, 16*8)
	for i := range statuses {
		wg.Go(func() {
			<-start
			statuses[i], _, _ = post(fmt.Sprintf("k%d", i/8), body)
		})
	}
	close(start)
	wg.Wait()
	for _, s := range statuses {
		require.Contains(t, []int{http.StatusCreated, http.StatusConflict}, s, "a fresh run, a replay or 409 in progress")
	}
	var orders int
	require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM orders`).Scan(&orders))
	require.Equal(t, 16, orders, "one handler run per key")

	status, first, hdr := post("k1", body)
	require.Equal(t, http.StatusCreated, status)
	require.Equal(t, "true", hdr.Get("Idempotent-Replayed"))
	status, again, _ := post("k1", body)
	require.Equal(t, http.StatusCreated, status)
	require.Equal(t, first, again, "the stored answer, byte for byte")
	status, _, _ = post("k1", `{"amount":2000,"currency":"usd"}`)
	require.Equal(t, http.StatusUnprocessableEntity, status, "the key with another request")
	status, _, _ = post("fresh", body)
	require.Equal(t, http.StatusCreated, status)
	require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM orders`).Scan(&orders))
	require.Equal(t, 17, orders, "one handler run per key")
}
