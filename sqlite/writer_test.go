package sqlite

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/storetest"
)

// TestQueuedWriterHonoursContext holds the writer slot and checks that
// writers waiting for it give up when their context ends, with the same
// errors a context ending inside BeginTx gives (a deadline is
// store_unavailable, a cancellation is the context's error), and that the
// slot serves writers again once it is given back.
func TestQueuedWriterHonoursContext(t *testing.T) {
	t.Parallel()
	b := setup(t)
	storetest.CreateTenant(t, b.store, "acme")
	require.NoError(t, b.store.lockWriter(context.Background()))

	deadline, cancelDeadline := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancelDeadline()
	_, err := b.store.Claim(deadline, storetest.ClaimParams("acme", "k"))
	var ie *idem.Error
	require.True(t, errors.As(err, &ie), "got %v", err)
	require.Equal(t, idem.CodeStoreUnavailable, ie.Code)

	canceled, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := b.store.CreateTenant(canceled, idem.CreateTenantParams{ID: "beta", Name: "beta", Settings: idem.DefaultSettings()})
		done <- err
	}()
	cancel()
	err = <-done
	require.ErrorIs(t, err, context.Canceled)
	_, err = b.store.GetTenant(context.Background(), idem.GetTenantParams{ID: "beta"})
	require.True(t, errors.As(err, &ie) && ie.Code == idem.CodeTenantNotFound, "got %v", err)

	_, err = b.store.Reap(canceled, idem.ReapParams{Limit: 10})
	require.ErrorIs(t, err, context.Canceled)

	b.store.unlockWriter()
	res, err := b.store.Claim(context.Background(), storetest.ClaimParams("acme", "k"))
	require.NoError(t, err)
	require.Equal(t, idem.ActionCreate, res.Action)
}

// TestKeptClaimsNeedNoWriter holds the writer slot (a long write in
// progress) and checks that the claims that leave the record as it is are
// answered beside it, from one read: the replay of a completed key, the
// fingerprint mismatch on it, request_in_flight on a key in flight. A
// claim that must write still queues. (The deadline only bounds the test
// when a claim waits for the slot: none of these should.)
func TestKeptClaimsNeedNoWriter(t *testing.T) {
	t.Parallel()
	b := setup(t)
	storetest.CreateTenant(t, b.store, "acme")
	ctx := context.Background()
	rec, err := b.store.Claim(ctx, storetest.ClaimParams("acme", "done"))
	require.NoError(t, err)
	done, err := b.store.Complete(ctx, idem.CompleteParams{TenantID: "acme", Key: "done", FencingToken: rec.Record.FencingToken,
		Response: idem.Response{Status: 201, Body: []byte(`{"id":1}`), BodyEncoding: idem.BodyEncodingUTF8}})
	require.NoError(t, err)
	_, err = b.store.Claim(ctx, storetest.ClaimParams("acme", "busy"))
	require.NoError(t, err)

	require.NoError(t, b.store.lockWriter(ctx))
	bounded, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	res, err := b.store.Claim(bounded, storetest.ClaimParams("acme", "done"))
	require.NoError(t, err)
	require.Equal(t, idem.ActionReplay, res.Action)
	require.Equal(t, done.FencingToken, res.Record.FencingToken)
	require.Equal(t, done.Response.Body, res.Record.Response.Body)

	p := storetest.ClaimParams("acme", "done")
	p.Fingerprint = "sha256:other"
	_, err = b.store.Claim(bounded, p)
	require.Equal(t, idem.CodeFingerprintMismatch, idem.ErrorCode(err), "got %v", err)
	_, err = b.store.Claim(bounded, storetest.ClaimParams("acme", "busy"))
	require.Equal(t, idem.CodeRequestInFlight, idem.ErrorCode(err), "got %v", err)

	short, cancelShort := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancelShort()
	_, err = b.store.Claim(short, storetest.ClaimParams("acme", "fresh"))
	require.Equal(t, idem.CodeStoreUnavailable, idem.ErrorCode(err), "a fresh claim waits for the writer: got %v", err)
	b.store.unlockWriter()
}
