package postgres

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/eventpayload"
	"github.com/idem-dev/idem/storetest"
	"github.com/idem-dev/idem/testkit/pgtest"
)

// The tests of this file put two of the store's transactions in the order
// that would deadlock if they took their row locks in opposite orders: a
// blocker's transaction holds one row, the first call queues on it, the
// second call starts, and the blocker lets go. Deleting a tenant locks its
// row, then (cascades, in creation order) its records, its endpoints and
// their deliveries; every transaction that locks more than one of these
// must take them in that order. On SQLite one writer at a time cannot
// deadlock.

// lockOrderStore opens a store whose connections carry a unique
// application_name, so the test can see when they wait on a lock, and a
// second connection to the same schema for the blocker and the monitor.
func lockOrderStore(t *testing.T) (store *Store, dsn, app string) {
	t.Helper()
	var b [4]byte
	_, _ = rand.Read(b[:])
	app = "idem_lockorder_" + hex.EncodeToString(b[:])
	dsn = pgtest.URL(t)
	store = openStore(t, dsn+"&application_name="+app, Options{})
	storetest.CreateTenant(t, store, "acme")
	return store, dsn, app
}

// waitLockWaiters waits until n of app's backends wait on a lock.
func waitLockWaiters(t *testing.T, monitor *pgx.Conn, app string, n int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		var waiting int
		require.NoError(t, monitor.QueryRow(context.Background(),
			"SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock'", app).Scan(&waiting))
		if waiting >= n {
			return
		}
		require.True(t, time.Now().Before(deadline), "%d of the store's calls wait on a lock, want %d", waiting, n)
		time.Sleep(10 * time.Millisecond)
	}
}

// blockRow opens a transaction that locks rows with lockSQL and returns
// a function that commits it.
func blockRow(t *testing.T, dsn, lockSQL string, args ...any) (release func()) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(ctx) })
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	tag, err := tx.Exec(ctx, lockSQL, args...)
	require.NoError(t, err)
	require.Equal(t, int64(1), tag.RowsAffected(), "the blocker locks one row")
	return func() { require.NoError(t, tx.Commit(ctx)) }
}

func monitorConn(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), dsn)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// TestLockOrderTenantDeleteAndDeliveryFinish: a delivery's outcome is
// recorded while its tenant is deleted. Finishing updated the delivery,
// then the endpoint's failure streak; the delete's cascade locks the
// endpoint, then its deliveries: a deadlock, and PostgreSQL aborted one of
// them (the operator's DELETE answered 500, seen in the OpenAPI fuzz).
func TestLockOrderTenantDeleteAndDeliveryFinish(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, dsn, app := lockOrderStore(t)
	ep, err := store.CreateWebhookEndpoint(ctx, idem.WebhookEndpoint{
		TenantID: "acme", ID: idem.NewWebhookEndpointID(), URL: "https://hooks.example.com/acme",
		Secret: idem.NewWebhookSecret(), Enabled: true,
	})
	require.NoError(t, err)
	ev, err := eventpayload.NewEvent("acme", idem.EventWebhookTest, time.Now(), map[string]string{"hello": "world"})
	require.NoError(t, err)
	_, err = store.SendTestEvent(ctx, idem.SendTestEventParams{EndpointID: ep.ID, Event: ev})
	require.NoError(t, err)
	claimed, err := store.ClaimWebhookDeliveries(ctx, idem.ClaimWebhookDeliveriesParams{Limit: 10, PerTenant: 10, Served: nil, Lease: time.Minute})
	require.NoError(t, err)
	require.Len(t, claimed, 1)

	monitor := monitorConn(t, dsn)
	release := blockRow(t, dsn, "SELECT 1 FROM webhook_endpoints WHERE id = $1 FOR NO KEY UPDATE", ep.ID)
	deleted := make(chan error, 1)
	go func() { deleted <- store.DeleteTenant(ctx, idem.DeleteTenantParams{ID: "acme"}) }()
	waitLockWaiters(t, monitor, app, 1)
	finished := make(chan error, 1)
	go func() {
		finished <- store.FinishWebhookDelivery(ctx, idem.FinishWebhookDeliveryParams{
			ID: claimed[0].ID, Attempts: claimed[0].Attempts, OK: false, Status: 500, Error: "HTTP 500",
			RetryIn: time.Minute, DisableAfter: time.Hour, DisableMinFailures: 100,
		})
	}()
	waitLockWaiters(t, monitor, app, 2)
	release()

	require.NoError(t, <-deleted, "deleting the tenant")
	require.NoError(t, <-finished, "finishing the delivery of a tenant deleted meanwhile")
	_, err = store.GetTenant(ctx, idem.GetTenantParams{ID: "acme"})
	require.ErrorIs(t, err, idem.ErrTenantNotFound)
	var left int
	require.NoError(t, monitor.QueryRow(ctx, "SELECT (SELECT count(*) FROM webhook_deliveries) + (SELECT count(*) FROM webhook_endpoints)").Scan(&left))
	require.Zero(t, left, "the tenant's endpoints and deliveries went with it")
}

// TestLockOrderTenantDeleteAndResolve: an operator resolves an orphan
// while its tenant is deleted. The resolution locked the record, then
// (audit entry, outbox event) took a share of the tenant's row; the
// delete holds the tenant's row and cascades to the record: a deadlock.
func TestLockOrderTenantDeleteAndResolve(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, dsn, app := lockOrderStore(t)
	p := storetest.ClaimParams("acme", "orphan")
	p.Lease = time.Millisecond
	res, err := store.Claim(ctx, p)
	require.NoError(t, err)
	time.Sleep(5 * time.Millisecond) // the lease runs out: an orphan

	monitor := monitorConn(t, dsn)
	release := blockRow(t, dsn, "SELECT 1 FROM idempotency_keys WHERE tenant_id = 'acme' AND key = 'orphan' FOR NO KEY UPDATE")
	resolved := make(chan error, 1)
	go func() {
		_, err := store.Resolve(ctx, idem.ResolveParams{
			TenantID: "acme", Key: "orphan", FencingToken: res.Record.FencingToken,
			Action: idem.ResolveRelease, Note: "the charge never happened", Actor: idem.Actor{Subject: "ops"},
		})
		resolved <- err
	}()
	waitLockWaiters(t, monitor, app, 1)
	deleted := make(chan error, 1)
	go func() { deleted <- store.DeleteTenant(ctx, idem.DeleteTenantParams{ID: "acme"}) }()
	waitLockWaiters(t, monitor, app, 2)
	release()

	require.NoError(t, <-deleted, "deleting the tenant")
	err = <-resolved
	if err != nil {
		// The delete went first: the record is gone with its tenant.
		require.Equal(t, idem.CodeKeyNotFound, idem.ErrorCode(err), "resolving: %v", err)
	}
	_, err = store.GetTenant(ctx, idem.GetTenantParams{ID: "acme"})
	require.ErrorIs(t, err, idem.ErrTenantNotFound)
}
