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
	row, err := s.q.CreateTenant(ctx, dbsqlc.CreateTenantParams(s.tenantArgs(p.ID, p.Name, p.Settings, false)))
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
	var row dbsqlc.Tenant
	var used int64
	err := s.write(ctx, "update tenant", func() (err error) {
		row, err = s.q.UpdateTenant(ctx, s.tenantArgs(p.ID, p.Name, p.Settings, p.Disabled))
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

// tenantArgs are the arguments of UpdateTenant and, converted, of
// CreateTenant: the two queries take the same ones (a tenant created
// disabled is disabled from its creation).
func (s *Store) tenantArgs(id, name string, st idem.Settings, disabled bool) dbsqlc.UpdateTenantParams {
	var flag int64
	if disabled {
		flag = 1
	}
	return dbsqlc.UpdateTenantParams{
		ID:                     id,
		Name:                   name,
		ReplayWindowSeconds:    int64(st.ReplayWindowSeconds),
		ReaperThresholdSeconds: int64(st.ReaperThresholdSeconds),
		LeaseSecondsDefault:    int64(st.LeaseSecondsDefault),
		LeaseSecondsMax:        int64(st.LeaseSecondsMax),
		MaxResponseBytes:       int64(st.MaxResponseBytes),
		RateLimitPerSecond:     int64(st.RateLimitPerSecond),
		MaxWaitSeconds:         int64(st.MaxWaitSeconds),
		StorageQuotaBytes:      st.StorageQuotaBytes,
		RetryBudgetPercent:     int64(st.RetryBudgetPercent),
		Disabled:               flag,
		Now:                    micros(s.clock()),
	}
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
