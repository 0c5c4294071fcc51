package storemw

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idem-dev/idem"
)

// WithDeadline returns an idem.Store that gives every call of s at most d: the
// call's context gets a deadline d from now (or keeps an earlier one), so
// a database that stops answering — frozen, behind a network black hole, a
// lock held elsewhere, a pool whose connections all hang — can no longer
// hold a request or a background job for the length of the outage. A call
// that ran out of time returns store_unavailable (retryable, Retry-After),
// whatever error the driver gave; the error of a call whose own caller
// gave up (its context was canceled) matches context.Canceled, so metrics
// and the HTTP layer can tell "the client went away" from "the store
// failed". d <= 0 returns s.
//
// The bound holds as far as the backend honours its context, which both
// stores do: pgx sets a deadline on the connection and bounds pool
// acquisition, database/sql bounds its pool, and the SQLite driver
// interrupts a statement or a busy wait.
func WithDeadline(s idem.Store, d time.Duration) idem.Store {
	if d <= 0 {
		return s
	}
	return &deadlineStore{s: s, d: d}
}

type deadlineStore struct {
	s idem.Store
	d time.Duration
}

var _ idem.Store = (*deadlineStore)(nil)

// bounded runs f with the store deadline and classifies its error.
func bounded[T any](ds *deadlineStore, ctx context.Context, f func(context.Context) (T, error)) (T, error) {
	ctx, cancel := context.WithTimeout(ctx, ds.d)
	defer cancel()
	v, err := f(ctx)
	if err == nil || ctx.Err() == nil {
		return v, err
	}
	switch code := idem.ErrorCode(err); {
	case errors.Is(ctx.Err(), context.Canceled):
		// The caller gave up. Drivers say so in their own words (SQLite:
		// "interrupted"); make errors.Is(err, context.Canceled) hold so
		// metrics and the HTTP layer count it as the caller's doing.
		if (code == idem.CodeInternal || code == idem.CodeStoreUnavailable) && !errors.Is(err, context.Canceled) {
			err = fmt.Errorf("%w (%w)", err, context.Canceled)
		}
	case code == idem.CodeInternal:
		err = idem.StoreUnavailable("the database did not answer in time", err)
	}
	return v, err
}

// boundedErr is bounded for calls that return only an error.
func boundedErr(ds *deadlineStore, ctx context.Context, f func(context.Context) error) error {
	_, err := bounded(ds, ctx, func(ctx context.Context) (struct{}, error) { return struct{}{}, f(ctx) })
	return err
}

func (ds *deadlineStore) Claim(ctx context.Context, p idem.ClaimParams) (idem.ClaimResult, error) {
	return bounded(ds, ctx, func(ctx context.Context) (idem.ClaimResult, error) { return ds.s.Claim(ctx, p) })
}

func (ds *deadlineStore) Checkpoint(ctx context.Context, p idem.CheckpointParams) (idem.Record, error) {
	return bounded(ds, ctx, func(ctx context.Context) (idem.Record, error) { return ds.s.Checkpoint(ctx, p) })
}

func (ds *deadlineStore) Complete(ctx context.Context, p idem.CompleteParams) (idem.Record, error) {
	return bounded(ds, ctx, func(ctx context.Context) (idem.Record, error) { return ds.s.Complete(ctx, p) })
}

func (ds *deadlineStore) Release(ctx context.Context, p idem.ReleaseParams) error {
	return boundedErr(ds, ctx, func(ctx context.Context) error { return ds.s.Release(ctx, p) })
}

func (ds *deadlineStore) Resolve(ctx context.Context, p idem.ResolveParams) (idem.Resolution, error) {
	return bounded(ds, ctx, func(ctx context.Context) (idem.Resolution, error) { return ds.s.Resolve(ctx, p) })
}

func (ds *deadlineStore) ListAudit(ctx context.Context, p idem.ListAuditParams) ([]idem.AuditEntry, error) {
	return bounded(ds, ctx, func(ctx context.Context) ([]idem.AuditEntry, error) { return ds.s.ListAudit(ctx, p) })
}

func (ds *deadlineStore) GetRecord(ctx context.Context, p idem.GetRecordParams) (idem.Record, error) {
	return bounded(ds, ctx, func(ctx context.Context) (idem.Record, error) { return ds.s.GetRecord(ctx, p) })
}

func (ds *deadlineStore) ListRecords(ctx context.Context, p idem.ListRecordsParams) ([]idem.Record, error) {
	return bounded(ds, ctx, func(ctx context.Context) ([]idem.Record, error) { return ds.s.ListRecords(ctx, p) })
}

func (ds *deadlineStore) ListOrphans(ctx context.Context, p idem.ListOrphansParams) ([]idem.Record, error) {
	return bounded(ds, ctx, func(ctx context.Context) ([]idem.Record, error) { return ds.s.ListOrphans(ctx, p) })
}

func (ds *deadlineStore) OrphanStats(ctx context.Context) ([]idem.OrphanStat, error) {
	return bounded(ds, ctx, ds.s.OrphanStats)
}

func (ds *deadlineStore) Reap(ctx context.Context, p idem.ReapParams) ([]idem.Record, error) {
	return bounded(ds, ctx, func(ctx context.Context) ([]idem.Record, error) { return ds.s.Reap(ctx, p) })
}

func (ds *deadlineStore) CreateTenant(ctx context.Context, p idem.CreateTenantParams) (idem.Tenant, error) {
	return bounded(ds, ctx, func(ctx context.Context) (idem.Tenant, error) { return ds.s.CreateTenant(ctx, p) })
}

func (ds *deadlineStore) GetTenant(ctx context.Context, p idem.GetTenantParams) (idem.Tenant, error) {
	return bounded(ds, ctx, func(ctx context.Context) (idem.Tenant, error) { return ds.s.GetTenant(ctx, p) })
}

func (ds *deadlineStore) ListTenants(ctx context.Context) ([]idem.Tenant, error) {
	return bounded(ds, ctx, ds.s.ListTenants)
}

func (ds *deadlineStore) UpdateTenant(ctx context.Context, p idem.UpdateTenantParams) (idem.Tenant, error) {
	return bounded(ds, ctx, func(ctx context.Context) (idem.Tenant, error) { return ds.s.UpdateTenant(ctx, p) })
}

func (ds *deadlineStore) DeleteTenant(ctx context.Context, p idem.DeleteTenantParams) error {
	return boundedErr(ds, ctx, func(ctx context.Context) error { return ds.s.DeleteTenant(ctx, p) })
}

func (ds *deadlineStore) Ping(ctx context.Context) error {
	return boundedErr(ds, ctx, ds.s.Ping)
}

// Close closes the wrapped store; it is not bounded.
func (ds *deadlineStore) Close() error { return ds.s.Close() }

// WebhookWithDeadline is WithDeadline for the webhook side of a store:
// every call of w gets at most d, and one that ran out of time returns
// store_unavailable. d <= 0 returns w.
func WebhookWithDeadline(w idem.WebhookStore, d time.Duration) idem.WebhookStore {
	if d <= 0 {
		return w
	}
	return &webhookDeadline{ds: &deadlineStore{d: d}, w: w}
}

type webhookDeadline struct {
	ds *deadlineStore // only its d is used
	w  idem.WebhookStore
}

var _ idem.WebhookStore = (*webhookDeadline)(nil)

func (wd *webhookDeadline) CreateWebhookEndpoint(ctx context.Context, e idem.WebhookEndpoint) (idem.WebhookEndpoint, error) {
	return bounded(wd.ds, ctx, func(ctx context.Context) (idem.WebhookEndpoint, error) { return wd.w.CreateWebhookEndpoint(ctx, e) })
}

func (wd *webhookDeadline) GetWebhookEndpoint(ctx context.Context, p idem.GetWebhookEndpointParams) (idem.WebhookEndpoint, error) {
	return bounded(wd.ds, ctx, func(ctx context.Context) (idem.WebhookEndpoint, error) {
		return wd.w.GetWebhookEndpoint(ctx, p)
	})
}

func (wd *webhookDeadline) ListWebhookEndpoints(ctx context.Context, p idem.ListWebhookEndpointsParams) ([]idem.WebhookEndpoint, error) {
	return bounded(wd.ds, ctx, func(ctx context.Context) ([]idem.WebhookEndpoint, error) {
		return wd.w.ListWebhookEndpoints(ctx, p)
	})
}

func (wd *webhookDeadline) UpdateWebhookEndpoint(ctx context.Context, e idem.WebhookEndpoint) (idem.WebhookEndpoint, error) {
	return bounded(wd.ds, ctx, func(ctx context.Context) (idem.WebhookEndpoint, error) { return wd.w.UpdateWebhookEndpoint(ctx, e) })
}

func (wd *webhookDeadline) DeleteWebhookEndpoint(ctx context.Context, p idem.DeleteWebhookEndpointParams) error {
	return boundedErr(wd.ds, ctx, func(ctx context.Context) error { return wd.w.DeleteWebhookEndpoint(ctx, p) })
}

func (wd *webhookDeadline) SendTestEvent(ctx context.Context, p idem.SendTestEventParams) (idem.WebhookDelivery, error) {
	return bounded(wd.ds, ctx, func(ctx context.Context) (idem.WebhookDelivery, error) {
		return wd.w.SendTestEvent(ctx, p)
	})
}

func (wd *webhookDeadline) ListWebhookDeliveries(ctx context.Context, p idem.ListWebhookDeliveriesParams) ([]idem.WebhookDelivery, error) {
	return bounded(wd.ds, ctx, func(ctx context.Context) ([]idem.WebhookDelivery, error) { return wd.w.ListWebhookDeliveries(ctx, p) })
}

func (wd *webhookDeadline) ClaimWebhookDeliveries(ctx context.Context, p idem.ClaimWebhookDeliveriesParams) ([]idem.WebhookDelivery, error) {
	return bounded(wd.ds, ctx, func(ctx context.Context) ([]idem.WebhookDelivery, error) {
		return wd.w.ClaimWebhookDeliveries(ctx, p)
	})
}

func (wd *webhookDeadline) FinishWebhookDelivery(ctx context.Context, p idem.FinishWebhookDeliveryParams) error {
	return boundedErr(wd.ds, ctx, func(ctx context.Context) error { return wd.w.FinishWebhookDelivery(ctx, p) })
}

func (wd *webhookDeadline) EmitOrphanEvents(ctx context.Context, p idem.EmitOrphanEventsParams) (int, error) {
	return bounded(wd.ds, ctx, func(ctx context.Context) (int, error) { return wd.w.EmitOrphanEvents(ctx, p) })
}

func (wd *webhookDeadline) PurgeWebhookDeliveries(ctx context.Context, p idem.PurgeWebhookDeliveriesParams) (int, error) {
	return bounded(wd.ds, ctx, func(ctx context.Context) (int, error) { return wd.w.PurgeWebhookDeliveries(ctx, p) })
}
