package metrics

import (
	"context"
	"errors"
	"time"

	"github.com/idem-dev/idem"
)

// InstrumentStore wraps s so that every operation records
// idem_store_operation_duration_seconds{op,result} on m. The op label is the
// method name in snake case (claim, checkpoint, complete, release,
// resolve, list_audit, get_record, list_records, list_orphans, orphan_stats, reap,
// create_tenant, get_tenant, list_tenants, update_tenant, delete_tenant,
// ping). A nil m
// returns s unchanged.
func InstrumentStore(s idem.Store, m *Metrics) idem.Store {
	if m == nil {
		return s
	}
	return &instrumentedStore{s: s, m: m}
}

type instrumentedStore struct {
	s idem.Store
	m *Metrics
}

var _ idem.Store = (*instrumentedStore)(nil)

// StoreResult maps a store error to the result label of
// idem_store_operation_duration_seconds.
func StoreResult(err error) string {
	if errors.Is(err, context.Canceled) {
		return StoreCanceled
	}
	switch code := idem.ErrorCode(err); code {
	case "":
		return StoreOK
	case idem.CodeStoreUnavailable:
		return StoreUnavailable
	case idem.CodeInternal:
		return StoreError
	default:
		return StoreRejected
	}
}

func (i *instrumentedStore) observe(op string, start time.Time, err error) {
	i.m.storeBy.get(op, StoreResult(err), "").Observe(time.Since(start).Seconds())
}

func (i *instrumentedStore) Claim(ctx context.Context, p idem.ClaimParams) (_ idem.ClaimResult, err error) {
	defer func(start time.Time) { i.observe("claim", start, err) }(time.Now())
	return i.s.Claim(ctx, p)
}

func (i *instrumentedStore) Checkpoint(ctx context.Context, p idem.CheckpointParams) (_ idem.Record, err error) {
	defer func(start time.Time) { i.observe("checkpoint", start, err) }(time.Now())
	return i.s.Checkpoint(ctx, p)
}

func (i *instrumentedStore) Complete(ctx context.Context, p idem.CompleteParams) (_ idem.Record, err error) {
	defer func(start time.Time) { i.observe("complete", start, err) }(time.Now())
	return i.s.Complete(ctx, p)
}

func (i *instrumentedStore) Release(ctx context.Context, p idem.ReleaseParams) (err error) {
	defer func(start time.Time) { i.observe("release", start, err) }(time.Now())
	return i.s.Release(ctx, p)
}

func (i *instrumentedStore) Resolve(ctx context.Context, p idem.ResolveParams) (_ idem.Resolution, err error) {
	defer func(start time.Time) { i.observe("resolve", start, err) }(time.Now())
	return i.s.Resolve(ctx, p)
}

func (i *instrumentedStore) ListAudit(ctx context.Context, p idem.ListAuditParams) (_ []idem.AuditEntry, err error) {
	defer func(start time.Time) { i.observe("list_audit", start, err) }(time.Now())
	return i.s.ListAudit(ctx, p)
}

func (i *instrumentedStore) GetRecord(ctx context.Context, p idem.GetRecordParams) (_ idem.Record, err error) {
	defer func(start time.Time) { i.observe("get_record", start, err) }(time.Now())
	return i.s.GetRecord(ctx, p)
}

func (i *instrumentedStore) ListRecords(ctx context.Context, p idem.ListRecordsParams) (_ []idem.Record, err error) {
	defer func(start time.Time) { i.observe("list_records", start, err) }(time.Now())
	return i.s.ListRecords(ctx, p)
}

func (i *instrumentedStore) ListOrphans(ctx context.Context, p idem.ListOrphansParams) (_ []idem.Record, err error) {
	defer func(start time.Time) { i.observe("list_orphans", start, err) }(time.Now())
	return i.s.ListOrphans(ctx, p)
}

func (i *instrumentedStore) OrphanStats(ctx context.Context) (_ []idem.OrphanStat, err error) {
	defer func(start time.Time) { i.observe("orphan_stats", start, err) }(time.Now())
	return i.s.OrphanStats(ctx)
}

func (i *instrumentedStore) Reap(ctx context.Context, p idem.ReapParams) (_ []idem.Record, err error) {
	defer func(start time.Time) { i.observe("reap", start, err) }(time.Now())
	return i.s.Reap(ctx, p)
}

func (i *instrumentedStore) CreateTenant(ctx context.Context, p idem.CreateTenantParams) (_ idem.Tenant, err error) {
	defer func(start time.Time) { i.observe("create_tenant", start, err) }(time.Now())
	return i.s.CreateTenant(ctx, p)
}

func (i *instrumentedStore) GetTenant(ctx context.Context, id string) (_ idem.Tenant, err error) {
	defer func(start time.Time) { i.observe("get_tenant", start, err) }(time.Now())
	return i.s.GetTenant(ctx, id)
}

func (i *instrumentedStore) ListTenants(ctx context.Context) (_ []idem.Tenant, err error) {
	defer func(start time.Time) { i.observe("list_tenants", start, err) }(time.Now())
	return i.s.ListTenants(ctx)
}

func (i *instrumentedStore) UpdateTenant(ctx context.Context, p idem.UpdateTenantParams) (_ idem.Tenant, err error) {
	defer func(start time.Time) { i.observe("update_tenant", start, err) }(time.Now())
	return i.s.UpdateTenant(ctx, p)
}

func (i *instrumentedStore) DeleteTenant(ctx context.Context, id string) (err error) {
	defer func(start time.Time) { i.observe("delete_tenant", start, err) }(time.Now())
	return i.s.DeleteTenant(ctx, id)
}

func (i *instrumentedStore) Ping(ctx context.Context) (err error) {
	defer func(start time.Time) { i.observe("ping", start, err) }(time.Now())
	return i.s.Ping(ctx)
}

// Close closes the wrapped store; it is not timed.
func (i *instrumentedStore) Close() error { return i.s.Close() }
