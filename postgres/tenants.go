package postgres

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/postgres/internal/dbsqlc"
)

// CreateTenant creates a tenant; an existing id is tenant_exists.
func (s *Store) CreateTenant(ctx context.Context, p idem.CreateTenantParams) (idem.Tenant, error) {
	t, err := s.q.CreateTenant(ctx, dbsqlc.CreateTenantParams{
		ID:                     p.ID,
		Name:                   p.Name,
		ReplayWindowSeconds:    int32(p.Settings.ReplayWindowSeconds),
		ReaperThresholdSeconds: int32(p.Settings.ReaperThresholdSeconds),
		LeaseSecondsDefault:    int32(p.Settings.LeaseSecondsDefault),
		LeaseSecondsMax:        int32(p.Settings.LeaseSecondsMax),
		MaxResponseBytes:       int32(p.Settings.MaxResponseBytes),
		RateLimitPerSecond:     int32(p.Settings.RateLimitPerSecond),
		MaxWaitSeconds:         int32(p.Settings.MaxWaitSeconds),
		StorageQuotaBytes:      p.Settings.StorageQuotaBytes,
		RetryBudgetPercent:     int32(p.Settings.RetryBudgetPercent),
		Now:                    s.clock(),
	})
	if pgErrorCode(err) == pgUniqueViolation {
		return idem.Tenant{}, idem.TenantExists(p.ID, err)
	}
	if err != nil {
		return idem.Tenant{}, s.interpretError(err, "create tenant")
	}
	return tenantFromRow(t, 0), nil
}

// GetTenant returns a tenant, disabled or not.
func (s *Store) GetTenant(ctx context.Context, id string) (idem.Tenant, error) {
	t, err := s.q.GetTenant(ctx, id)
	if errors.Is(err, pgx.ErrNoRows) {
		return idem.Tenant{}, idem.TenantNotFound(id)
	}
	if err != nil {
		return idem.Tenant{}, s.interpretError(err, "get tenant")
	}
	return tenantFromRow(t.Tenant, t.StoredBytes), nil
}

// ListTenants returns every tenant ordered by id.
func (s *Store) ListTenants(ctx context.Context) ([]idem.Tenant, error) {
	rows, err := s.q.ListTenants(ctx)
	if err != nil {
		return nil, s.interpretError(err, "list tenants")
	}
	out := make([]idem.Tenant, 0, len(rows))
	for _, t := range rows {
		out = append(out, tenantFromRow(t.Tenant, t.StoredBytes))
	}
	return out, nil
}

// UpdateTenant replaces a tenant's name, settings and disabled flag.
func (s *Store) UpdateTenant(ctx context.Context, p idem.UpdateTenantParams) (idem.Tenant, error) {
	t, err := s.q.UpdateTenant(ctx, dbsqlc.UpdateTenantParams{
		ID:                     p.ID,
		Name:                   p.Name,
		ReplayWindowSeconds:    int32(p.Settings.ReplayWindowSeconds),
		ReaperThresholdSeconds: int32(p.Settings.ReaperThresholdSeconds),
		LeaseSecondsDefault:    int32(p.Settings.LeaseSecondsDefault),
		LeaseSecondsMax:        int32(p.Settings.LeaseSecondsMax),
		MaxResponseBytes:       int32(p.Settings.MaxResponseBytes),
		RateLimitPerSecond:     int32(p.Settings.RateLimitPerSecond),
		MaxWaitSeconds:         int32(p.Settings.MaxWaitSeconds),
		StorageQuotaBytes:      p.Settings.StorageQuotaBytes,
		RetryBudgetPercent:     int32(p.Settings.RetryBudgetPercent),
		Disabled:               p.Disabled,
		Now:                    s.clock(),
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return idem.Tenant{}, idem.TenantNotFound(p.ID)
	}
	if err != nil {
		return idem.Tenant{}, s.interpretError(err, "update tenant")
	}
	return tenantFromRow(t.Tenant, t.StoredBytes), nil
}

// DeleteTenant deletes a tenant; its records go with it (ON DELETE
// CASCADE) in the same statement.
func (s *Store) DeleteTenant(ctx context.Context, id string) error {
	n, err := s.q.DeleteTenant(ctx, id)
	if err != nil {
		return s.interpretError(err, "delete tenant")
	}
	if n == 0 {
		return idem.TenantNotFound(id)
	}
	return nil
}
