// Package tenants is the tenant service: creating and changing tenants with
// defaults and validation, and a small read-through cache of active tenants
// for the request hot path.
//
// The cache lives in one process. Update, Create and Delete invalidate
// this replica's entry at once; other replicas see a change (a new
// setting, a disabled, deleted or re-created tenant) once their entry's
// TTL has run out. An entry is the whole tenant, created_at included: the
// API refuses a tenant's token issued before the tenant was created
// (auth.Principal.IssuedBefore) from the cached tenant, with no store call.
package tenants

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/idem-dev/idem"
)

// DefaultCacheTTL is a sensible cache TTL for Active.
const DefaultCacheTTL = 5 * time.Second

// Patch is a partial change of a tenant; nil fields stay as they are.
type Patch struct {
	Name     *string
	Settings idem.SettingsPatch
	Disabled *bool
}

// Service manages tenants on top of an idem.Store. It is safe for concurrent
// use.
type Service struct {
	store idem.Store
	ttl   time.Duration
	now   func() time.Time

	mu    sync.Mutex
	cache map[string]cacheEntry
}

type cacheEntry struct {
	tenant  idem.Tenant
	expires time.Time
}

// NewService returns a Service. Active caches tenants for cacheTTL; zero or
// less disables the cache.
func NewService(store idem.Store, cacheTTL time.Duration) *Service {
	return &Service{store: store, ttl: cacheTTL, now: time.Now, cache: map[string]cacheEntry{}}
}

// Active returns the tenant id for the request hot path, from the cache when
// a fresh entry exists. It returns an error with code tenant_unknown when the
// tenant does not exist or is disabled, and store errors (store_unavailable)
// as they come. Only existing tenants are cached, so the cache holds at most
// one entry per tenant.
func (s *Service) Active(ctx context.Context, id string) (idem.Tenant, error) {
	t, err := s.Known(ctx, id)
	if err == nil && t.Disabled {
		return idem.Tenant{}, unknown(nil)
	}
	return t, err
}

// Known is Active for a tenant that may be disabled: it returns the
// tenant, disabled or not, and tenant_unknown only when it does not exist.
// The token-guarded writes that finish a claim made before a suspension
// (checkpoint, complete, release) use it, so a suspension stores the work
// under way instead of losing its response to a second run.
func (s *Service) Known(ctx context.Context, id string) (idem.Tenant, error) {
	if err := idem.ValidateTenantID(id); err != nil {
		// No tenant has such an id; do not hand it to the store (a NUL in
		// it is an error on PostgreSQL, not an absent row).
		return idem.Tenant{}, unknown(err)
	}
	t, ok := s.cached(id)
	if !ok {
		var err error
		t, err = s.store.GetTenant(ctx, idem.GetTenantParams{ID: id})
		if errors.Is(err, idem.ErrTenantNotFound) {
			return idem.Tenant{}, unknown(err)
		}
		if err != nil {
			return idem.Tenant{}, fmt.Errorf("active tenant: %w", err)
		}
		s.put(t)
	}
	return t, nil
}

func unknown(cause error) error {
	return &idem.Error{Code: idem.CodeTenantUnknown, Detail: "the token's tenant does not exist or is disabled", Err: cause}
}

func (s *Service) cached(id string) (idem.Tenant, bool) {
	if s.ttl <= 0 {
		return idem.Tenant{}, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.cache[id]
	if !ok {
		return idem.Tenant{}, false
	}
	if !s.now().Before(e.expires) {
		delete(s.cache, id)
		return idem.Tenant{}, false
	}
	return e.tenant, true
}

func (s *Service) put(t idem.Tenant) {
	if s.ttl <= 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cache[t.ID] = cacheEntry{tenant: t, expires: s.now().Add(s.ttl)}
}

// Invalidate drops the cached entry of tenant id on this replica.
func (s *Service) Invalidate(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.cache, id)
}

// Create creates a tenant with the default settings changed by patch. An
// empty name defaults to the id. It returns invalid_request errors naming the
// field for a bad id, name or setting, and ErrTenantExists.
func (s *Service) Create(ctx context.Context, id, name string, patch idem.SettingsPatch) (idem.Tenant, error) {
	if err := idem.ValidateTenantID(id); err != nil {
		return idem.Tenant{}, err
	}
	if name == "" {
		name = id
	}
	if err := idem.ValidateTenantName(name); err != nil {
		return idem.Tenant{}, err
	}
	settings := idem.DefaultSettings().Apply(patch)
	if err := settings.Validate(); err != nil {
		return idem.Tenant{}, err
	}
	t, err := s.store.CreateTenant(ctx, idem.CreateTenantParams{ID: id, Name: name, Settings: settings})
	if err != nil {
		return idem.Tenant{}, fmt.Errorf("create tenant: %w", err)
	}
	s.Invalidate(id)
	return t, nil
}

// Get returns a tenant, disabled or not, straight from the store. It returns
// ErrTenantNotFound.
func (s *Service) Get(ctx context.Context, id string) (idem.Tenant, error) {
	t, err := s.store.GetTenant(ctx, idem.GetTenantParams{ID: id})
	if err != nil {
		return idem.Tenant{}, fmt.Errorf("get tenant: %w", err)
	}
	return t, nil
}

// List returns every tenant ordered by id.
func (s *Service) List(ctx context.Context) ([]idem.Tenant, error) {
	ts, err := s.store.ListTenants(ctx)
	if err != nil {
		return nil, fmt.Errorf("list tenants: %w", err)
	}
	return ts, nil
}

// Update applies p to tenant id after validating the result, and drops this
// replica's cache entry. It returns ErrTenantNotFound and invalid_request
// errors naming the field.
//
// It reads, changes and writes the tenant; two concurrent updates of one
// tenant may lose one another's change (last writer wins). Tenant changes are
// rare operator actions, so this is accepted.
func (s *Service) Update(ctx context.Context, id string, p Patch) (idem.Tenant, error) {
	cur, err := s.store.GetTenant(ctx, idem.GetTenantParams{ID: id})
	if err != nil {
		return idem.Tenant{}, fmt.Errorf("update tenant: %w", err)
	}
	name := cur.Name
	if p.Name != nil {
		name = *p.Name
		if name == "" {
			name = id
		}
		if err := idem.ValidateTenantName(name); err != nil {
			return idem.Tenant{}, err
		}
	}
	settings := cur.Settings.Apply(p.Settings)
	if err := settings.Validate(); err != nil {
		return idem.Tenant{}, err
	}
	disabled := cur.Disabled
	if p.Disabled != nil {
		disabled = *p.Disabled
	}
	t, err := s.store.UpdateTenant(ctx, idem.UpdateTenantParams{ID: id, Name: name, Settings: settings, Disabled: disabled})
	s.Invalidate(id)
	if err != nil {
		return idem.Tenant{}, fmt.Errorf("update tenant: %w", err)
	}
	return t, nil
}

// Delete deletes tenant id and all of its records, and drops this replica's
// cache entry (other replicas refuse the tenant's tokens once their entry's
// TTL has run out). It returns ErrTenantNotFound. To suspend a tenant
// without losing anything, disable it instead.
func (s *Service) Delete(ctx context.Context, id string) error {
	err := s.store.DeleteTenant(ctx, idem.DeleteTenantParams{ID: id})
	s.Invalidate(id)
	if err != nil {
		return fmt.Errorf("delete tenant: %w", err)
	}
	return nil
}

// Ensure returns tenant id, creating it with default settings when it does
// not exist (development mode). A disabled tenant is returned as is.
func (s *Service) Ensure(ctx context.Context, id, name string) (idem.Tenant, error) {
	t, err := s.store.GetTenant(ctx, idem.GetTenantParams{ID: id})
	if err == nil {
		return t, nil
	}
	if !errors.Is(err, idem.ErrTenantNotFound) {
		return idem.Tenant{}, fmt.Errorf("ensure tenant: %w", err)
	}
	t, err = s.Create(ctx, id, name, idem.SettingsPatch{})
	if errors.Is(err, idem.ErrTenantExists) {
		// Another replica created it meanwhile.
		return s.Get(ctx, id)
	}
	if err != nil {
		return idem.Tenant{}, fmt.Errorf("ensure tenant: %w", err)
	}
	return t, nil
}
