package api

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/go-json-experiment/json/jsontext"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/canon"
	"github.com/idem-dev/idem/client/frontdoor"
)

// pathKey returns the unescaped {key} of the route. chi matches on
// r.URL.RawPath when the request path holds escapes that differ from the
// default encoding (such as %2F), and then the parameter is still escaped;
// otherwise it matched on the decoded r.URL.Path.
func pathKey(r *http.Request) (string, error) {
	raw := chi.URLParam(r, "key")
	key := raw
	if r.URL.RawPath != "" {
		var err error
		key, err = url.PathUnescape(raw)
		if err != nil {
			return "", idem.Errorf(idem.CodeInvalidKey, "the key is not correctly path-escaped")
		}
	}
	if err := idem.ValidateKey(key); err != nil {
		return "", err
	}
	return key, nil
}

// keyParam is embedded by every request on /v1/keys/{key}.
type keyParam struct {
	key string
}

func (k *keyParam) bind(r *http.Request) error {
	var err error
	k.key, err = pathKey(r)
	return err
}

// isNull reports whether a raw JSON value is absent or null.
func isNull(raw jsontext.Value) bool {
	return len(raw) == 0 || bytes.Equal(bytes.TrimSpace(raw), []byte("null"))
}

// claimRequest is the body of POST /v1/keys/{key}/claim.
type claimRequest struct {
	keyParam     `json:"-"`
	Operation    string         `json:"operation"`
	Fingerprint  *string        `json:"fingerprint"`
	Request      jsontext.Value `json:"request"`
	LeaseSeconds int            `json:"lease_seconds"`
	// AttemptID is the caller's id for this attempt; a claim whose answer
	// was lost, sent again with it, gets the attempt back instead of 409.
	AttemptID *string `json:"attempt_id"`
	// WaitSeconds asks to hold the claim while the key is in flight; it
	// wins over a Prefer: wait=N header.
	WaitSeconds *int `json:"wait_seconds"`

	// preferWait is the Prefer: wait=N of the request, -1 when absent.
	preferWait int
	// header is the response's header, for Preference-Applied.
	header     http.Header
	answerHold `json:"-"`
}

func (c *claimRequest) bind(r *http.Request) error {
	c.preferWait = frontdoor.PreferWait(r.Header.Values("Prefer"))
	c.header = responseHeaderFrom(r.Context())
	return c.keyParam.bind(r)
}

// waitSeconds returns the wait the claim asked for: wait_seconds when sent,
// else Prefer: wait=N, else 0.
func (c *claimRequest) waitSeconds() int {
	switch {
	case c.WaitSeconds != nil:
		return *c.WaitSeconds
	case c.preferWait > 0:
		return c.preferWait
	}
	return 0
}

func (c *claimRequest) validate() error {
	if err := idem.ValidateOperation(c.Operation); err != nil {
		return err
	}
	if c.Fingerprint != nil && !isNull(c.Request) {
		return &idem.Error{
			Code:   idem.CodeInvalidRequest,
			Detail: "fingerprint and request are mutually exclusive",
			Fields: []idem.FieldError{{Field: "request", Message: "must not be sent together with fingerprint"}},
		}
	}
	if c.Fingerprint != nil {
		if err := idem.ValidateFingerprint(*c.Fingerprint); err != nil {
			return err
		}
	}
	if c.LeaseSeconds < 0 {
		return fieldError("lease_seconds", "must be positive", nil)
	}
	if c.AttemptID != nil {
		if err := idem.ValidateAttemptID(*c.AttemptID); err != nil {
			return err
		}
	}
	if c.WaitSeconds != nil && (*c.WaitSeconds < 0 || *c.WaitSeconds > idem.MaxWaitSecondsLimit) {
		return fieldError("wait_seconds", fmt.Sprintf("must be between 0 and %d", idem.MaxWaitSecondsLimit), nil)
	}
	return nil
}

// claim decides a claim. Without fingerprint and request the fingerprint is
// empty: the key alone identifies the intent, and the operation is still
// compared.
func (s *service) claim(ctx context.Context, req *claimRequest) (reply, error) {
	t := tenantFrom(ctx)
	lease, err := t.Settings.LeaseFor(req.LeaseSeconds)
	if err != nil {
		return reply{}, err
	}
	fp := ""
	switch {
	case req.Fingerprint != nil:
		fp = *req.Fingerprint
	case !isNull(req.Request):
		fp, err = canon.Fingerprint(req.Request)
		if err != nil {
			return reply{}, fieldError("request", "cannot be canonicalized: "+err.Error(), err)
		}
	}
	var attemptID string
	if req.AttemptID != nil {
		attemptID = *req.AttemptID
	}
	// A claim that asked to wait is held while the key is in flight, for
	// at most the tenant's max_wait_seconds and the server's cap (below
	// its write timeout).
	wait := min(t.Settings.WaitFor(req.waitSeconds()), s.maxWait)
	res, applied, err := s.waiters.Claim(ctx, s.store, idem.ClaimParams{
		TenantID:          t.ID,
		Key:               req.key,
		Operation:         req.Operation,
		Fingerprint:       fp,
		AttemptID:         attemptID,
		Lease:             lease,
		ReplayWindow:      t.Settings.ReplayWindow(),
		ReaperThreshold:   t.Settings.ReaperThreshold(),
		StorageQuotaBytes: t.ClaimQuota(),
	}, wait)
	if applied && req.header != nil {
		req.header.Set("Preference-Applied", "wait="+strconv.Itoa(int(wait/time.Second)))
	}
	if s.observer != nil {
		var action idem.ClaimAction
		if err == nil {
			action = res.Action
		}
		s.observer.ObserveClaim(t.ID, action, err)
	}
	if err != nil {
		return reply{}, fmt.Errorf("claim key: %w", err)
	}
	rec := res.Record
	if err := s.holdAnswer(&req.answerHold, rec); err != nil {
		return reply{}, err
	}
	if res.Action == idem.ActionReplay {
		return reply{status: http.StatusOK, replayed: true, body: encodeRecord(rec)}, nil
	}
	return reply{status: http.StatusCreated, body: claimJSON{
		Key:          rec.Key,
		State:        rec.APIState(),
		FencingToken: rec.FencingToken,
		Attempt:      rec.Attempt,
		// A recovered attempt answers as its lost claim did.
		Resumed:        res.Action == idem.ActionTakeover || res.Action == idem.ActionRecover && rec.Attempt > 1,
		LeaseExpiresAt: timeJSON(rec.LeaseExpiresAt),
		RecoveryPoint:  stringOrNull(rec.RecoveryPoint),
		RecoveryData:   rawOrNull(rec.RecoveryData),
	}}, nil
}

func (s *service) observeWrite(tenant, op string, err error) {
	if s.observer != nil {
		s.observer.ObserveWrite(tenant, op, err)
	}
}

func requireToken(tok *int64) error {
	if tok == nil {
		return fieldError("fencing_token", "is required", nil)
	}
	return nil
}

// checkpointRequest is the body of POST /v1/keys/{key}/checkpoint.
type checkpointRequest struct {
	keyParam      `json:"-"`
	FencingToken  *int64         `json:"fencing_token"`
	RecoveryPoint string         `json:"recovery_point"`
	Data          jsontext.Value `json:"data"`
	LeaseSeconds  int            `json:"lease_seconds"`
}

func (c *checkpointRequest) validate() error {
	if err := requireToken(c.FencingToken); err != nil {
		return err
	}
	if err := idem.ValidateRecoveryPoint(c.RecoveryPoint); err != nil {
		return err
	}
	if c.LeaseSeconds < 0 {
		return fieldError("lease_seconds", "must be positive", nil)
	}
	return nil
}

func (s *service) checkpoint(ctx context.Context, req *checkpointRequest) (recordJSON, error) {
	t := tenantFrom(ctx)
	lease, err := t.Settings.LeaseFor(req.LeaseSeconds)
	if err != nil && req.LeaseSeconds > t.Settings.LeaseSecondsMax {
		// A claim made before the tenant lowered lease_seconds_max keeps
		// renewing the lease it claimed with (idem.Tenant.RenewalLeaseFor);
		// the record is read only then.
		rec, rerr := s.store.GetRecord(ctx, idem.GetRecordParams{TenantID: t.ID, Key: req.key})
		switch {
		case rerr == nil:
			lease, err = t.RenewalLeaseFor(req.LeaseSeconds, rec.CreatedAt)
		case !errors.Is(rerr, idem.ErrKeyNotFound):
			return recordJSON{}, fmt.Errorf("read the record to check its lease: %w", rerr)
		}
	}
	if err != nil {
		return recordJSON{}, err
	}
	var data []byte
	if !isNull(req.Data) {
		data = req.Data
	}
	// Recovery data is returned by every takeover claim and record read:
	// it is bounded like a stored response.
	if err := s.checkSize(ctx, t, req.key, len(data), func(limit int) error {
		msg := fmt.Sprintf("must be at most max_response_bytes (%d bytes) of JSON; got %d", limit, len(data))
		return &idem.Error{
			Code:   idem.CodePayloadTooLarge,
			Detail: "data " + msg,
			Fields: []idem.FieldError{{Field: "data", Message: msg}},
		}
	}); err != nil {
		s.observeWrite(t.ID, "checkpoint", err)
		return recordJSON{}, err
	}
	// Checked on every checkpoint whose data grows, in its statement
	// (idem.Store.Checkpoint): 507 then, the lease renewed all the same.
	rec, err := s.store.Checkpoint(ctx, idem.CheckpointParams{
		TenantID: t.ID, Key: req.key, FencingToken: *req.FencingToken,
		RecoveryPoint: req.RecoveryPoint, Data: data, Lease: lease,
		StorageQuotaBytes: t.Settings.StorageQuotaBytes,
	})
	s.observeWrite(t.ID, "checkpoint", err)
	if err != nil {
		return recordJSON{}, fmt.Errorf("checkpoint key: %w", err)
	}
	return encodeRecord(rec), nil
}

// checkSize returns tooLarge(limit) when size bytes of a response or of
// checkpoint data for key are over the limit its claim was made under
// (idem.Tenant.ResponseLimit), else nil. The record is read only when size
// is over the tenant's current max_response_bytes: a claim made before
// the tenant lowered it keeps the higher limit. A store failure on that
// read is returned as it is (503, retryable), never as a refusal.
func (s *service) checkSize(ctx context.Context, t idem.Tenant, key string, size int, tooLarge func(limit int) error) error {
	if size <= t.Settings.MaxResponseBytes {
		return nil
	}
	rec, err := s.store.GetRecord(ctx, idem.GetRecordParams{TenantID: t.ID, Key: key})
	switch {
	case err == nil:
		if size <= t.ResponseLimit(rec.CreatedAt) {
			return nil
		}
		return tooLarge(t.ResponseLimit(rec.CreatedAt))
	case errors.Is(err, idem.ErrKeyNotFound):
		return tooLarge(t.Settings.MaxResponseBytes)
	}
	return fmt.Errorf("read the record to size its response: %w", err)
}

// completeRequest is the body of POST /v1/keys/{key}/complete.
type completeRequest struct {
	keyParam     `json:"-"`
	FencingToken *int64         `json:"fencing_token"`
	Response     *responseInput `json:"response"`

	decoded idem.Response
}

func (c *completeRequest) validate() error {
	if err := requireToken(c.FencingToken); err != nil {
		return err
	}
	var err error
	c.decoded, err = c.Response.decode()
	return err
}

func (s *service) complete(ctx context.Context, req *completeRequest) (recordJSON, error) {
	t := tenantFrom(ctx)
	size := req.decoded.Size()
	if err := s.checkSize(ctx, t, req.key, size, func(limit int) error {
		return idem.Errorf(idem.CodePayloadTooLarge, "the response is %d bytes; the tenant's max_response_bytes is %d", size, limit)
	}); err != nil {
		s.observeWrite(t.ID, "complete", err)
		return recordJSON{}, err
	}
	// The quota is checked in every complete's statement, not only near it
	// as a claim's (idem.Tenant.ClaimQuota): a response is up to
	// max_response_bytes. Without room the key is completed without it and
	// the worker gets 507 storage_quota_exceeded (idem.Store.Complete).
	rec, err := s.store.Complete(ctx, idem.CompleteParams{
		TenantID: t.ID, Key: req.key, FencingToken: *req.FencingToken, Response: req.decoded,
		StorageQuotaBytes: t.Settings.StorageQuotaBytes,
	})
	s.observeWrite(t.ID, "complete", err)
	if err != nil {
		return recordJSON{}, fmt.Errorf("complete key: %w", err)
	}
	return encodeRecord(rec), nil
}

// releaseRequest is the body of POST /v1/keys/{key}/release.
type releaseRequest struct {
	keyParam     `json:"-"`
	FencingToken *int64 `json:"fencing_token"`
}

func (c *releaseRequest) validate() error { return requireToken(c.FencingToken) }

func (s *service) release(ctx context.Context, req *releaseRequest) (noContent, error) {
	t := tenantFrom(ctx)
	err := s.store.Release(ctx, idem.ReleaseParams{TenantID: t.ID, Key: req.key, FencingToken: *req.FencingToken})
	s.observeWrite(t.ID, "release", err)
	if err != nil {
		return noContent{}, fmt.Errorf("release key: %w", err)
	}
	return noContent{}, nil
}

// getKeyRequest is GET /v1/keys/{key}.
type getKeyRequest struct {
	keyParam   `json:"-"`
	answerHold `json:"-"`
}

func (s *service) getKey(ctx context.Context, req *getKeyRequest) (recordJSON, error) {
	return s.readKey(ctx, tenantFrom(ctx).ID, req.key, &req.answerHold)
}

// readKey reads the record of key in tenant for GET /v1/keys/{key} and
// its operator twin, holding the answer as hold asks.
func (s *service) readKey(ctx context.Context, tenant, key string, hold *answerHold) (recordJSON, error) {
	rec, err := s.store.GetRecord(ctx, idem.GetRecordParams{TenantID: tenant, Key: key})
	if err != nil {
		return recordJSON{}, fmt.Errorf("get key: %w", err)
	}
	if err := s.holdAnswer(hold, rec); err != nil {
		return recordJSON{}, err
	}
	return encodeRecord(rec), nil
}

// listKeysRequest is GET /v1/keys?state=&completer=&limit=&cursor=.
type listKeysRequest struct {
	pageParams `json:"-"`
	state      idem.State
	completion idem.CompletionFilter
}

func (l *listKeysRequest) bind(r *http.Request) error {
	q := r.URL.Query()
	if q.Has("state") {
		l.state = idem.State(q.Get("state"))
		if !l.state.Valid() {
			return fieldError("state", "must be one of in_flight, completed, orphaned, expired", nil)
		}
	}
	var err error
	if l.completion, err = bindCompletionFilter(r); err != nil {
		return err
	}
	return l.pageParams.bind(r)
}

// bindCompletionFilter reads ?completer=unknown|review: the records the
// completer holds, or gave up on.
func bindCompletionFilter(r *http.Request) (idem.CompletionFilter, error) {
	q := r.URL.Query()
	if !q.Has("completer") {
		return idem.FilterAnyCompletion, nil
	}
	f := idem.CompletionFilter(q.Get("completer"))
	if f == idem.FilterAnyCompletion || !f.Valid() {
		return "", fieldError("completer", "must be unknown or review", nil)
	}
	return f, nil
}

func (s *service) listKeys(ctx context.Context, req *listKeysRequest) (listJSON[recordJSON], error) {
	recs, err := s.store.ListRecords(ctx, idem.ListRecordsParams{
		TenantID: tenantFrom(ctx).ID, State: req.state, Completion: req.completion, Limit: req.limit + 1, After: req.after,
	})
	if err != nil {
		return listJSON[recordJSON]{}, fmt.Errorf("list keys: %w", err)
	}
	return pageOf(recs, req.limit, encodeListed, func(last idem.Record) idem.Cursor {
		return idem.Cursor{Time: last.CreatedAt, Key: last.Key}
	}), nil
}
