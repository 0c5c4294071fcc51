package storemw

import (
	"context"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/metrics"
)

// Instrument returns s whose every call records
// idem_store_operation_duration_seconds{op,result} on m
// (metrics.ObserveStoreCall), so that an operator sees each store call's
// latency and outcome whoever made it. The op label is the method name in
// snake case (claim, checkpoint, complete, release, resolve, list_audit,
// get_record, list_records, list_orphans, orphan_stats, reap,
// create_tenant, get_tenant, list_tenants, update_tenant, delete_tenant,
// ping). A nil m returns s unchanged.
func Instrument(s idem.Store, m *metrics.Metrics) idem.Store {
	if m == nil {
		return s
	}
	return &instrumentedStore{s: s, m: m}
}

type instrumentedStore struct {
	s idem.Store
	m *metrics.Metrics
}

var _ idem.Store = (*instrumentedStore)(nil)

// observe records a store call that started at start and ended with
// *err; the wrappers' methods defer it, so err is read once they return.
func observe(m *metrics.Metrics, op string, start time.Time, err *error) {
	m.ObserveStoreCall(op, *err, time.Since(start))
}

func (i *instrumentedStore) Claim(ctx context.Context, p idem.ClaimParams) (_ idem.ClaimResult, err error) {
	defer observe(i.m, "claim", time.Now(), &err)
	return i.s.Claim(ctx, p)
}

func (i *instrumentedStore) Checkpoint(ctx context.Context, p idem.CheckpointParams) (_ idem.Record, err error) {
	defer observe(i.m, "checkpoint", time.Now(), &err)
	return i.s.Checkpoint(ctx, p)
}

func (i *instrumentedStore) Complete(ctx context.Context, p idem.CompleteParams) (_ idem.Record, err error) {
	defer observe(i.m, "complete", time.Now(), &err)
	return i.s.Complete(ctx, p)
}

func (i *instrumentedStore) Release(ctx context.Context, p idem.ReleaseParams) (err error) {
	defer observe(i.m, "release", time.Now(), &err)
	return i.s.Release(ctx, p)
}

func (i *instrumentedStore) Resolve(ctx context.Context, p idem.ResolveParams) (_ idem.Resolution, err error) {
	defer observe(i.m, "resolve", time.Now(), &err)
	return i.s.Resolve(ctx, p)
}

func (i *instrumentedStore) ListAudit(ctx context.Context, p idem.ListAuditParams) (_ []idem.AuditEntry, err error) {
	defer observe(i.m, "list_audit", time.Now(), &err)
	return i.s.ListAudit(ctx, p)
}

func (i *instrumentedStore) GetRecord(ctx context.Context, p idem.GetRecordParams) (_ idem.Record, err error) {
	defer observe(i.m, "get_record", time.Now(), &err)
	return i.s.GetRecord(ctx, p)
}

func (i *instrumentedStore) ListRecords(ctx context.Context, p idem.ListRecordsParams) (_ []idem.Record, err error) {
	defer observe(i.m, "list_records", time.Now(), &err)
	return i.s.ListRecords(ctx, p)
}

func (i *instrumentedStore) ListOrphans(ctx context.Context, p idem.ListOrphansParams) (_ []idem.Record, err error) {
	defer observe(i.m, "list_orphans", time.Now(), &err)
	return i.s.ListOrphans(ctx, p)
}

func (i *instrumentedStore) OrphanStats(ctx context.Context) (_ []idem.OrphanStat, err error) {
	defer observe(i.m, "orphan_stats", time.Now(), &err)
	return i.s.OrphanStats(ctx)
}

func (i *instrumentedStore) Reap(ctx context.Context, p idem.ReapParams) (_ []idem.Record, err error) {
	defer observe(i.m, "reap", time.Now(), &err)
	return i.s.Reap(ctx, p)
}

func (i *instrumentedStore) CreateTenant(ctx context.Context, p idem.CreateTenantParams) (_ idem.Tenant, err error) {
	defer observe(i.m, "create_tenant", time.Now(), &err)
	return i.s.CreateTenant(ctx, p)
}

func (i *instrumentedStore) GetTenant(ctx context.Context, p idem.GetTenantParams) (_ idem.Tenant, err error) {
	defer observe(i.m, "get_tenant", time.Now(), &err)
	return i.s.GetTenant(ctx, p)
}

func (i *instrumentedStore) ListTenants(ctx context.Context) (_ []idem.Tenant, err error) {
	defer observe(i.m, "list_tenants", time.Now(), &err)
	return i.s.ListTenants(ctx)
}

func (i *instrumentedStore) UpdateTenant(ctx context.Context, p idem.UpdateTenantParams) (_ idem.Tenant, err error) {
	defer observe(i.m, "update_tenant", time.Now(), &err)
	return i.s.UpdateTenant(ctx, p)
}

func (i *instrumentedStore) DeleteTenant(ctx context.Context, p idem.DeleteTenantParams) (err error) {
	defer observe(i.m, "delete_tenant", time.Now(), &err)
	return i.s.DeleteTenant(ctx, p)
}

func (i *instrumentedStore) Ping(ctx context.Context) (err error) {
	defer observe(i.m, "ping", time.Now(), &err)
	return i.s.Ping(ctx)
}

// Close closes the wrapped store; it is not timed.
func (i *instrumentedStore) Close() error { return i.s.Close() }

// InstrumentWebhooks is Instrument for the webhook side of a store: its
// calls were never timed before, though the API's webhook calls and the
// deliverer's claims hold the same connections as the ledger's. The op
// label is the method name in snake case (create_webhook_endpoint,
// get_webhook_endpoint, list_webhook_endpoints, update_webhook_endpoint,
// delete_webhook_endpoint, send_test_event, list_webhook_deliveries,
// claim_webhook_deliveries, finish_webhook_delivery, emit_orphan_events,
// purge_webhook_deliveries). A nil m returns w unchanged.
func InstrumentWebhooks(w idem.WebhookStore, m *metrics.Metrics) idem.WebhookStore {
	if m == nil {
		return w
	}
	return &instrumentedWebhooks{w: w, m: m}
}

type instrumentedWebhooks struct {
	w idem.WebhookStore
	m *metrics.Metrics
}

var _ idem.WebhookStore = (*instrumentedWebhooks)(nil)

func (i *instrumentedWebhooks) CreateWebhookEndpoint(ctx context.Context, e idem.WebhookEndpoint) (_ idem.WebhookEndpoint, err error) {
	defer observe(i.m, "create_webhook_endpoint", time.Now(), &err)
	return i.w.CreateWebhookEndpoint(ctx, e)
}

func (i *instrumentedWebhooks) GetWebhookEndpoint(ctx context.Context, p idem.GetWebhookEndpointParams) (_ idem.WebhookEndpoint, err error) {
	defer observe(i.m, "get_webhook_endpoint", time.Now(), &err)
	return i.w.GetWebhookEndpoint(ctx, p)
}

func (i *instrumentedWebhooks) ListWebhookEndpoints(ctx context.Context, p idem.ListWebhookEndpointsParams) (_ []idem.WebhookEndpoint, err error) {
	defer observe(i.m, "list_webhook_endpoints", time.Now(), &err)
	return i.w.ListWebhookEndpoints(ctx, p)
}

func (i *instrumentedWebhooks) UpdateWebhookEndpoint(ctx context.Context, e idem.WebhookEndpoint) (_ idem.WebhookEndpoint, err error) {
	defer observe(i.m, "update_webhook_endpoint", time.Now(), &err)
	return i.w.UpdateWebhookEndpoint(ctx, e)
}

func (i *instrumentedWebhooks) DeleteWebhookEndpoint(ctx context.Context, p idem.DeleteWebhookEndpointParams) (err error) {
	defer observe(i.m, "delete_webhook_endpoint", time.Now(), &err)
	return i.w.DeleteWebhookEndpoint(ctx, p)
}

func (i *instrumentedWebhooks) SendTestEvent(ctx context.Context, p idem.SendTestEventParams) (_ idem.WebhookDelivery, err error) {
	defer observe(i.m, "send_test_event", time.Now(), &err)
	return i.w.SendTestEvent(ctx, p)
}

func (i *instrumentedWebhooks) ListWebhookDeliveries(ctx context.Context, p idem.ListWebhookDeliveriesParams) (_ []idem.WebhookDelivery, err error) {
	defer observe(i.m, "list_webhook_deliveries", time.Now(), &err)
	return i.w.ListWebhookDeliveries(ctx, p)
}

func (i *instrumentedWebhooks) ClaimWebhookDeliveries(ctx context.Context, p idem.ClaimWebhookDeliveriesParams) (_ []idem.WebhookDelivery, err error) {
	defer observe(i.m, "claim_webhook_deliveries", time.Now(), &err)
	return i.w.ClaimWebhookDeliveries(ctx, p)
}

func (i *instrumentedWebhooks) FinishWebhookDelivery(ctx context.Context, p idem.FinishWebhookDeliveryParams) (err error) {
	defer observe(i.m, "finish_webhook_delivery", time.Now(), &err)
	return i.w.FinishWebhookDelivery(ctx, p)
}

func (i *instrumentedWebhooks) EmitOrphanEvents(ctx context.Context, p idem.EmitOrphanEventsParams) (_ int, err error) {
	defer observe(i.m, "emit_orphan_events", time.Now(), &err)
	return i.w.EmitOrphanEvents(ctx, p)
}

func (i *instrumentedWebhooks) PurgeWebhookDeliveries(ctx context.Context, p idem.PurgeWebhookDeliveriesParams) (_ int, err error) {
	defer observe(i.m, "purge_webhook_deliveries", time.Now(), &err)
	return i.w.PurgeWebhookDeliveries(ctx, p)
}
