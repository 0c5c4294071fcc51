// Package eventpayload builds the webhook events the stores write to the
// outbox inside the transaction of the change they report: the Standard
// Webhooks payload {"type", "timestamp", "tenant_id", "data"} and the data of
// the key.* events. It is JSON encoding, not domain: the root package says
// which events exist (idem.EventType) and what an Event is; this package
// only says how one is spelled on the wire.
package eventpayload

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/idem-dev/idem"
)

// KeyEventData is the data of the key.* events.
type KeyEventData struct {
	Key           string `json:"key"`
	Operation     string `json:"operation,omitempty"`
	FencingToken  int64  `json:"fencing_token,omitempty"`
	Attempt       int    `json:"attempt,omitempty"`
	RecoveryPoint string `json:"recovery_point,omitempty"`
	// LeaseExpiresAt is when the lease ran out (orphaned, reaped).
	LeaseExpiresAt *time.Time `json:"lease_expires_at,omitempty"`
	// StaleToken and Write describe the refused write of key.lease_lost.
	StaleToken int64  `json:"stale_token,omitempty"`
	Write      string `json:"write,omitempty"`
	// Action and Actor describe a resolution (key.resolved).
	Action string `json:"action,omitempty"`
	Actor  string `json:"actor,omitempty"`
}

// NewEvent builds an event with a fresh id and the Standard Webhooks payload
// shape {"type", "timestamp", "data"}; at is the instant of the change.
func NewEvent(tenantID string, typ idem.EventType, at time.Time, data any) (idem.Event, error) {
	body, err := json.Marshal(struct {
		Type      idem.EventType `json:"type"`
		Timestamp string         `json:"timestamp"`
		TenantID  string         `json:"tenant_id"`
		Data      any            `json:"data"`
	}{typ, at.UTC().Format(time.RFC3339Nano), tenantID, data})
	if err != nil {
		return idem.Event{}, fmt.Errorf("encode %s event: %w", typ, err)
	}
	// The webhook-id: "msg_" and 22 random characters (idem.NewID).
	return idem.Event{ID: idem.NewID("msg_"), TenantID: tenantID, Type: typ, Payload: body}, nil
}

// keyEventData is the part of every key.* event's data that describes
// rec as it stands.
func keyEventData(rec idem.Record) KeyEventData {
	return KeyEventData{
		Key: rec.Key, Operation: rec.Operation, FencingToken: rec.FencingToken,
		Attempt: rec.Attempt, RecoveryPoint: rec.RecoveryPoint,
	}
}

// RecordEvent builds a key.* event about rec.
func RecordEvent(typ idem.EventType, rec idem.Record, at time.Time) (idem.Event, error) {
	d := keyEventData(rec)
	if !rec.LeaseExpiresAt.IsZero() {
		t := rec.LeaseExpiresAt.UTC()
		d.LeaseExpiresAt = &t
	}
	return NewEvent(rec.TenantID, typ, at, d)
}

// LeaseLostEvent builds the key.lease_lost event of a write (checkpoint,
// complete, release) refused because staleToken is no longer current.
func LeaseLostEvent(stored idem.Record, write string, staleToken int64, at time.Time) (idem.Event, error) {
	d := keyEventData(stored)
	d.StaleToken, d.Write = staleToken, write
	return NewEvent(stored.TenantID, idem.EventKeyLeaseLost, at, d)
}

// ResolvedEvent builds the key.resolved event of a person's resolution:
// rec is the record as the resolution left it (as it was, for a release,
// which deletes it); the audit note is not sent.
func ResolvedEvent(rec idem.Record, action idem.ResolveAction, actor idem.Actor, at time.Time) (idem.Event, error) {
	d := keyEventData(rec)
	d.Action, d.Actor = string(action), actor.Subject
	return NewEvent(rec.TenantID, idem.EventKeyResolved, at, d)
}
