package idem

import (
	"context"
	"math"
	"sync"
)

// DefaultStoreShare is the part of the store's connections one tenant's
// store calls may hold at once unless the operator says otherwise
// (IDEM_DB_TENANT_SHARE): half, like the waiter places (TenantShare).
const DefaultStoreShare = 0.5

// StoreShareOf returns how many store calls one tenant may have in progress
// at once on a store of poolSize connections: fraction of them, rounded up,
// at least one. A fraction a hair above a whole number of connections (0.3
// × 10 is 3.0000000000000004 in floating point) is not rounded up past it.
func StoreShareOf(poolSize int, fraction float64) int {
	return max(int(math.Ceil(float64(poolSize)*fraction-1e-9)), 1)
}

// WithTenantShare returns a Store on which one tenant has at most perTenant
// calls in progress at a time: a call past its tenant's share waits, first
// come first served, for one of that tenant's own calls to end — never for
// another tenant's — or until ctx ends, and then returns store_unavailable
// (retryable, Retry-After). Put it inside WithDeadline, so that the wait is
// bounded by the same store deadline as the call.
//
// Without it one tenant sending many requests that are slow in the store
// (completes blocked on a row lock, large listings, a long writer queue)
// holds every connection of the pool, and every other tenant's calls wait
// for one until their deadline. With perTenant below the pool's size the
// other tenants always find a connection that no single tenant holds.
//
// The calls that name a tenant count against its share (every call of a
// key, a record or a tenant); those that name none — the reaper, the
// orphan watch, listings across tenants, ListTenants — pass through, as do
// all calls when perTenant <= 0 (which returns s). On a store whose
// writes take turns on one writer (SerialWriter: SQLite), a tenant's
// writes and reads have a share each: its writes queue for the writer
// without a connection, so they must not keep its reads, which run beside
// the writer, from the connections. observe, when not nil,
// is told of every call that found its tenant's share in use, once its
// wait ended: err is nil when it got its turn, else the error it returns.
//
// The hot path takes no lock shared between tenants and allocates nothing:
// one lookup in a sync.Map and a send on the tenant's buffered channel.
func WithTenantShare(s Store, perTenant int, observe func(tenant string, err error)) Store {
	if perTenant <= 0 {
		return s
	}
	_, serial := s.(SerialWriter)
	return &shareStore{s: s, per: perTenant, serial: serial, observe: observe}
}

// SerialWriter is implemented by a Store whose writes take turns on a
// single writer and wait for their turn without holding a connection
// (SQLite), while its reads run beside the writer on the other
// connections. WithTenantShare then gives a tenant's writes and its reads
// a share each.
type SerialWriter interface {
	// SerialWrites only marks the Store.
	SerialWrites()
}

type shareStore struct {
	s       Store
	per     int
	serial  bool
	observe func(tenant string, err error)
	// slots maps a tenant id to its *tenantSlots. Tenants are created by
	// the operator, so it holds one entry per tenant seen.
	slots sync.Map
}

// tenantSlots are the semaphores of one tenant, each a chan struct{} of
// capacity per: a send takes a slot, a receive gives it back, and
// goroutines blocked sending are woken first in, first out. writes is
// reads unless the store is a SerialWriter.
type tenantSlots struct {
	reads, writes chan struct{}
}

// Whether a call writes, for the semaphore it takes.
const (
	read  = false
	write = true
)

var _ Store = (*shareStore)(nil)

// acquire takes one of tenant's slots, waiting for one while ctx lasts.
// It returns the semaphore to release (nil for a call that names no
// tenant).
func (ss *shareStore) acquire(ctx context.Context, tenant string, writes bool) (chan struct{}, error) {
	if tenant == "" {
		return nil, nil
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
	sem := v.(*tenantSlots).reads
	if writes {
		sem = v.(*tenantSlots).writes
	}
	select {
	case sem <- struct{}{}:
		return sem, nil
	default:
	}
	var err error
	select {
	case sem <- struct{}{}:
	case <-ctx.Done():
		sem = nil
		err = StoreUnavailable("this tenant's store calls in progress held its whole share of the database connections until the store deadline", ctx.Err())
	}
	if ss.observe != nil {
		ss.observe(tenant, err)
	}
	return sem, err
}

// shared runs f in one of tenant's slots (of its writes or its reads).
func shared[T any](ss *shareStore, ctx context.Context, tenant string, writes bool, f func() (T, error)) (T, error) {
	sem, err := ss.acquire(ctx, tenant, writes)
	if err != nil {
		var zero T
		return zero, err
	}
	if sem != nil {
		defer func() { <-sem }()
	}
	return f()
}

// sharedErr is shared for calls that return only an error.
func sharedErr(ss *shareStore, ctx context.Context, tenant string, writes bool, f func() error) error {
	sem, err := ss.acquire(ctx, tenant, writes)
	if err != nil {
		return err
	}
	if sem != nil {
		defer func() { <-sem }()
	}
	return f()
}

func (ss *shareStore) Claim(ctx context.Context, p ClaimParams) (ClaimResult, error) {
	return shared(ss, ctx, p.TenantID, write, func() (ClaimResult, error) { return ss.s.Claim(ctx, p) })
}

func (ss *shareStore) Checkpoint(ctx context.Context, p CheckpointParams) (Record, error) {
	return shared(ss, ctx, p.TenantID, write, func() (Record, error) { return ss.s.Checkpoint(ctx, p) })
}

func (ss *shareStore) Complete(ctx context.Context, p CompleteParams) (Record, error) {
	return shared(ss, ctx, p.TenantID, write, func() (Record, error) { return ss.s.Complete(ctx, p) })
}

func (ss *shareStore) Release(ctx context.Context, p ReleaseParams) error {
	return sharedErr(ss, ctx, p.TenantID, write, func() error { return ss.s.Release(ctx, p) })
}

func (ss *shareStore) Resolve(ctx context.Context, p ResolveParams) (Resolution, error) {
	return shared(ss, ctx, p.TenantID, write, func() (Resolution, error) { return ss.s.Resolve(ctx, p) })
}

func (ss *shareStore) ListAudit(ctx context.Context, p ListAuditParams) ([]AuditEntry, error) {
	return shared(ss, ctx, p.TenantID, read, func() ([]AuditEntry, error) { return ss.s.ListAudit(ctx, p) })
}

func (ss *shareStore) GetRecord(ctx context.Context, p GetRecordParams) (Record, error) {
	return shared(ss, ctx, p.TenantID, read, func() (Record, error) { return ss.s.GetRecord(ctx, p) })
}

func (ss *shareStore) ListRecords(ctx context.Context, p ListRecordsParams) ([]Record, error) {
	return shared(ss, ctx, p.TenantID, read, func() ([]Record, error) { return ss.s.ListRecords(ctx, p) })
}

func (ss *shareStore) ListOrphans(ctx context.Context, p ListOrphansParams) ([]Record, error) {
	return shared(ss, ctx, p.TenantID, read, func() ([]Record, error) { return ss.s.ListOrphans(ctx, p) })
}

func (ss *shareStore) OrphanStats(ctx context.Context) ([]OrphanStat, error) {
	return ss.s.OrphanStats(ctx)
}

func (ss *shareStore) Reap(ctx context.Context, p ReapParams) ([]Record, error) {
	return ss.s.Reap(ctx, p)
}

func (ss *shareStore) CreateTenant(ctx context.Context, p CreateTenantParams) (Tenant, error) {
	return shared(ss, ctx, p.ID, write, func() (Tenant, error) { return ss.s.CreateTenant(ctx, p) })
}

func (ss *shareStore) GetTenant(ctx context.Context, id string) (Tenant, error) {
	return shared(ss, ctx, id, read, func() (Tenant, error) { return ss.s.GetTenant(ctx, id) })
}

func (ss *shareStore) ListTenants(ctx context.Context) ([]Tenant, error) {
	return ss.s.ListTenants(ctx)
}

func (ss *shareStore) UpdateTenant(ctx context.Context, p UpdateTenantParams) (Tenant, error) {
	return shared(ss, ctx, p.ID, write, func() (Tenant, error) { return ss.s.UpdateTenant(ctx, p) })
}

func (ss *shareStore) DeleteTenant(ctx context.Context, id string) error {
	return sharedErr(ss, ctx, id, write, func() error { return ss.s.DeleteTenant(ctx, id) })
}

func (ss *shareStore) Ping(ctx context.Context) error { return ss.s.Ping(ctx) }

// Close closes the wrapped store.
func (ss *shareStore) Close() error { return ss.s.Close() }
