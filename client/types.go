package client

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"time"
	"unicode/utf8"
)

// State is the state of a record as the service shows it.
type State string

// The states of a record.
const (
	StateInFlight  State = "in_flight"
	StateCompleted State = "completed"
	StateOrphaned  State = "orphaned"
	StateExpired   State = "expired"
)

// Response is a stored response: the status, headers and body that a
// completed request answered with and that a replay returns verbatim.
type Response struct {
	Status  int
	Headers map[string]string
	Body    []byte
}

type wireResponse struct {
	Status       int               `json:"status"`
	Headers      map[string]string `json:"headers,omitempty"`
	Body         string            `json:"body"`
	BodyEncoding string            `json:"body_encoding,omitempty"`
}

// MarshalJSON encodes the response as the contract's response object: the
// body as UTF-8 text when it is valid UTF-8, base64 otherwise.
func (r Response) MarshalJSON() ([]byte, error) {
	w := wireResponse{Status: r.Status, Headers: r.Headers, BodyEncoding: "utf8"}
	if utf8.Valid(r.Body) {
		w.Body = string(r.Body)
	} else {
		w.Body = base64.StdEncoding.EncodeToString(r.Body)
		w.BodyEncoding = "base64"
	}
	return json.Marshal(w)
}

// UnmarshalJSON decodes the contract's response object.
func (r *Response) UnmarshalJSON(data []byte) error {
	var w wireResponse
	if err := json.Unmarshal(data, &w); err != nil {
		return err
	}
	r.Status, r.Headers = w.Status, w.Headers
	switch w.BodyEncoding {
	case "", "utf8":
		r.Body = []byte(w.Body)
	case "base64":
		b, err := base64.StdEncoding.DecodeString(w.Body)
		if err != nil {
			return fmt.Errorf("decode base64 response body: %w", err)
		}
		r.Body = b
	default:
		return fmt.Errorf("unknown body_encoding %q", w.BodyEncoding)
	}
	return nil
}

// Record is what the service stores for one key, as GET /v1/keys/{key}
// returns it. Lists leave Response nil.
type Record struct {
	// Tenant is set by the operator's orphan list only.
	Tenant         string          `json:"tenant,omitempty"`
	Key            string          `json:"key"`
	State          State           `json:"state"`
	Operation      string          `json:"operation,omitempty"`
	Fingerprint    string          `json:"fingerprint,omitempty"`
	FencingToken   int64           `json:"fencing_token"`
	Attempt        int             `json:"attempt"`
	LeaseExpiresAt time.Time       `json:"lease_expires_at,omitzero"`
	RecoveryPoint  string          `json:"recovery_point,omitempty"`
	RecoveryData   json.RawMessage `json:"recovery_data,omitempty"`
	CreatedAt      time.Time       `json:"created_at,omitzero"`
	CompletedAt    time.Time       `json:"completed_at,omitzero"`
	ReplayUntil    time.Time       `json:"replay_until,omitzero"`
	PurgeAfter     time.Time       `json:"purge_after,omitzero"`
	Response       *Response       `json:"response,omitempty"`
	// Completer is idem's completer's hold on the record (a worker died
	// holding it; see ResumeHandler); nil when it never took it.
	Completer *Completion `json:"completer,omitempty"`
}

// Completion is the completer's hold on a record: "resuming" (an attempt
// runs), "unknown" (the next is due at NextAttemptAt) or "review" (it gave
// up; a person must release or complete the key).
type Completion struct {
	State         string    `json:"state"`
	CompleterID   string    `json:"completer_id"`
	Attempts      int       `json:"attempts"`
	NextAttemptAt time.Time `json:"next_attempt_at,omitzero"`
	Deadline      time.Time `json:"deadline,omitzero"`
}

// UnmarshalJSON decodes a record, reading JSON nulls as zero values
// (encoding/json already does so for the timestamps and strings; a null
// recovery_data would otherwise stay the raw text "null").
func (r *Record) UnmarshalJSON(data []byte) error {
	type plain Record
	var p plain
	if err := json.Unmarshal(data, &p); err != nil {
		return err
	}
	*r = Record(p)
	if string(r.RecoveryData) == "null" {
		r.RecoveryData = nil
	}
	return nil
}

// Request describes the intent a key stands for, sent with every claim.
type Request struct {
	// Operation is a label of at most 128 bytes, e.g. "POST /v1/payments";
	// it takes part in the mismatch check.
	Operation string
	// Fingerprint is an opaque digest of the request (1–256 characters).
	// Leave it empty and set Payload to let the server compute one.
	Fingerprint string
	// Payload is the request itself, any value that encodes to JSON; the
	// server fingerprints its canonical form. Fingerprint and Payload are
	// mutually exclusive.
	Payload any
	// Lease is the lease asked for, rounded up to whole seconds; zero takes
	// the tenant's default.
	Lease time.Duration
	// NoWait makes Do return ErrRequestInFlight at once instead of waiting
	// for another holder of the key (after the server held the claim for
	// Wait, when set).
	NoWait bool
	// Wait asks the server to hold the claim, while another request holds
	// the key, until that one completes (the replay), releases or loses its
	// lease (this claim gets the key) — at most Wait, rounded down to whole
	// seconds and capped by the tenant's max_wait_seconds (wait_seconds).
	// Claim sends it as set; Do sets it itself, from what its deadline, the
	// attempt timeout and InFlightWait leave, unless NoWait: then Do sends
	// Wait within the attempt timeout less a second (a front door passing
	// on a caller's Prefer: wait=N).
	Wait time.Duration
	// AttemptID names this logical claim (1–64 bytes) so that a claim
	// whose answer was lost gets its own attempt back (same fencing token)
	// instead of 409 request_in_flight and a wait for its own lease. Empty:
	// a random one per Claim or Do call, reused by every retry of that
	// call, unless WithAttemptIDs(false). Never share one between two
	// logical calls: whoever sends it gets the attempt.
	AttemptID string
}

type claimBody struct {
	Operation    string `json:"operation,omitempty"`
	Fingerprint  string `json:"fingerprint,omitempty"`
	Request      any    `json:"request,omitempty"`
	LeaseSeconds int    `json:"lease_seconds,omitempty"`
	AttemptID    string `json:"attempt_id,omitempty"`
	WaitSeconds  int    `json:"wait_seconds,omitempty"`
}

func leaseSeconds(d time.Duration) int {
	if d <= 0 {
		return 0
	}
	return int((d + time.Second - 1) / time.Second)
}

// ClaimResult is the answer to a claim: either a fresh claim or takeover
// (Replayed false; FencingToken, Attempt, Resumed and the recovery point
// are set), or a replay of a completed request (Replayed true; Record
// holds the stored Response).
type ClaimResult struct {
	Record
	// Resumed is true for a takeover of an orphaned claim; RecoveryPoint and
	// RecoveryData then hold the last checkpoint.
	Resumed bool `json:"resumed"`
	// Replayed is true when the key was already completed: Response holds
	// the stored response.
	Replayed bool `json:"-"`
	// WaitApplied is the wait the server applied to this claim
	// (Preference-Applied, from Request.Wait); zero when none.
	WaitApplied time.Duration `json:"-"`
	// LeaseLeft is the lease the claim had when the server answered:
	// LeaseExpiresAt less the answer's Date (whole seconds, so up to a
	// second more). Unlike LeaseExpiresAt less this host's clock, it does
	// not depend on how far the two clocks are apart. Zero when the answer
	// had no Date.
	LeaseLeft time.Duration `json:"-"`
	// ReplayLeft is, for a replay, how much of the replay window was left
	// when the server answered: ReplayUntil less the answer's Date and
	// less a second (Date is in whole seconds), so never more than what
	// was left, on the server's clock rather than this host's. Zero when
	// the answer had no Date, or for a claim.
	ReplayLeft time.Duration `json:"-"`
}

// Settings are a tenant's settings.
type Settings struct {
	ReplayWindowSeconds    int `json:"replay_window_seconds"`
	ReaperThresholdSeconds int `json:"reaper_threshold_seconds"`
	LeaseSecondsDefault    int `json:"lease_seconds_default"`
	LeaseSecondsMax        int `json:"lease_seconds_max"`
	MaxResponseBytes       int `json:"max_response_bytes"`
	RateLimitPerSecond     int `json:"rate_limit_per_second"`
	// MaxWaitSeconds caps how long a claim may wait for a key in flight.
	MaxWaitSeconds int `json:"max_wait_seconds"`
	// StorageQuotaBytes bounds the bytes the tenant's records store; at or
	// over it, claims of new keys get ErrStorageQuotaExceeded.
	StorageQuotaBytes int64 `json:"storage_quota_bytes"`
	// RetryBudgetPercent is the share of first attempts that retries may
	// add, per replica and kind of call; past it a retry is refused with
	// 429 retry_budget_exhausted. 100 turns the budget off.
	RetryBudgetPercent int `json:"retry_budget_percent"`
}

// SettingsPatch changes some settings; nil fields are left as they are.
type SettingsPatch struct {
	ReplayWindowSeconds    *int   `json:"replay_window_seconds,omitempty"`
	ReaperThresholdSeconds *int   `json:"reaper_threshold_seconds,omitempty"`
	LeaseSecondsDefault    *int   `json:"lease_seconds_default,omitempty"`
	LeaseSecondsMax        *int   `json:"lease_seconds_max,omitempty"`
	MaxResponseBytes       *int   `json:"max_response_bytes,omitempty"`
	RateLimitPerSecond     *int   `json:"rate_limit_per_second,omitempty"`
	MaxWaitSeconds         *int   `json:"max_wait_seconds,omitempty"`
	StorageQuotaBytes      *int64 `json:"storage_quota_bytes,omitempty"`
	RetryBudgetPercent     *int   `json:"retry_budget_percent,omitempty"`
}

// Tenant is an account of the service.
type Tenant struct {
	ID       string   `json:"id"`
	Name     string   `json:"name"`
	Settings Settings `json:"settings"`
	// Disabled is reported by the operator endpoints.
	Disabled bool `json:"disabled,omitempty"`
	// Usage is what the tenant's records take against its quotas.
	Usage     Usage     `json:"usage"`
	CreatedAt time.Time `json:"created_at,omitzero"`
	UpdatedAt time.Time `json:"updated_at,omitzero"`
}

// Usage is what a tenant's records take against its quotas.
type Usage struct {
	// StoredBytes counts against Settings.StorageQuotaBytes.
	StoredBytes int64 `json:"stored_bytes"`
}

// TenantPatch changes a tenant; nil fields are left as they are. Disabled
// is honoured by the operator endpoint only.
type TenantPatch struct {
	Name     *string        `json:"name,omitempty"`
	Settings *SettingsPatch `json:"settings,omitempty"`
	Disabled *bool          `json:"disabled,omitempty"`
}

// NewTenant is the body of an operator's tenant creation.
type NewTenant struct {
	// ID is 1–64 of [a-z0-9_-].
	ID       string         `json:"id"`
	Name     string         `json:"name,omitempty"`
	Settings *SettingsPatch `json:"settings,omitempty"`
}

// ListOptions filter and page GET /v1/keys.
type ListOptions struct {
	// State filters by API state; empty lists all.
	State State
	// Completer, "unknown" or "review", lists only the records idem's
	// completer holds or gave up on; empty lists all.
	Completer string
	// Limit is the page size; zero takes the server's default.
	Limit int
	// Cursor is NextCursor of the previous page; empty for the first.
	Cursor string
}

// KeyPage is one page of records, newest first.
type KeyPage struct {
	Items []Record `json:"items"`
	// NextCursor is empty on the last page.
	NextCursor string `json:"next_cursor,omitempty"`
}

// Ptr returns a pointer to v, for the patch types.
func Ptr[T any](v T) *T { return &v }

// UnmarshalJSON decodes a claim answer (the record plus "resumed") in one
// pass over it: decoding the record and then "resumed" read every claim's
// answer three times (docs/benchmarks.md, issue 23).
func (c *ClaimResult) UnmarshalJSON(data []byte) error {
	type plain Record
	var w struct {
		plain
		Resumed bool `json:"resumed"`
	}
	if err := json.Unmarshal(data, &w); err != nil {
		return err
	}
	c.Record, c.Resumed = Record(w.plain), w.Resumed
	if string(c.RecoveryData) == "null" {
		c.RecoveryData = nil
	}
	return nil
}
