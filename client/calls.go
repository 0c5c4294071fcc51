package client

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

func keyPath(key string, suffix string) string {
	return "/v1/keys/" + url.PathEscape(key) + suffix
}

func adminTenantPath(id string) string {
	return "/v1/admin/tenants/" + url.PathEscape(id)
}

// Claim claims key for the request (POST /v1/keys/{key}/claim). The answer
// is a fresh claim or a takeover (201), or a replay of a completed request
// (200, Replayed true). A held key is an *Error matching
// ErrRequestInFlight (RetryAfter = lease left); another request under the
// same key matches ErrFingerprintMismatch. Most callers want Do instead.
func (c *Client) Claim(ctx context.Context, key string, req Request) (ClaimResult, error) {
	if err := ValidateKey(key); err != nil {
		return ClaimResult{}, fmt.Errorf("claim: %w", err)
	}
	body := claimBody{Operation: req.Operation, Fingerprint: req.Fingerprint, Request: req.Payload, LeaseSeconds: leaseSeconds(req.Lease),
		AttemptID: c.attemptID(req), WaitSeconds: int(max(req.Wait, 0) / time.Second)}
	var out ClaimResult
	res, err := c.do(ctx, apiCall{name: "claim", method: http.MethodPost, path: keyPath(key, "/claim"), body: body, out: &out})
	if err != nil {
		return ClaimResult{}, err
	}
	out.Replayed = res.status == http.StatusOK || res.header.Get("Idempotent-Replayed") == "true"
	if err := checkClaimAnswer(res.status, res.header.Get("Idempotent-Replayed") == "true", out); err != nil {
		return ClaimResult{}, fmt.Errorf("claim: %w", err)
	}
	out.WaitApplied = waitApplied(res.header)
	if at, err := http.ParseTime(res.header.Get("Date")); err == nil {
		if !out.LeaseExpiresAt.IsZero() {
			out.LeaseLeft = max(out.LeaseExpiresAt.Sub(at), 0)
		}
		if out.Replayed && !out.ReplayUntil.IsZero() {
			out.ReplayLeft = max(out.ReplayUntil.Sub(at)-time.Second, 0)
		}
	}
	return out, nil
}

// checkClaimAnswer refuses a claim answer the client cannot act on
// safely: running the function on a claim without a fencing token or
// state, or replaying a response the server did not send, would do the
// very thing idempotency prevents. A claim is 201 in_flight with a fencing
// token and an attempt; a replay is 200 completed with a response whose
// status idem can have stored; anything else (a broken proxy, a hostile
// or foreign server) matches ErrInvalidAnswer.
func checkClaimAnswer(status int, markedReplayed bool, cr ClaimResult) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: the %d answer to a claim %s", ErrInvalidAnswer, status, fmt.Sprintf(format, args...))
	}
	switch status {
	case http.StatusCreated:
		switch {
		case markedReplayed:
			return bad("is marked Idempotent-Replayed")
		case cr.State != StateInFlight:
			return bad("has state %q, not in_flight", cr.State)
		case cr.FencingToken < 1:
			return bad("has no fencing token")
		case cr.Attempt < 1:
			return bad("has no attempt")
		}
	case http.StatusOK:
		switch {
		case cr.State != StateCompleted:
			return bad("has state %q, not completed", cr.State)
		case cr.Response == nil:
			return bad("replays no stored response")
		case cr.Response.Status < 100 || cr.Response.Status > 599:
			return bad("replays a response of status %d", cr.Response.Status)
		}
	default:
		return bad("is neither a claim (201) nor a replay (200)")
	}
	return nil
}

type checkpointBody struct {
	FencingToken  int64           `json:"fencing_token"`
	RecoveryPoint string          `json:"recovery_point"`
	Data          json.RawMessage `json:"data,omitempty"`
	LeaseSeconds  int             `json:"lease_seconds,omitempty"`
}

// Checkpoint saves a recovery point (name plus optional JSON data) on a
// claimed key and renews its lease (POST /v1/keys/{key}/checkpoint). lease
// zero renews by the tenant's default. A stale token matches ErrLeaseLost.
func (c *Client) Checkpoint(ctx context.Context, key string, token int64, name string, data json.RawMessage, lease time.Duration) (Record, error) {
	if err := ValidateKey(key); err != nil {
		return Record{}, fmt.Errorf("checkpoint: %w", err)
	}
	var out Record
	_, err := c.do(ctx, apiCall{name: "checkpoint", method: http.MethodPost, path: keyPath(key, "/checkpoint"),
		body: checkpointBody{FencingToken: token, RecoveryPoint: name, Data: data, LeaseSeconds: leaseSeconds(lease)}, out: &out})
	return out, err
}

type completeBody struct {
	FencingToken int64    `json:"fencing_token"`
	Response     Response `json:"response"`
}

// Complete stores the response of a claimed key and ends the claim (POST
// /v1/keys/{key}/complete). Repeating it with the same token and response
// is a no-op, which makes it safe to retry; a different response matches
// ErrAlreadyCompleted, a stale token ErrLeaseLost, a response over the
// tenant's limit ErrPayloadTooLarge (the claim stays).
func (c *Client) Complete(ctx context.Context, key string, token int64, resp Response) (Record, error) {
	var out Record
	if err := c.complete(ctx, key, token, resp, &out); err != nil {
		return Record{}, err
	}
	return out, nil
}

// completedAnswer is what CompleteNoRecord reads of the complete's answer.
type completedAnswer struct {
	State State `json:"state"`
}

// CompleteNoRecord is Complete for a caller that has no use for the
// stored record it answers (Do, client/idemhttp): the caller holds the
// response it stored. Of the answer it reads only the state, which must
// be completed (otherwise ErrInvalidAnswer, as for a claim's answer),
// instead of decoding the whole record, its timestamps and the response
// echoed back: that decoding was ~7 % of a protected app's CPU
// (docs/benchmarks.md, issue 23). The answer must still be one JSON
// object. Errors are Complete's.
func (c *Client) CompleteNoRecord(ctx context.Context, key string, token int64, resp Response) error {
	var a completedAnswer
	if err := c.complete(ctx, key, token, resp, &a); err != nil {
		return err
	}
	if a.State != StateCompleted {
		return fmt.Errorf("complete: %w: the 2xx answer has state %q, not completed", ErrInvalidAnswer, a.State)
	}
	return nil
}

// complete sends the complete call and decodes its answer into out.
func (c *Client) complete(ctx context.Context, key string, token int64, resp Response, out any) error {
	if err := ValidateKey(key); err != nil {
		return fmt.Errorf("complete: %w", err)
	}
	_, err := c.do(ctx, apiCall{name: "complete", method: http.MethodPost, path: keyPath(key, "/complete"),
		body: completeBody{FencingToken: token, Response: resp}, out: out})
	return err
}

// Release removes a claimed key whose attempt left no side effect, so that
// the next claim starts afresh (POST /v1/keys/{key}/release). A stale token
// matches ErrLeaseLost; an absent key ErrKeyNotFound.
func (c *Client) Release(ctx context.Context, key string, token int64) error {
	if err := ValidateKey(key); err != nil {
		return fmt.Errorf("release: %w", err)
	}
	_, err := c.do(ctx, apiCall{name: "release", method: http.MethodPost, path: keyPath(key, "/release"),
		body: struct {
			FencingToken int64 `json:"fencing_token"`
		}{token}})
	return err
}

// Get returns the full record of key (GET /v1/keys/{key}); an absent key
// matches ErrKeyNotFound.
func (c *Client) Get(ctx context.Context, key string) (Record, error) {
	if err := ValidateKey(key); err != nil {
		return Record{}, fmt.Errorf("get key: %w", err)
	}
	var out Record
	_, err := c.do(ctx, apiCall{name: "get key", method: http.MethodGet, path: keyPath(key, ""), out: &out})
	return out, err
}

// List returns one page of the tenant's records, newest first (GET
// /v1/keys).
func (c *Client) List(ctx context.Context, opts ListOptions) (KeyPage, error) {
	q := pageQuery("state", string(opts.State), opts.Limit, opts.Cursor)
	if opts.Completer != "" {
		q.Set("completer", opts.Completer)
	}
	var out KeyPage
	_, err := c.do(ctx, apiCall{name: "list keys", method: http.MethodGet, path: "/v1/keys", query: q, out: &out})
	return out, err
}

// GetTenant returns the caller's own tenant (GET /v1/tenant).
func (c *Client) GetTenant(ctx context.Context) (Tenant, error) {
	var out Tenant
	_, err := c.do(ctx, apiCall{name: "get tenant", method: http.MethodGet, path: "/v1/tenant", out: &out})
	return out, err
}

// UpdateTenant changes the caller's own tenant (PATCH /v1/tenant, scope
// tenant:admin). Violations match ErrInvalidRequest and name the field in
// Error.Fields.
func (c *Client) UpdateTenant(ctx context.Context, p TenantPatch) (Tenant, error) {
	var out Tenant
	_, err := c.do(ctx, apiCall{name: "update tenant", method: http.MethodPatch, path: "/v1/tenant", body: p, out: &out})
	return out, err
}

// CreateTenant creates a tenant (POST /v1/admin/tenants, scope admin); an
// existing id matches ErrTenantExists.
func (c *Client) CreateTenant(ctx context.Context, t NewTenant) (Tenant, error) {
	var out Tenant
	_, err := c.do(ctx, apiCall{name: "create tenant", method: http.MethodPost, path: "/v1/admin/tenants", body: t, out: &out})
	return out, err
}

// ListTenants returns every tenant (GET /v1/admin/tenants, scope admin).
func (c *Client) ListTenants(ctx context.Context) ([]Tenant, error) {
	var raw json.RawMessage
	if _, err := c.do(ctx, apiCall{name: "list tenants", method: http.MethodGet, path: "/v1/admin/tenants", out: &raw}); err != nil {
		return nil, err
	}
	var out []Tenant
	if err := decodeItems(raw, &out); err != nil {
		return nil, fmt.Errorf("list tenants: decode answer: %w", err)
	}
	return out, nil
}

// AdminGetTenant returns one tenant (GET /v1/admin/tenants/{id}, scope
// admin); an unknown id matches ErrTenantNotFound.
func (c *Client) AdminGetTenant(ctx context.Context, id string) (Tenant, error) {
	var out Tenant
	_, err := c.do(ctx, apiCall{name: "get tenant", method: http.MethodGet, path: adminTenantPath(id), out: &out})
	return out, err
}

// AdminUpdateTenant changes a tenant's name, settings or disabled flag
// (PATCH /v1/admin/tenants/{id}, scope admin).
func (c *Client) AdminUpdateTenant(ctx context.Context, id string, p TenantPatch) (Tenant, error) {
	var out Tenant
	_, err := c.do(ctx, apiCall{name: "update tenant", method: http.MethodPatch, path: adminTenantPath(id), body: p, out: &out})
	return out, err
}

// DisableTenant suspends a tenant (PATCH /v1/admin/tenants/{id} with
// disabled true, scope admin): its tokens get tenant_unknown until it is
// re-enabled (AdminUpdateTenant with Disabled false); every record is kept.
func (c *Client) DisableTenant(ctx context.Context, id string) error {
	_, err := c.AdminUpdateTenant(ctx, id, TenantPatch{Disabled: Ptr(true)})
	return err
}

// DeleteTenant deletes a tenant and all of its records for good (DELETE
// /v1/admin/tenants/{id}, scope admin); retries of its keys would run again.
// An unknown id matches ErrTenantNotFound.
func (c *Client) DeleteTenant(ctx context.Context, id string) error {
	_, err := c.do(ctx, apiCall{name: "delete tenant", method: http.MethodDelete, path: adminTenantPath(id)})
	return err
}

// OrphanListOptions filter and page GET /v1/admin/orphans.
type OrphanListOptions struct {
	// Tenant restricts the list to one tenant; empty lists every tenant.
	Tenant string
	// Limit is the page size; zero takes the server's default.
	Limit int
	// Cursor is NextCursor of the previous page; empty for the first.
	Cursor string
}

// ListOrphans returns one page of orphaned records across tenants, oldest
// first, each with its Tenant set (GET /v1/admin/orphans, scope admin).
func (c *Client) ListOrphans(ctx context.Context, opts OrphanListOptions) (KeyPage, error) {
	q := pageQuery("tenant", opts.Tenant, opts.Limit, opts.Cursor)
	var out KeyPage
	_, err := c.do(ctx, apiCall{name: "list orphans", method: http.MethodGet, path: "/v1/admin/orphans", query: q, out: &out})
	return out, err
}

// pageQuery builds the query of a paged list: the filter (name=value) when
// value is set, limit when positive, cursor when set.
func pageQuery(name, value string, limit int, cursor string) url.Values {
	q := url.Values{}
	if value != "" {
		q.Set(name, value)
	}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	if cursor != "" {
		q.Set("cursor", cursor)
	}
	return q
}

// decodeItems accepts either a bare JSON array or an {"items": [...]}
// object, the two shapes a list may take.
func decodeItems[T any](raw json.RawMessage, out *[]T) error {
	if len(raw) == 0 {
		return nil
	}
	if raw[0] == '[' {
		return json.Unmarshal(raw, out)
	}
	var w struct {
		Items []T `json:"items"`
	}
	if err := json.Unmarshal(raw, &w); err != nil {
		return err
	}
	*out = w.Items
	return nil
}
