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
	t, err := s.q.CreateTenant(ctx, dbsqlc.CreateTenantParams(s.tenantArgs(p.ID, p.Name, p.Settings, false)))
	if pgErrorCode(err) == pgUniqueViolation {
		return idem.Tenant{}, idem.TenantExists(p.ID, err)
	}
	if err != nil {
		return idem.Tenant{}, s.interpretError(err, "create tenant")
	}
	return tenantFromRow(t, 0), nil
}

// GetTenant returns a tenant, disabled or not.
func (s *Store) GetTenant(ctx context.Context, p idem.GetTenantParams) (idem.Tenant, error) {
	t, err := s.q.GetTenant(ctx, p.ID)
	if errors.Is(err, pgx.ErrNoRows) {
		return idem.Tenant{}, idem.TenantNotFound(p.ID)
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
	t, err := s.q.UpdateTenant(ctx, s.tenantArgs(p.ID, p.Name, p.Settings, p.Disabled))
	if errors.Is(err, pgx.ErrNoRows) {
		return idem.Tenant{}, idem.TenantNotFound(p.ID)
	}
	if err != nil {
		return idem.Tenant{}, s.interpretError(err, "update tenant")
	}
	return tenantFromRow(t.Tenant, t.StoredBytes), nil
}

// tenantArgs are the arguments of UpdateTenant and, converted, of
// CreateTenant: the two queries take the same ones (a tenant created
// disabled is disabled from its creation).
func (s *Store) tenantArgs(id, name string, st idem.Settings, disabled bool) dbsqlc.UpdateTenantParams {
	return dbsqlc.UpdateTenantParams{
		ID:                     id,
		Name:                   name,
		ReplayWindowSeconds:    int32(st.ReplayWindowSeconds),
		ReaperThresholdSeconds: int32(st.ReaperThresholdSeconds),
		LeaseSecondsDefault:    int32(st.LeaseSecondsDefault),
		LeaseSecondsMax:        int32(st.LeaseSecondsMax),
		MaxResponseBytes:       int32(st.MaxResponseBytes),
		RateLimitPerSecond:     int32(st.RateLimitPerSecond),
		MaxWaitSeconds:         int32(st.MaxWaitSeconds),
		StorageQuotaBytes:      st.StorageQuotaBytes,
		RetryBudgetPercent:     int32(st.RetryBudgetPercent),
		Disabled:               disabled,
		Now:                    s.clock(),
	}
}

// deleteBatch is how many records of a deleted tenant one statement
// deletes before the final transaction.
const deleteBatch = 1000

// DeleteTenant deletes a tenant and its records (migration 00016): it
// marks the tenant deleting (no claim creates a record of it from then
// on, every other call finds it gone), deletes its records in batches,
// and then, in one transaction, locks the tenant's row, takes SHARE ROW
// EXCLUSIVE on idempotency_keys (waiting for the writes in progress,
// claims that read the tenant before the mark included, and holding new
// ones back until it commits), deletes the records left and the tenant's
// row; its usage rows, audit entries, endpoints and deliveries cascade. A
// record never outlives its tenant, and the claims never lock the
// tenant's row. Every writer waits only for that last transaction, which
// deletes what the claims in progress at the mark created.
func (s *Store) DeleteTenant(ctx context.Context, p idem.DeleteTenantParams) error {
	n, err := s.q.MarkTenantDeleting(ctx, p.ID)
	if err != nil {
		return s.interpretError(err, "delete tenant")
	}
	if n == 0 {
		return idem.TenantNotFound(p.ID)
	}
	for {
		n, err := s.q.DeleteTenantKeys(ctx, dbsqlc.DeleteTenantKeysParams{TenantID: p.ID, RowLimit: deleteBatch})
		if err != nil {
			return s.interpretError(err, "delete tenant: delete its records")
		}
		if n < deleteBatch {
			break
		}
	}
	return s.inTx(ctx, "delete tenant", func(q *dbsqlc.Queries) error {
		if _, err := q.LockTenantForDelete(ctx, p.ID); errors.Is(err, pgx.ErrNoRows) {
			return idem.TenantNotFound(p.ID) // another deletion finished it
		} else if err != nil {
			return err
		}
		if err := q.LockKeysForTenantDelete(ctx); err != nil {
			return err
		}
		if _, err := q.DeleteTenantRest(ctx, p.ID); err != nil {
			return err
		}
		_, err := q.DeleteTenant(ctx, p.ID)
		return err
	})
}
