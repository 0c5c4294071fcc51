// Package errcode is idem's one list of error codes and its one table:
// for every code, the HTTP status, the title, whether the same request may
// be sent again unchanged, and who answers with it (the idem API, the front
// doors — the gateway and the middleware — or both).
//
// It lives in the SDK module (github.com/idem-dev/idem/client), not in the
// root package idem, because both modules use it and the arrows must point
// one way: the server module already requires the SDK module (go.mod's
// replace of ./client: the server imports client/frontdoor), while the
// SDK must stay free of the server and its dependencies. So the table sits
// in the lower module, and the root package's idem.Code, the API's problem
// table (api/problem.go) and the front doors' (frontdoor.Problems) are
// this list and this table. It imports nothing but the standard library.
//
// The SDK's client.Code constants (client/errors.go) are these codes under
// the SDK's own type, its public names, plus its own "unknown"; the values
// are written here only, and api.TestSDKCodesAreTheSpecs checks that the
// SDK names every code of openapi.yaml.
package errcode

import "net/http"

// Code is the stable, machine-readable name of an error (the "code"
// member of a problem+json body). Callers match on it, never on a title.
type Code string

// The codes. Those of the idem HTTP contract first (openapi.yaml, the
// Problem schema's enum; web/docs/errors), then those only the front doors
// answer (docs/frontdoor.md rule 7).
const (
	InvalidRequest      Code = "invalid_request"
	InvalidKey          Code = "invalid_key"
	Unauthenticated     Code = "unauthenticated"
	Forbidden           Code = "forbidden"
	TenantUnknown       Code = "tenant_unknown"
	KeyNotFound         Code = "key_not_found"
	TenantNotFound      Code = "tenant_not_found"
	WebhookNotFound     Code = "webhook_not_found"
	WebhookDisabled     Code = "webhook_disabled"
	WebhookLimitReached Code = "webhook_limit_reached"
	RequestInFlight     Code = "request_in_flight"
	// OutcomeUnknown: the key's first attempt died and idem's completer
	// holds it while it finds out what happened; retryable after
	// Retry-After (the next completer attempt).
	OutcomeUnknown Code = "outcome_unknown"
	// OutcomeReview: the completer gave up on the key (or a person flagged
	// it while the completer held it); not retryable until a person
	// resolves it. The front doors answer it too (docs/frontdoor.md rule
	// 8); they answer outcome_unknown as request_in_flight.
	OutcomeReview         Code = "outcome_review"
	CompleterNotFound     Code = "completer_not_found"
	CompleterLimitReached Code = "completer_limit_reached"
	LeaseLost             Code = "lease_lost"
	AlreadyCompleted      Code = "already_completed"
	TenantExists          Code = "tenant_exists"
	PayloadTooLarge       Code = "payload_too_large"
	UnsupportedMediaType  Code = "unsupported_media_type"
	FingerprintMismatch   Code = "fingerprint_mismatch"
	RateLimited           Code = "rate_limited"
	// RetryBudgetExhausted: a retry (Idem-Attempt above 1) refused by the
	// tenant's fleet retry budget before any body read or store call.
	// Retryable as the same call later may pass, but the SDKs stop the
	// logical call at once with its original cause (web/docs/retries).
	RetryBudgetExhausted Code = "retry_budget_exhausted"
	StoreUnavailable     Code = "store_unavailable"
	// ServerBusy: the server (or the gateway) holds as many request bodies
	// as its in-flight budget allows; retry after Retry-After.
	ServerBusy Code = "server_busy"
	// StorageQuotaExceeded: the tenant's records store its
	// storage_quota_bytes or more, so a claim of a new key is refused
	// before any work runs. Not retryable as such: only releases, the
	// reaper's purge or a higher quota free it.
	StorageQuotaExceeded Code = "storage_quota_exceeded"
	// Internal is any error without a code of its own; its details are
	// never shown to callers.
	Internal Code = "internal"
	// NotFound and MethodNotAllowed: an unknown route or method of the
	// API.
	NotFound         Code = "not_found"
	MethodNotAllowed Code = "method_not_allowed"

	// KeyMissing: a front door's route requires an Idempotency-Key and the
	// request has none.
	KeyMissing Code = "idempotency_key_missing"
	// UpstreamUnavailable and UpstreamTimeout: the gateway's upstream
	// gave no answer.
	UpstreamUnavailable Code = "upstream_unavailable"
	UpstreamTimeout     Code = "upstream_timeout"
	// ResponseNotReplayable: the key was completed, but its response could
	// not be stored and cannot be replayed.
	ResponseNotReplayable Code = "response_not_replayable"
)

// By says who answers with a code.
type By uint8

// Who answers with a code: the idem API, the front doors, or both.
const (
	API By = 1 << iota
	FrontDoor
	Both = API | FrontDoor
)

// Info is the fixed part of a code's problem body.
type Info struct {
	Status    int
	Title     string
	Retryable bool
	By        By
	// FrontDoorTitle, when set, is the title the front doors answer with
	// instead of Title. The front doors' titles are documented apart
	// (docs/frontdoor.md rule 7) and held by every front door of every
	// language (testvectors/frontdoor/policy.json, the Python and Node
	// middleware): changing them is a change of all of them at once.
	FrontDoorTitle string
}

// table is the one table of codes. Titles are those of the documentation
// (web/docs/errors, openapi.yaml) unless the row says otherwise.
var table = map[Code]Info{
	InvalidRequest:        {Status: http.StatusBadRequest, Title: "Invalid request", By: Both},
	InvalidKey:            {Status: http.StatusBadRequest, Title: "Invalid idempotency key", By: Both},
	Unauthenticated:       {Status: http.StatusUnauthorized, Title: "Unauthenticated", By: API},
	Forbidden:             {Status: http.StatusForbidden, Title: "Forbidden", By: API},
	TenantUnknown:         {Status: http.StatusForbidden, Title: "Tenant unknown", By: Both},
	KeyNotFound:           {Status: http.StatusNotFound, Title: "Key not found", By: API},
	TenantNotFound:        {Status: http.StatusNotFound, Title: "Tenant not found", By: API},
	WebhookNotFound:       {Status: http.StatusNotFound, Title: "Webhook endpoint not found", By: API},
	WebhookDisabled:       {Status: http.StatusConflict, Title: "Webhook endpoint disabled", By: API},
	WebhookLimitReached:   {Status: http.StatusConflict, Title: "Webhook endpoint limit reached", By: API},
	RequestInFlight:       {Status: http.StatusConflict, Title: "Request in flight", Retryable: true, By: Both},
	OutcomeUnknown:        {Status: http.StatusConflict, Title: "Outcome unknown", Retryable: true, By: API},
	OutcomeReview:         {Status: http.StatusConflict, Title: "Outcome under review", By: Both},
	CompleterNotFound:     {Status: http.StatusNotFound, Title: "Completer not found", By: API},
	CompleterLimitReached: {Status: http.StatusConflict, Title: "Completer limit reached", By: API},
	LeaseLost:             {Status: http.StatusConflict, Title: "Lease lost", By: API},
	AlreadyCompleted:      {Status: http.StatusConflict, Title: "Already completed", By: API},
	TenantExists:          {Status: http.StatusConflict, Title: "Tenant exists", By: API},
	PayloadTooLarge:       {Status: http.StatusRequestEntityTooLarge, Title: "Payload too large", By: Both},
	UnsupportedMediaType:  {Status: http.StatusUnsupportedMediaType, Title: "Unsupported media type", By: API},
	FingerprintMismatch: {Status: http.StatusUnprocessableEntity, Title: "Fingerprint mismatch", By: Both,
		FrontDoorTitle: "Idempotency key reused with another request"},
	RateLimited:          {Status: http.StatusTooManyRequests, Title: "Rate limited", Retryable: true, By: API},
	RetryBudgetExhausted: {Status: http.StatusTooManyRequests, Title: "Retry budget exhausted", Retryable: true, By: Both},
	StoreUnavailable: {Status: http.StatusServiceUnavailable, Title: "Store unavailable", Retryable: true, By: Both,
		FrontDoorTitle: "Idempotency store unavailable"},
	ServerBusy:           {Status: http.StatusServiceUnavailable, Title: "Server busy", Retryable: true, By: Both},
	StorageQuotaExceeded: {Status: http.StatusInsufficientStorage, Title: "Storage quota exceeded", By: Both},
	Internal:             {Status: http.StatusInternalServerError, Title: "Internal error", By: API},
	NotFound:             {Status: http.StatusNotFound, Title: "Not found", By: API},
	MethodNotAllowed:     {Status: http.StatusMethodNotAllowed, Title: "Method not allowed", By: API},

	KeyMissing:            {Status: http.StatusBadRequest, Title: "Idempotency key missing", By: FrontDoor},
	UpstreamUnavailable:   {Status: http.StatusBadGateway, Title: "Upstream unavailable", By: FrontDoor},
	UpstreamTimeout:       {Status: http.StatusGatewayTimeout, Title: "Upstream timeout", By: FrontDoor},
	ResponseNotReplayable: {Status: http.StatusConflict, Title: "Response not replayable", By: FrontDoor},
}

// Lookup returns the row of code c.
func Lookup(c Code) (Info, bool) {
	info, ok := table[c]
	return info, ok
}

// Of returns a new map of the rows of the codes answered by by, with the
// title that answerer sends (FrontDoorTitle for the front doors, when
// set).
func Of(by By) map[Code]Info {
	m := make(map[Code]Info)
	for c, info := range table {
		if info.By&by == 0 {
			continue
		}
		if by == FrontDoor && info.FrontDoorTitle != "" {
			info.Title = info.FrontDoorTitle
		}
		m[c] = info
	}
	return m
}

// FieldError names one invalid field of a request, as the errors member of
// an invalid_request problem lists it. The API's (idem.FieldError), the
// front doors' (frontdoor.FieldError) and the SDK's (client.FieldError)
// are this one type.
type FieldError struct {
	Field   string `json:"field"`
	Message string `json:"message"`
}
