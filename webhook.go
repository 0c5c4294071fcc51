package idem

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/idem-dev/idem/client/stdwebhooks"
)

// EventType names what a webhook reports. Tenants subscribe an endpoint to
// some of them (or to all).
type EventType string

// The webhook events. Each is written to the outbox in the same database
// transaction as the state change it reports (see WebhookStore).
const (
	// EventKeyOrphaned: a record's lease ran out while it was in flight. It
	// is emitted once per (key, fencing token) by the orphan watch, which
	// marks the record (orphan_event_token) in the same transaction.
	EventKeyOrphaned EventType = "key.orphaned"
	// EventKeyReapedInFlight: the reaper deleted a record that was still in
	// flight (an orphan past its purge time); written in the reaper's
	// transaction.
	EventKeyReapedInFlight EventType = "key.reaped_in_flight"
	// EventKeyResolved: an operator or tenant admin resolved an orphan.
	EventKeyResolved EventType = "key.resolved"
	// EventKeyLeaseLost: a late writer was fenced off (a checkpoint,
	// complete or release with a stale fencing token). There is no state
	// change to share a transaction with: the event is written by the call
	// that refuses, before the refusal is answered.
	EventKeyLeaseLost EventType = "key.lease_lost"
	// EventWebhookTest is sent by the test-send endpoint to one endpoint.
	EventWebhookTest EventType = "webhook.test"
)

// EventTypes lists the event types a tenant may subscribe to.
var EventTypes = []EventType{EventKeyOrphaned, EventKeyReapedInFlight, EventKeyResolved, EventKeyLeaseLost}

// Event is one webhook message before it is fanned out to the tenant's
// endpoints: ID is the webhook-id every endpoint and every attempt sees, and
// Payload the exact body that is signed and sent.
type Event struct {
	ID       string
	TenantID string
	Type     EventType
	Payload  []byte
}

// NewID returns a fresh id: prefix and 22 random characters (128 bits,
// base64url). Every id idem hands out is made here, so they all look alike.
func NewID(prefix string) string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return prefix + base64.RawURLEncoding.EncodeToString(b[:])
}

// NewWebhookSecret returns a fresh signing secret of a webhook endpoint or
// a completer: stdwebhooks.SecretPrefix ("whsec_") and the base64 of 32
// random bytes, the form stdwebhooks.DecodeSecret reads.
func NewWebhookSecret() string {
	var b [32]byte
	_, _ = rand.Read(b[:])
	return stdwebhooks.SecretPrefix + base64.StdEncoding.EncodeToString(b[:])
}

// NewWebhookEndpointID returns a fresh endpoint id ("ep_" and 22 random
// characters).
func NewWebhookEndpointID() string {
	return NewID("ep_")
}

// WebhookEndpoint is a URL a tenant asked to receive events at.
type WebhookEndpoint struct {
	TenantID string
	ID       string
	URL      string
	// Secret signs every delivery; the API shows it only when the endpoint
	// is created.
	Secret string
	// Events filters the event types; empty means every type.
	Events  []EventType
	Enabled bool
	// DisabledReason says why the server disabled the endpoint ("" when a
	// tenant did, or when enabled).
	DisabledReason string
	// ConsecutiveFailures and FailingSince describe the current failure
	// streak (zero when the last attempt succeeded).
	ConsecutiveFailures int
	FailingSince        time.Time
	CreatedAt           time.Time
	UpdatedAt           time.Time
}

// DeliveryState is where one event stands for one endpoint.
type DeliveryState string

// The delivery states.
const (
	DeliveryPending   DeliveryState = "pending"
	DeliveryDelivered DeliveryState = "delivered"
	// DeliveryFailed: retries ran past the maximum age; no more attempts.
	DeliveryFailed DeliveryState = "failed"
)

// WebhookDelivery is one event for one endpoint: an outbox row, and the
// endpoint's delivery log entry.
type WebhookDelivery struct {
	ID         int64
	TenantID   string
	EndpointID string
	EventID    string
	EventType  EventType
	Payload    []byte
	State      DeliveryState
	// Attempts counts the attempts started; it also fences a claimed
	// delivery (FinishWebhookDelivery applies only to the claimed attempt).
	Attempts      int
	NextAttemptAt time.Time
	CreatedAt     time.Time
	LastAttemptAt time.Time
	// LastStatus is the HTTP status of the last attempt (0 when none came).
	LastStatus int
	// LastError says briefly why the last attempt failed (never a body).
	LastError   string
	DeliveredAt time.Time
	// URL and Secret are the endpoint's, set by ClaimWebhookDeliveries only.
	URL    string
	Secret string
	// ObservedAt is the database clock when the row was read.
	ObservedAt time.Time
}

// FinishWebhookDeliveryParams record the outcome of a claimed attempt.
type FinishWebhookDeliveryParams struct {
	ID       int64
	Attempts int
	OK       bool
	Status   int
	Error    string
	// RetryIn is the pause before the next attempt; zero on failure means
	// give up (the delivery becomes failed).
	RetryIn time.Duration
	// DisableAfter disables the endpoint when this attempt failed and the
	// failure streak is at least this old and DisableMinFailures long.
	DisableAfter       time.Duration
	DisableMinFailures int
}

// ListWebhookDeliveriesParams page an endpoint's delivery log, newest first.
type ListWebhookDeliveriesParams struct {
	TenantID   string
	EndpointID string
	Limit      int
	// BeforeID continues after the last row of a previous page (0: start).
	BeforeID int64
}

// WebhookStore is the webhook side of a Store: endpoints, the outbox and its
// delivery log. Both stores implement it. The outbox lives in the ledger's
// database and its rows are written in the same transaction as the change
// they report, so an event is never reported without its change nor lost
// after it.
type WebhookStore interface {
	// CreateWebhookEndpoint stores e (ID and Secret set by the caller). It
	// returns ErrTenantUnknown for an unknown tenant, and
	// webhook_limit_reached when the tenant has MaxWebhookEndpoints
	// already; concurrent creates never pass that bound.
	CreateWebhookEndpoint(ctx context.Context, e WebhookEndpoint) (WebhookEndpoint, error)
	// GetWebhookEndpoint returns ErrWebhookNotFound.
	GetWebhookEndpoint(ctx context.Context, p GetWebhookEndpointParams) (WebhookEndpoint, error)
	// ListWebhookEndpoints returns a tenant's endpoints ordered by creation.
	ListWebhookEndpoints(ctx context.Context, p ListWebhookEndpointsParams) ([]WebhookEndpoint, error)
	// UpdateWebhookEndpoint replaces URL, Events and Enabled; enabling
	// clears the failure streak and the disabled reason. It returns
	// ErrWebhookNotFound.
	UpdateWebhookEndpoint(ctx context.Context, e WebhookEndpoint) (WebhookEndpoint, error)
	// DeleteWebhookEndpoint deletes the endpoint and its deliveries. It
	// returns ErrWebhookNotFound.
	DeleteWebhookEndpoint(ctx context.Context, p DeleteWebhookEndpointParams) error
	// SendTestEvent queues p.Event for one endpoint whatever its filter
	// (it must be enabled), and returns the queued delivery. It returns
	// ErrWebhookNotFound, or ErrWebhookDisabled for a disabled endpoint.
	SendTestEvent(ctx context.Context, p SendTestEventParams) (WebhookDelivery, error)
	// ListWebhookDeliveries pages an endpoint's delivery log, newest first,
	// without payloads.
	ListWebhookDeliveries(ctx context.Context, p ListWebhookDeliveriesParams) ([]WebhookDelivery, error)

	// ClaimWebhookDeliveries takes at most p.Limit pending deliveries that are
	// due, of enabled endpoints, and pushes their next attempt lease into
	// the future, counting the attempt: concurrent callers on several
	// replicas never take the same delivery while its lease runs. A caller
	// that dies mid-attempt leaves the delivery to be taken again after the
	// lease: at least once. One tenant gives at most p.PerTenant deliveries,
	// spread over its endpoints in turns (each endpoint's oldest due, then
	// each one's second, ...), and the tenants are taken in turns too
	// (every tenant's first, then every tenant's second, each turn oldest
	// first) and returned in that order, so one tenant's slow or busy
	// endpoints cannot fill a claim and hold back the other tenants'
	// deliveries, and one endpoint cannot hold back its tenant's others.
	// Within a turn the tenants go least recently served first, then
	// oldest first: p.Served maps a tenant to when the caller last took one
	// of its deliveries (any increasing number, larger is more recent; a
	// tenant missing from it, or nil, comes first). A caller that claims
	// one free slot at a time thus goes round the tenants with something
	// due instead of back to whichever has the oldest backlog.
	ClaimWebhookDeliveries(ctx context.Context, p ClaimWebhookDeliveriesParams) ([]WebhookDelivery, error)
	// FinishWebhookDelivery records the outcome of the attempt claimed with
	// p.Attempts and updates the endpoint's failure streak; it does nothing
	// when the delivery was claimed again since.
	FinishWebhookDelivery(ctx context.Context, p FinishWebhookDeliveryParams) error
	// EmitOrphanEvents finds at most p.Limit orphans not yet reported for
	// their current fencing token, marks them and queues key.orphaned for
	// each in the same transaction. It returns how many it marked.
	EmitOrphanEvents(ctx context.Context, p EmitOrphanEventsParams) (int, error)
	// PurgeWebhookDeliveries deletes delivered and failed deliveries created
	// more than p.OlderThan ago, at most p.Limit.
	PurgeWebhookDeliveries(ctx context.Context, p PurgeWebhookDeliveriesParams) (int, error)
}

// GetWebhookEndpointParams are the inputs of WebhookStore.GetWebhookEndpoint.
type GetWebhookEndpointParams struct {
	TenantID string
	ID       string
}

// ListWebhookEndpointsParams are the inputs of
// WebhookStore.ListWebhookEndpoints.
type ListWebhookEndpointsParams struct {
	TenantID string
}

// DeleteWebhookEndpointParams are the inputs of
// WebhookStore.DeleteWebhookEndpoint.
type DeleteWebhookEndpointParams struct {
	TenantID string
	ID       string
}

// SendTestEventParams are the inputs of WebhookStore.SendTestEvent.
type SendTestEventParams struct {
	// EndpointID names the endpoint (its tenant is the event's).
	EndpointID string
	Event      Event
}

// ClaimWebhookDeliveriesParams are the inputs of
// WebhookStore.ClaimWebhookDeliveries.
type ClaimWebhookDeliveriesParams struct {
	// Limit bounds the deliveries taken.
	Limit int
	// PerTenant bounds the deliveries one tenant gives.
	PerTenant int
	// Served maps a tenant to when the caller last took one of its
	// deliveries (larger is more recent); nil: none yet.
	Served map[string]int64
	// Lease is how long a taken delivery stays away from other callers.
	Lease time.Duration
}

// EmitOrphanEventsParams are the inputs of WebhookStore.EmitOrphanEvents.
type EmitOrphanEventsParams struct {
	// Limit bounds the orphans marked.
	Limit int
}

// PurgeWebhookDeliveriesParams are the inputs of
// WebhookStore.PurgeWebhookDeliveries.
type PurgeWebhookDeliveriesParams struct {
	// OlderThan is the cutoff age of a finished delivery.
	OlderThan time.Duration
	// Limit bounds the deliveries deleted.
	Limit int
}

// CodeWebhookNotFound: no webhook endpoint with this id for the tenant.
const CodeWebhookNotFound Code = "webhook_not_found"

// ErrWebhookNotFound matches any webhook_not_found error.
var ErrWebhookNotFound = &Error{Code: CodeWebhookNotFound}

// WebhookNotFound returns the error of a missing endpoint.
func WebhookNotFound(id string) *Error {
	return Errorf(CodeWebhookNotFound, "no webhook endpoint %q", id)
}

// CodeWebhookDisabled: the endpoint exists but is disabled, so nothing is
// delivered to it; a test send would wait forever, so it is refused.
const CodeWebhookDisabled Code = "webhook_disabled"

// ErrWebhookDisabled matches any webhook_disabled *Error with errors.Is.
var ErrWebhookDisabled = &Error{Code: CodeWebhookDisabled}

// WebhookDisabled is the webhook_disabled error of endpoint id.
func WebhookDisabled(id string) *Error {
	return Errorf(CodeWebhookDisabled, "webhook endpoint %q is disabled: enable it (PATCH enabled=true) before a test send", id)
}

// MaxWebhookEndpoints bounds a tenant's webhook endpoints. Each key event
// of the tenant is queued once per endpoint inside the transaction of the
// write it reports (on SQLite under the one write lock all tenants share),
// and the endpoints are listed whole: without a bound one tenant could make
// every such write, and its listing, as long as it liked.
const MaxWebhookEndpoints = 16

// CodeWebhookLimitReached: the tenant has MaxWebhookEndpoints endpoints;
// delete one first.
const CodeWebhookLimitReached Code = "webhook_limit_reached"

// WebhookLimitReached is the webhook_limit_reached error.
func WebhookLimitReached() *Error {
	return Errorf(CodeWebhookLimitReached, "the tenant has %d webhook endpoints, the most it may have: delete one first", MaxWebhookEndpoints)
}

// ValidateEventFilter checks an endpoint's event filter: known types, none
// twice. It returns an invalid_request naming "events".
func ValidateEventFilter(events []EventType) error {
	seen := map[EventType]bool{}
	for _, e := range events {
		msg := ""
		switch {
		case !slices.Contains(EventTypes, e):
			msg = fmt.Sprintf("has an unknown event type %q (known: %s)", e, EventFilter(EventTypes))
		case seen[e]:
			msg = fmt.Sprintf("names %q twice", e)
		}
		if msg != "" {
			return invalidField("events", msg)
		}
		seen[e] = true
	}
	return nil
}

// EventFilter encodes an endpoint's event filter for storage: the types
// joined by commas ("" = every type).
func EventFilter(types []EventType) string {
	s := make([]string, len(types))
	for i, t := range types {
		s[i] = string(t)
	}
	return strings.Join(s, ",")
}

// ParseEventFilter is the inverse of EventFilter.
func ParseEventFilter(s string) []EventType {
	if s == "" {
		return []EventType{}
	}
	parts := strings.Split(s, ",")
	out := make([]EventType, len(parts))
	for i, p := range parts {
		out[i] = EventType(p)
	}
	return out
}
