package storemw

import (
	"context"
	"math"
	"sync"
	"sync/atomic"

	"github.com/idem-dev/idem"
)

// DefaultStoreShare is the part of the store's connections each tenant's
// store calls may always have (WithTenantShare) unless the operator says
// otherwise (IDEM_DB_TENANT_SHARE): half, like the waiter places
// (keyevents.TenantShare).
const DefaultStoreShare = 0.5

// StoreShareOf returns how many store calls one tenant may have in progress
// at once on a store of poolSize connections: fraction of them, rounded up,
// at least one. A fraction a hair above a whole number of connections (0.3
// × 10 is 3.0000000000000004 in floating point) is not rounded up past it.
func StoreShareOf(poolSize int, fraction float64) int {
	return max(int(math.Ceil(float64(poolSize)*fraction-1e-9)), 1)
}

// WithTenantShare returns an idem.Store on which one tenant's calls cannot take
// the connections the other tenants need. Each tenant may always have
// perTenant calls in progress, its share of the pool's connections. Past
// its share a call still starts while the calls in progress of all
// tenants leave ShareReserve connections free (so a tenant alone uses all
// of the pool but that: no measurable cost on PostgreSQL, a few percent
// on SQLite, docs/benchmarks.md); otherwise it waits, first come first
// served, for one of its own tenant's calls within the share to end —
// never for another tenant's — or until ctx ends, and then returns
// store_unavailable (retryable, Retry-After). Put it inside
// WithDeadline, so that the wait is bounded by the same store deadline as
// the call.
//
// Without it one tenant sending many requests that are slow in the store
// (completes blocked on a row lock, large listings, a long writer queue)
// holds every connection of the pool, and every other tenant's calls wait
// for one until their deadline. With it, a tenant whose calls are stuck
// holds at most pool − ShareReserve connections, and the other tenants'
// calls always find one. Once the calls of all tenants fill the pool but
// the reserve (the others' calls count as soon as they start, waiting for
// a connection included), calls past a share no longer start, so as a
// tenant's calls past its share end, the connections go to the others'
// calls within theirs: under contention each busy tenant gets its share.
//
// The calls made for a tenant count (every call of a key or a record, and
// GetTenant, the lookup of its settings); those that name none — the
// reaper, the orphan watch, listings across tenants, ListTenants — and the
// operator's changes to a tenant (CreateTenant, UpdateTenant,
// DeleteTenant) pass through, as do all calls when perTenant <= 0 or
// perTenant >= pool (which return s). On a store whose
// writes take turns on one writer (serial: Driver.SerialWrites, SQLite) a tenant's writes
// have a share of their own: they wait for the writer without a
// connection, so they must not keep the tenant's reads, which run beside
// the writer, from the connections. Reads and writes count alike in the
// calls in progress, so another tenant's write queues behind at most
// pool − ShareReserve of one tenant's. observe, when not nil, is told of
// every call that found its tenant's share in use and waited, once its
// wait ended: err is nil when it got its turn, else the error it returns.
//
// The hot path takes no lock shared between tenants and allocates nothing:
// one lookup in a sync.Map, a send on the tenant's buffered channel and
// an atomic count of the calls in progress.
func WithTenantShare(s idem.Store, pool, perTenant int, serial bool, observe func(tenant string, err error)) idem.Store {
	if perTenant <= 0 || perTenant >= pool {
		return s
	}
	return &shareStore{s: s, per: perTenant, borrow: int64(pool - ShareReserve), serial: serial, observe: observe}
}

// ShareReserve is how many of the pool's connections the calls past their
// tenants' shares leave free (WithTenantShare): what the other tenants
// find at once even while one tenant's calls are stuck. One is enough for
// them to make progress, and a tenant alone keeps the rest of the pool.
const ShareReserve = 1

type shareStore struct {
	s   idem.Store
	per int
	// borrow is the most calls in progress (total, the new one included)
	// with which a call past its tenant's share may still start.
	borrow  int64
	serial  bool
	observe func(tenant string, err error)
	// total counts the calls in progress that name a tenant.
	total atomic.Int64
	// slots maps a tenant id to its *tenantSlots. Tenants are created by
	// the operator, so it holds one entry per tenant seen.
	slots sync.Map
}

// tenantSlots are the semaphores of one tenant's share, each a chan
// struct{} of capacity per: a send takes a slot, a receive gives it back,
// and goroutines blocked sending are woken first in, first out. writes is
// reads unless the store's writes are serial.
type tenantSlots struct {
	reads, writes chan struct{}
}

// Whether a call writes, for the semaphore it takes.
const (
	read  = false
	write = true
)

var _ idem.Store = (*shareStore)(nil)

// slot is what a call holds while it runs: the semaphore to give back
// (nil past the share), and whether it is counted in total (it names a
// tenant).
type slot struct {
	sem     chan struct{}
	counted bool
}

// acquire lets a call of tenant start: within its share, past it while
// the pool has room (see WithTenantShare), or once one of its tenant's
// slots is free, waiting for one while ctx lasts.
func (ss *shareStore) acquire(ctx context.Context, tenant string, writes bool) (slot, error) {
	if tenant == "" {
		return slot{}, nil
	}
	v, ok := ss.slots.Load(tenant)
	if !ok {
		ts := &tenantSlots{reads: make(chan struct{}, ss.per)}
		ts.writes = ts.reads
		if ss.serial {
			ts.writes = make(chan struct{}, ss.per)
		}
		v, _ = ss.slots.LoadOrStore(tenant, ts)
	}
	sl := slot{sem: v.(*tenantSlots).reads, counted: true}
	if writes {
		sl.sem = v.(*tenantSlots).writes
	}
	select {
	case sl.sem <- struct{}{}:
		ss.total.Add(1)
		return sl, nil
	default:
	}
	if ss.total.Add(1) <= ss.borrow {
		return slot{counted: true}, nil
	}
	ss.total.Add(-1)
	var err error
	select {
	case sl.sem <- struct{}{}:
		ss.total.Add(1)
	case <-ctx.Done():
		sl = slot{}
		err = idem.StoreUnavailable("this tenant's store calls in progress held its whole share of the database connections until the store deadline", ctx.Err())
	}
	if ss.observe != nil {
		ss.observe(tenant, err)
	}
	return sl, err
}

// release ends a call started by acquire.
func (ss *shareStore) release(sl slot) {
	if sl.counted {
		ss.total.Add(-1)
	}
	if sl.sem != nil {
		<-sl.sem
	}
}

// shared runs f as a call of tenant (a write or a read).
func shared[T any](ss *shareStore, ctx context.Context, tenant string, writes bool, f func() (T, error)) (T, error) {
	sl, err := ss.acquire(ctx, tenant, writes)
	if err != nil {
		var zero T
		return zero, err
	}
	defer ss.release(sl)
	return f()
}

// sharedErr is shared for calls that return only an error.
func sharedErr(ss *shareStore, ctx context.Context, tenant string, writes bool, f func() error) error {
	sl, err := ss.acquire(ctx, tenant, writes)
	if err != nil {
		return err
	}
	defer ss.release(sl)
	return f()
}

func (ss *shareStore) Claim(ctx context.Context, p idem.ClaimParams) (idem.ClaimResult, error) {
	return shared(ss, ctx, p.TenantID, write, func() (idem.ClaimResult, error) { return ss.s.Claim(ctx, p) })
}

func (ss *shareStore) Checkpoint(ctx context.Context, p idem.CheckpointParams) (idem.Record, error) {
	return shared(ss, ctx, p.TenantID, write, func() (idem.Record, error) { return ss.s.Checkpoint(ctx, p) })
}

func (ss *shareStore) Complete(ctx context.Context, p idem.CompleteParams) (idem.Record, error) {
	return shared(ss, ctx, p.TenantID, write, func() (idem.Record, error) { return ss.s.Complete(ctx, p) })
}

func (ss *shareStore) Release(ctx context.Context, p idem.ReleaseParams) error {
	return sharedErr(ss, ctx, p.TenantID, write, func() error { return ss.s.Release(ctx, p) })
}

func (ss *shareStore) Resolve(ctx context.Context, p idem.ResolveParams) (idem.Resolution, error) {
	return shared(ss, ctx, p.TenantID, write, func() (idem.Resolution, error) { return ss.s.Resolve(ctx, p) })
}

func (ss *shareStore) ListAudit(ctx context.Context, p idem.ListAuditParams) ([]idem.AuditEntry, error) {
	return shared(ss, ctx, p.TenantID, read, func() ([]idem.AuditEntry, error) { return ss.s.ListAudit(ctx, p) })
}

func (ss *shareStore) GetRecord(ctx context.Context, p idem.GetRecordParams) (idem.Record, error) {
	return shared(ss, ctx, p.TenantID, read, func() (idem.Record, error) { return ss.s.GetRecord(ctx, p) })
}

func (ss *shareStore) ListRecords(ctx context.Context, p idem.ListRecordsParams) ([]idem.Record, error) {
	return shared(ss, ctx, p.TenantID, read, func() ([]idem.Record, error) { return ss.s.ListRecords(ctx, p) })
}

func (ss *shareStore) ListOrphans(ctx context.Context, p idem.ListOrphansParams) ([]idem.Record, error) {
	return shared(ss, ctx, p.TenantID, read, func() ([]idem.Record, error) { return ss.s.ListOrphans(ctx, p) })
}

func (ss *shareStore) OrphanStats(ctx context.Context) ([]idem.OrphanStat, error) {
	return ss.s.OrphanStats(ctx)
}

func (ss *shareStore) Reap(ctx context.Context, p idem.ReapParams) ([]idem.Record, error) {
	return ss.s.Reap(ctx, p)
}

func (ss *shareStore) CreateTenant(ctx context.Context, p idem.CreateTenantParams) (idem.Tenant, error) {
	return ss.s.CreateTenant(ctx, p)
}

func (ss *shareStore) GetTenant(ctx context.Context, p idem.GetTenantParams) (idem.Tenant, error) {
	return shared(ss, ctx, p.ID, read, func() (idem.Tenant, error) { return ss.s.GetTenant(ctx, p) })
}

func (ss *shareStore) ListTenants(ctx context.Context) ([]idem.Tenant, error) {
	return ss.s.ListTenants(ctx)
}

// UpdateTenant is the operator's, not the tenant's: it is not held to the
// tenant's share, so disabling a tenant whose calls fill it does not wait
// behind them.
func (ss *shareStore) UpdateTenant(ctx context.Context, p idem.UpdateTenantParams) (idem.Tenant, error) {
	return ss.s.UpdateTenant(ctx, p)
}

// DeleteTenant is the operator's, like UpdateTenant.
func (ss *shareStore) DeleteTenant(ctx context.Context, p idem.DeleteTenantParams) error {
	return ss.s.DeleteTenant(ctx, p)
}

func (ss *shareStore) Ping(ctx context.Context) error { return ss.s.Ping(ctx) }

// Close closes the wrapped store.
func (ss *shareStore) Close() error { return ss.s.Close() }

// WebhooksWithTenantShare returns w whose calls made for a tenant — its
// webhook endpoints, test events and delivery listings, the API's — take
// the tenant's slots of shared, an idem.Store returned by WithTenantShare, and
// count with its calls: they hold the same connections. The deliverer's
// and the jobs' calls name no tenant and pass through. It returns w when
// shared holds no share.
func WebhooksWithTenantShare(shared idem.Store, w idem.WebhookStore) idem.WebhookStore {
	ss, ok := shared.(*shareStore)
	if !ok {
		return w
	}
	return &shareWebhooks{ss: ss, w: w}
}

type shareWebhooks struct {
	ss *shareStore
	w  idem.WebhookStore
}

var _ idem.WebhookStore = (*shareWebhooks)(nil)

func (sw *shareWebhooks) CreateWebhookEndpoint(ctx context.Context, e idem.WebhookEndpoint) (idem.WebhookEndpoint, error) {
	return shared(sw.ss, ctx, e.TenantID, write, func() (idem.WebhookEndpoint, error) { return sw.w.CreateWebhookEndpoint(ctx, e) })
}

func (sw *shareWebhooks) GetWebhookEndpoint(ctx context.Context, p idem.GetWebhookEndpointParams) (idem.WebhookEndpoint, error) {
	return shared(sw.ss, ctx, p.TenantID, read, func() (idem.WebhookEndpoint, error) { return sw.w.GetWebhookEndpoint(ctx, p) })
}

func (sw *shareWebhooks) ListWebhookEndpoints(ctx context.Context, p idem.ListWebhookEndpointsParams) ([]idem.WebhookEndpoint, error) {
	return shared(sw.ss, ctx, p.TenantID, read, func() ([]idem.WebhookEndpoint, error) { return sw.w.ListWebhookEndpoints(ctx, p) })
}

func (sw *shareWebhooks) UpdateWebhookEndpoint(ctx context.Context, e idem.WebhookEndpoint) (idem.WebhookEndpoint, error) {
	return shared(sw.ss, ctx, e.TenantID, write, func() (idem.WebhookEndpoint, error) { return sw.w.UpdateWebhookEndpoint(ctx, e) })
}

func (sw *shareWebhooks) DeleteWebhookEndpoint(ctx context.Context, p idem.DeleteWebhookEndpointParams) error {
	return sharedErr(sw.ss, ctx, p.TenantID, write, func() error { return sw.w.DeleteWebhookEndpoint(ctx, p) })
}

func (sw *shareWebhooks) SendTestEvent(ctx context.Context, p idem.SendTestEventParams) (idem.WebhookDelivery, error) {
	return shared(sw.ss, ctx, p.Event.TenantID, write, func() (idem.WebhookDelivery, error) { return sw.w.SendTestEvent(ctx, p) })
}

func (sw *shareWebhooks) ListWebhookDeliveries(ctx context.Context, p idem.ListWebhookDeliveriesParams) ([]idem.WebhookDelivery, error) {
	return shared(sw.ss, ctx, p.TenantID, read, func() ([]idem.WebhookDelivery, error) { return sw.w.ListWebhookDeliveries(ctx, p) })
}

func (sw *shareWebhooks) ClaimWebhookDeliveries(ctx context.Context, p idem.ClaimWebhookDeliveriesParams) ([]idem.WebhookDelivery, error) {
	return sw.w.ClaimWebhookDeliveries(ctx, p)
}

func (sw *shareWebhooks) FinishWebhookDelivery(ctx context.Context, p idem.FinishWebhookDeliveryParams) error {
	return sw.w.FinishWebhookDelivery(ctx, p)
}

func (sw *shareWebhooks) EmitOrphanEvents(ctx context.Context, p idem.EmitOrphanEventsParams) (int, error) {
	return sw.w.EmitOrphanEvents(ctx, p)
}

func (sw *shareWebhooks) PurgeWebhookDeliveries(ctx context.Context, p idem.PurgeWebhookDeliveriesParams) (int, error) {
	return sw.w.PurgeWebhookDeliveries(ctx, p)
}
