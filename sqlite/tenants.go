package sqlite

import (
	"context"
	"database/sql"
	"errors"

	sqlitelib "modernc.org/sqlite/lib"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/sqlite/internal/dbsqlc"
)

// CreateTenant creates a tenant; an existing id is tenant_exists.
func (s *Store) CreateTenant(ctx context.Context, p idem.CreateTenantParams) (idem.Tenant, error) {
	var row dbsqlc.Tenant
	err := s.write(ctx, "create tenant", func() (err error) {
		row, err = s.createTenant(ctx, p)
		return err
	})
	if err != nil {
		return idem.Tenant{}, err
	}
	return tenantFromRow(row, 0), nil
}

func (s *Store) createTenant(ctx context.Context, p idem.CreateTenantParams) (dbsqlc.Tenant, error) {
	row, err := s.q.CreateTenant(ctx, dbsqlc.CreateTenantParams{
		ID:                     p.ID,
		Name:                   p.Name,
		ReplayWindowSeconds:    int64(p.Settings.ReplayWindowSeconds),
		ReaperThresholdSeconds: int64(p.Settings.ReaperThresholdSeconds),
		LeaseSecondsDefault:    int64(p.Settings.LeaseSecondsDefault),
		LeaseSecondsMax:        int64(p.Settings.LeaseSecondsMax),
		MaxResponseBytes:       int64(p.Settings.MaxResponseBytes),
		RateLimitPerSecond:     int64(p.Settings.RateLimitPerSecond),
		MaxWaitSeconds:         int64(p.Settings.MaxWaitSeconds),
		StorageQuotaBytes:      p.Settings.StorageQuotaBytes,
		RetryBudgetPercent:     int64(p.Settings.RetryBudgetPercent),
		Now:                    micros(s.clock()),
	})
	if code := sqliteCode(err); code == sqlitelib.SQLITE_CONSTRAINT_PRIMARYKEY || code == sqlitelib.SQLITE_CONSTRAINT_UNIQUE {
		return row, idem.TenantExists(p.ID, err)
	}
	return row, err
}

// GetTenant returns a tenant, disabled or not.
func (s *Store) GetTenant(ctx context.Context, p idem.GetTenantParams) (idem.Tenant, error) {
	row, err := s.q.GetTenant(ctx, p.ID)
	if errors.Is(err, sql.ErrNoRows) {
		return idem.Tenant{}, idem.TenantNotFound(p.ID)
	}
	if err != nil {
		return idem.Tenant{}, s.interpretError(err, "get tenant")
	}
	return tenantFromRow(row.Tenant, row.StoredBytes), nil
}

// ListTenants returns every tenant ordered by id.
func (s *Store) ListTenants(ctx context.Context) ([]idem.Tenant, error) {
	rows, err := s.q.ListTenants(ctx)
	if err != nil {
		return nil, s.interpretError(err, "list tenants")
	}
	out := make([]idem.Tenant, 0, len(rows))
	for _, r := range rows {
		out = append(out, tenantFromRow(r.Tenant, r.StoredBytes))
	}
	return out, nil
}

// UpdateTenant replaces a tenant's name, settings and disabled flag.
func (s *Store) UpdateTenant(ctx context.Context, p idem.UpdateTenantParams) (idem.Tenant, error) {
	var disabled int64
	if p.Disabled {
		disabled = 1
	}
	var row dbsqlc.Tenant
	var used int64
	err := s.write(ctx, "update tenant", func() (err error) {
		row, err = s.q.UpdateTenant(ctx, dbsqlc.UpdateTenantParams{
			ID:                     p.ID,
			Name:                   p.Name,
			ReplayWindowSeconds:    int64(p.Settings.ReplayWindowSeconds),
			ReaperThresholdSeconds: int64(p.Settings.ReaperThresholdSeconds),
			LeaseSecondsDefault:    int64(p.Settings.LeaseSecondsDefault),
			LeaseSecondsMax:        int64(p.Settings.LeaseSecondsMax),
			MaxResponseBytes:       int64(p.Settings.MaxResponseBytes),
			RateLimitPerSecond:     int64(p.Settings.RateLimitPerSecond),
			MaxWaitSeconds:         int64(p.Settings.MaxWaitSeconds),
			StorageQuotaBytes:      p.Settings.StorageQuotaBytes,
			RetryBudgetPercent:     int64(p.Settings.RetryBudgetPercent),
			Disabled:               disabled,
			Now:                    micros(s.clock()),
		})
		if errors.Is(err, sql.ErrNoRows) {
			return idem.TenantNotFound(p.ID)
		}
		if err != nil {
			return err
		}
		used, err = s.q.TenantStoredBytes(ctx, p.ID)
		return err
	})
	if err != nil {
		return idem.Tenant{}, err
	}
	return tenantFromRow(row, used), nil
}

// DeleteTenant deletes a tenant; its records go with it (ON DELETE
// CASCADE) in the same statement.
func (s *Store) DeleteTenant(ctx context.Context, p idem.DeleteTenantParams) error {
	err := s.write(ctx, "delete tenant", func() error {
		n, err := s.q.DeleteTenant(ctx, p.ID)
		if err == nil && n == 0 {
			return idem.TenantNotFound(p.ID)
		}
		return err
	})
	if err == nil {
		s.events.PublishTenant(p.ID)
	}
	return err
}
