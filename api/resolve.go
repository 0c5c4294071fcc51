package api

import (
	"context"
	"fmt"
	"net/http"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/auth"
)

// Resolving orphans by hand (idem.ResolveAction): a tenant admin for the
// tenant's own keys (/v1/keys/{key}/resolve, scope tenant:admin), an
// operator for any tenant's (/v1/admin/tenants/{id}/keys/{key}/resolve,
// scope admin). Both go through resolveKey, and every resolution is written
// with its audit entry by Store.Resolve.

// resolveRequest is the body of a resolution.
type resolveRequest struct {
	keyParam     `json:"-"`
	Action       idem.ResolveAction `json:"action"`
	FencingToken *int64             `json:"fencing_token"`
	Response     *responseInput     `json:"response"`
	Note         *string            `json:"note"`

	params idem.ResolveParams
}

func (r *resolveRequest) validate() error {
	if err := requireToken(r.FencingToken); err != nil {
		return err
	}
	r.params = idem.ResolveParams{Key: r.key, Action: r.Action, FencingToken: *r.FencingToken}
	if r.Note != nil {
		r.params.Note = *r.Note
	}
	if r.Response != nil && r.Action == idem.ResolveComplete {
		resp, err := r.Response.decode()
		if err != nil {
			return err
		}
		r.params.Response = &resp
	} else if r.Response != nil {
		r.params.Response = &idem.Response{} // refused by Validate
	}
	return r.params.Validate()
}

// adminResolveRequest is an operator's resolution of a key of tenant {id}.
type adminResolveRequest struct {
	resolveRequest
	tenantParam `json:"-"`
}

func (r *adminResolveRequest) bind(req *http.Request) error {
	return bindAll(req, &r.tenantParam, &r.resolveRequest)
}

// resolutionJSON is the answer to a resolution: the record after it (null
// after a release: the record is gone) and the audit entry written with it.
type resolutionJSON struct {
	Action idem.ResolveAction `json:"action"`
	Record *recordJSON        `json:"record"`
	Audit  auditJSON          `json:"audit"`
}

// auditJSON is one audit entry.
type auditJSON struct {
	ID              int64              `json:"id"`
	Tenant          string             `json:"tenant"`
	Key             string             `json:"key"`
	Action          idem.ResolveAction `json:"action"`
	FencingToken    int64              `json:"fencing_token"`
	NewFencingToken *int64             `json:"new_fencing_token"`
	Note            string             `json:"note"`
	Actor           actorJSON          `json:"actor"`
	CreatedAt       jsonTime           `json:"created_at"`
}

type actorJSON struct {
	Subject string `json:"subject"`
	Tenant  string `json:"tenant"`
	Scope   string `json:"scope"`
}

func encodeAudit(e idem.AuditEntry) auditJSON {
	out := auditJSON{
		ID: e.ID, Tenant: e.TenantID, Key: e.Key, Action: e.Action,
		FencingToken: e.FencingToken, Note: e.Note,
		Actor:     actorJSON{Subject: e.Actor.Subject, Tenant: e.Actor.Tenant, Scope: e.Actor.Scope},
		CreatedAt: timeJSON(e.CreatedAt),
	}
	if e.NewFencingToken != 0 {
		out.NewFencingToken = &e.NewFencingToken
	}
	return out
}

// resolveKey applies a resolution of a key of tenant t by the caller, who
// acts with scope. A completion's response is held to the tenant's
// max_response_bytes, as a worker's is.
func (s *service) resolveKey(ctx context.Context, t idem.Tenant, scope string, p idem.ResolveParams) (resolutionJSON, error) {
	if p.Response != nil {
		if size := p.Response.Size(); size > t.Settings.MaxResponseBytes {
			return resolutionJSON{}, idem.Errorf(idem.CodePayloadTooLarge, "the response is %d bytes; the tenant's max_response_bytes is %d", size, t.Settings.MaxResponseBytes)
		}
	}
	who := principalFrom(ctx)
	p.TenantID = t.ID
	p.Actor = idem.Actor{Subject: who.Subject, Tenant: who.Tenant, Scope: scope}
	res, err := s.store.Resolve(ctx, p)
	if err != nil {
		return resolutionJSON{}, fmt.Errorf("resolve key: %w", err)
	}
	out := resolutionJSON{Action: p.Action, Audit: encodeAudit(res.Audit)}
	if p.Action != idem.ResolveRelease {
		rec := encodeRecord(res.Record)
		out.Record = &rec
	}
	return out, nil
}

// resolveOwn is POST /v1/keys/{key}/resolve (scope tenant:admin).
func (s *service) resolveOwn(ctx context.Context, req *resolveRequest) (resolutionJSON, error) {
	return s.resolveKey(ctx, tenantFrom(ctx), auth.ScopeTenantAdmin, req.params)
}

// resolveAny is POST /v1/admin/tenants/{id}/keys/{key}/resolve (scope
// admin). A disabled tenant's keys may be resolved too.
func (s *service) resolveAny(ctx context.Context, req *adminResolveRequest) (resolutionJSON, error) {
	t, err := s.tenants.Get(ctx, req.id)
	if err != nil {
		return resolutionJSON{}, fmt.Errorf("resolve key: %w", err)
	}
	return s.resolveKey(ctx, t, auth.ScopeAdmin, req.params)
}

// adminKeyRequest is GET /v1/admin/tenants/{id}/keys/{key}.
type adminKeyRequest struct {
	tenantParam `json:"-"`
	keyParam    `json:"-"`
	answerHold  `json:"-"`
}

func (r *adminKeyRequest) bind(req *http.Request) error {
	return bindAll(req, &r.tenantParam, &r.keyParam)
}

// getAnyKey is GET /v1/admin/tenants/{id}/keys/{key}: an operator reads
// the record of any tenant's key before resolving it.
func (s *service) getAnyKey(ctx context.Context, req *adminKeyRequest) (recordJSON, error) {
	return s.readKey(ctx, req.id, req.key, &req.answerHold)
}

// auditPageRequest is the limit and cursor of an audit listing.
type auditPageRequest struct {
	pageParams `json:"-"`
}

// listAudit returns one page of audit entries of p (Limit and After are
// set here).
func (s *service) listAudit(ctx context.Context, p idem.ListAuditParams, page pageParams) (listJSON[auditJSON], error) {
	p.Limit, p.After = page.limit+1, page.after
	entries, err := s.store.ListAudit(ctx, p)
	if err != nil {
		return listJSON[auditJSON]{}, fmt.Errorf("list audit: %w", err)
	}
	return pageOf(entries, page.limit, encodeAudit, func(last idem.AuditEntry) idem.Cursor {
		return idem.Cursor{Time: last.CreatedAt, Key: last.Key, ID: last.ID}
	}), nil
}

// keyAuditRequest is GET /v1/keys/{key}/audit.
type keyAuditRequest struct {
	keyParam   `json:"-"`
	pageParams `json:"-"`
}

func (r *keyAuditRequest) bind(req *http.Request) error {
	return bindAll(req, &r.keyParam, &r.pageParams)
}

// listOwnKeyAudit is GET /v1/keys/{key}/audit: the audit trail of one of
// the tenant's keys, also after a release deleted its record.
func (s *service) listOwnKeyAudit(ctx context.Context, req *keyAuditRequest) (listJSON[auditJSON], error) {
	return s.listAudit(ctx, idem.ListAuditParams{TenantID: tenantFrom(ctx).ID, Key: req.key}, req.pageParams)
}

// listOwnAudit is GET /v1/audit: the tenant's audit log.
func (s *service) listOwnAudit(ctx context.Context, req *auditPageRequest) (listJSON[auditJSON], error) {
	return s.listAudit(ctx, idem.ListAuditParams{TenantID: tenantFrom(ctx).ID}, req.pageParams)
}

// adminKeyAuditRequest is GET /v1/admin/tenants/{id}/keys/{key}/audit.
type adminKeyAuditRequest struct {
	adminKeyRequest
	pageParams `json:"-"`
}

func (r *adminKeyAuditRequest) bind(req *http.Request) error {
	return bindAll(req, &r.adminKeyRequest, &r.pageParams)
}

// listAnyKeyAudit is GET /v1/admin/tenants/{id}/keys/{key}/audit; an
// unknown tenant is tenant_not_found (its entries went with it).
func (s *service) listAnyKeyAudit(ctx context.Context, req *adminKeyAuditRequest) (listJSON[auditJSON], error) {
	if _, err := s.tenants.Get(ctx, req.id); err != nil {
		return listJSON[auditJSON]{}, fmt.Errorf("list audit: %w", err)
	}
	return s.listAudit(ctx, idem.ListAuditParams{TenantID: req.id, Key: req.key}, req.pageParams)
}

// adminAuditRequest is GET /v1/admin/audit?tenant=&limit=&cursor=.
type adminAuditRequest struct {
	listOrphansRequest // the same parameters: an optional tenant and a page
}

func (s *service) listAnyAudit(ctx context.Context, req *adminAuditRequest) (listJSON[auditJSON], error) {
	return s.listAudit(ctx, idem.ListAuditParams{TenantID: req.tenant}, req.pageParams)
}
