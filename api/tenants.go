package api

import (
	"context"
	"fmt"
	"net/http"

	"github.com/go-chi/chi/v5"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/tenants"
)

// emptyRequest is the request of endpoints that take no input.
type emptyRequest struct{}

// getOwnTenant is GET /v1/tenant. It reads the store, not the cache, so a
// PATCH is visible at once.
func (s *service) getOwnTenant(ctx context.Context, _ *emptyRequest) (tenantJSON, error) {
	t, err := s.tenants.Get(ctx, tenantFrom(ctx).ID)
	return answer(t, err, "get own tenant", encodeTenant)
}

// patchOwnTenantRequest is the body of PATCH /v1/tenant: the caller may
// change its own name and settings, not its disabled flag.
type patchOwnTenantRequest struct {
	Name     *string            `json:"name"`
	Settings idem.SettingsPatch `json:"settings"`
}

func (s *service) patchOwnTenant(ctx context.Context, req *patchOwnTenantRequest) (tenantJSON, error) {
	t, err := s.tenants.Update(ctx, tenantFrom(ctx).ID, tenants.Patch{Name: req.Name, Settings: req.Settings})
	return answer(t, err, "patch own tenant", encodeTenant)
}

// createTenantRequest is the body of POST /v1/admin/tenants.
type createTenantRequest struct {
	ID       string             `json:"id"`
	Name     string             `json:"name"`
	Settings idem.SettingsPatch `json:"settings"`
}

func (s *service) createTenant(ctx context.Context, req *createTenantRequest) (reply, error) {
	t, err := s.tenants.Create(ctx, req.ID, req.Name, req.Settings)
	return answerCreated(t, err, "create tenant", encodeTenant)
}

func (s *service) listTenants(ctx context.Context, _ *emptyRequest) (listJSON[tenantJSON], error) {
	ts, err := s.tenants.List(ctx)
	return answerList(ts, err, "list tenants", encodeTenant)
}

// tenantParam is the {id} of /v1/admin/tenants/{id}.
type tenantParam struct {
	id string
}

func (p *tenantParam) bind(r *http.Request) error {
	p.id = chi.URLParam(r, "id")
	if idem.ValidateTenantID(p.id) != nil {
		// A malformed id names no tenant.
		return idem.Errorf(idem.CodeTenantNotFound, "no tenant with this id")
	}
	return nil
}

type getTenantRequest struct {
	tenantParam `json:"-"`
}

func (s *service) getTenant(ctx context.Context, req *getTenantRequest) (tenantJSON, error) {
	t, err := s.tenants.Get(ctx, req.id)
	return answer(t, err, "get tenant", encodeTenant)
}

// patchTenantRequest is the body of PATCH /v1/admin/tenants/{id}.
type patchTenantRequest struct {
	tenantParam `json:"-"`
	Name        *string            `json:"name"`
	Settings    idem.SettingsPatch `json:"settings"`
	Disabled    *bool              `json:"disabled"`
}

func (s *service) patchTenant(ctx context.Context, req *patchTenantRequest) (tenantJSON, error) {
	t, err := s.tenants.Update(ctx, req.id, tenants.Patch{Name: req.Name, Settings: req.Settings, Disabled: req.Disabled})
	return answer(t, err, "patch tenant", encodeTenant)
}

type deleteTenantRequest struct {
	tenantParam `json:"-"`
}

// deleteTenant deletes the tenant and all of its records (disabling, by
// PATCH, is the reversible way to suspend one).
func (s *service) deleteTenant(ctx context.Context, req *deleteTenantRequest) (noContent, error) {
	return answerDone(s.tenants.Delete(ctx, req.id), "delete tenant")
}

// listOrphansRequest is GET /v1/admin/orphans?tenant=&limit=&cursor=.
type listOrphansRequest struct {
	pageParams `json:"-"`
	tenant     string
	completion idem.CompletionFilter
}

func (l *listOrphansRequest) bind(r *http.Request) error {
	var err error
	if l.tenant, err = bindTenantFilter(r.URL.Query()); err != nil {
		return err
	}
	if l.completion, err = bindCompletionFilter(r); err != nil {
		return err
	}
	return l.pageParams.bind(r)
}

func (s *service) listOrphans(ctx context.Context, req *listOrphansRequest) (listJSON[orphanJSON], error) {
	recs, err := s.store.ListOrphans(ctx, idem.ListOrphansParams{TenantID: req.tenant, Completion: req.completion, Limit: req.limit + 1, After: req.after})
	if err != nil {
		return listJSON[orphanJSON]{}, fmt.Errorf("list orphans: %w", err)
	}
	return pageOf(recs, req.limit, encodeOrphan, func(last idem.Record) idem.Cursor {
		return idem.Cursor{Time: last.LeaseExpiresAt, TenantID: last.TenantID, Key: last.Key}
	}), nil
}
