// Package resumecall is the body of the completer's resume call on the wire
// (COMPLETER-PROTOCOL.md): the server's completer (package jobs) encodes
// it, the SDK's resume handler decodes it, so the two cannot drift. It
// lives in the SDK module because the SDK must not import the server.
package resumecall

import (
	"encoding/json"
	"time"
)

// Type is the type of every resume call.
const Type = "key.resume"

// Body is the JSON body of a resume call, signed like a webhook.
type Body struct {
	Type      string `json:"type"`
	Tenant    string `json:"tenant"`
	Key       string `json:"key"`
	Operation string `json:"operation"`
	// Attempt is this resume attempt, 1-based, of MaxAttempts.
	Attempt     int `json:"attempt"`
	MaxAttempts int `json:"max_attempts"`
	// FencingToken is the token the completer took the key over with.
	FencingToken int64 `json:"fencing_token"`
	// RecoveryPoint and RecoveryData are the dead attempt's last
	// checkpoint: null when it saved none.
	RecoveryPoint  *string         `json:"recovery_point"`
	RecoveryData   json.RawMessage `json:"recovery_data"`
	LeaseExpiresAt time.Time       `json:"lease_expires_at"`
	// Deadline is when the completer stops asking and flags the key for
	// review.
	Deadline time.Time `json:"deadline"`
}
