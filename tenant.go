package idem

import (
	"fmt"
	"time"
)

// Tenant is an account of the service. Every key, setting and metric is
// scoped to one tenant.
type Tenant struct {
	ID       string
	Name     string
	Settings Settings
	// Disabled tenants are refused (403 tenant_unknown) until re-enabled,
	// except for the checkpoint, complete and release that finish claims
	// made before; their records stay as they are (only deleting a tenant
	// removes them).
	Disabled  bool
	CreatedAt time.Time
	UpdatedAt time.Time
	// StoredBytes is what the tenant's records count against
	// storage_quota_bytes (Record.StoredBytes summed), as the store read it.
	StoredBytes int64
}

// ResponseLimit returns the most bytes a stored response, or checkpoint
// data, of a record first claimed at claimedAt may take: the tenant's
// max_response_bytes when the claim came after the tenant's last change,
// else MaxResponseBytesLimit. A claim is owed the limit in force when it
// was made, and idem keeps no history of settings: refusing the response
// of work already done because the tenant lowered its limit meanwhile
// would lose it, and the retry would run the request again.
func (t Tenant) ResponseLimit(claimedAt time.Time) int {
	if claimedAt.After(t.UpdatedAt) {
		return t.Settings.MaxResponseBytes
	}
	return max(t.Settings.MaxResponseBytes, MaxResponseBytesLimit)
}

// ClaimQuota returns the quota a claim of the tenant is checked against in
// the store (ClaimParams.StorageQuotaBytes): storage_quota_bytes once the
// tenant's usage as read with it (StoredBytes; on the hot path from the
// tenant cache, at most IDEM_TENANT_CACHE_TTL old) has reached nine tenths
// of it, else 0, no check. Far below its quota a tenant's claims then do
// not read its usage counters at all (on PostgreSQL, a sum over 64 rows
// that every writer of the tenant updates); near it, the check is exact
// to the claim's statement. The price: a tenant that writes more than a
// tenth of its quota within one cache period passes the quota by the
// excess before its claims are checked.
func (t Tenant) ClaimQuota() int64 {
	q := t.Settings.StorageQuotaBytes
	if t.StoredBytes >= q-q/10 {
		return q
	}
	return 0
}

// RenewalLeaseFor is Settings.LeaseFor for a checkpoint of a record first
// claimed at claimedAt: a claim made before the tenant's last change may
// renew a lease up to MaxLeaseSeconds, as ResponseLimit does for
// responses. Refusing a worker the lease it claimed with because the
// tenant lowered lease_seconds_max meanwhile would let the lease run out
// under it, and a retry take the key over while it still works.
func (t Tenant) RenewalLeaseFor(requested int, claimedAt time.Time) (time.Duration, error) {
	s := t.Settings
	if !claimedAt.After(t.UpdatedAt) {
		s.LeaseSecondsMax = max(s.LeaseSecondsMax, MaxLeaseSeconds)
	}
	return s.LeaseFor(requested)
}

// TenantUnknown returns the tenant_unknown error for a claim in tenant id
// that does not exist; cause is the store's constraint error, for logs.
func TenantUnknown(id string, cause error) *Error {
	return &Error{Code: CodeTenantUnknown, Detail: "tenant '" + id + "' does not exist", Err: cause}
}

// TenantExists returns the tenant_exists error for creating tenant id
// again; cause is the store's constraint error, for logs.
func TenantExists(id string, cause error) *Error {
	return &Error{Code: CodeTenantExists, Detail: "tenant '" + id + "' already exists", Err: cause}
}

// TenantNotFound returns the tenant_not_found error for an operator action
// on tenant id that does not exist.
func TenantNotFound(id string) *Error {
	return Errorf(CodeTenantNotFound, "tenant '%s' does not exist", id)
}

// Settings are a tenant's own knobs. A change applies to claims made after
// it; records keep the windows they were created with.
type Settings struct {
	ReplayWindowSeconds    int `json:"replay_window_seconds"`
	ReaperThresholdSeconds int `json:"reaper_threshold_seconds"`
	LeaseSecondsDefault    int `json:"lease_seconds_default"`
	LeaseSecondsMax        int `json:"lease_seconds_max"`
	MaxResponseBytes       int `json:"max_response_bytes"`
	// RateLimitPerSecond is the tenant's request rate limit; 0 is off.
	RateLimitPerSecond int `json:"rate_limit_per_second"`
	// MaxWaitSeconds caps how long a claim of a key in flight may be held
	// waiting for the holder to finish (wait_seconds, Prefer: wait=N);
	// 0 turns waiting off, so every such claim gets the immediate 409.
	MaxWaitSeconds int `json:"max_wait_seconds"`
	// StorageQuotaBytes bounds the bytes the tenant's records store
	// (Record.StoredBytes summed): a claim that would create a record while
	// the tenant is at or over it is refused with storage_quota_exceeded;
	// a complete whose response does not fit stores UnstoredResponse in
	// its place, and a checkpoint whose data does not fit keeps the
	// earlier data (both answered storage_quota_exceeded).
	StorageQuotaBytes int64 `json:"storage_quota_bytes"`
	// RetryBudgetPercent is the share of first attempts that retries may
	// add, per replica over a sliding window (package retrybudget): past
	// it, and past a floor of a few retries per window, a request that
	// says it is a retry (Idem-Attempt) is refused with 429
	// retry_budget_exhausted. 100 turns the budget off.
	RetryBudgetPercent int `json:"retry_budget_percent"`
}

// DefaultSettings returns the settings of a tenant created without any.
func DefaultSettings() Settings {
	return Settings{
		ReplayWindowSeconds:    86400,
		ReaperThresholdSeconds: 259200,
		LeaseSecondsDefault:    30,
		LeaseSecondsMax:        3600,
		MaxResponseBytes:       1 << 20,
		RateLimitPerSecond:     0,
		MaxWaitSeconds:         DefaultMaxWaitSeconds,
		StorageQuotaBytes:      DefaultStorageQuotaBytes,
		RetryBudgetPercent:     DefaultRetryBudgetPercent,
	}
}

// Bounds of the settings, from the contract.
const (
	MaxWindowSeconds      = 31536000
	MaxLeaseSeconds       = 86400
	MaxResponseBytesLimit = 8 << 20
	MaxRateLimitPerSecond = 100000
	MaxOperationBytes     = 128
	MaxKeyBytes           = 255
	MaxFingerprintChars   = 256
	MaxTenantIDBytes      = 64
	MaxRecoveryPointBytes = 128
	MaxTenantNameBytes    = 256
	// MaxWaitSecondsLimit bounds max_wait_seconds and a claim's
	// wait_seconds: a held request keeps a connection open on the caller,
	// any proxy and the server.
	MaxWaitSecondsLimit = 300
	// DefaultMaxWaitSeconds is max_wait_seconds of a tenant created without
	// it: below the server's default write timeout (30 s) with room for the
	// last store call and the answer.
	DefaultMaxWaitSeconds = 20
	MaxAttemptIDBytes     = 64
	// DefaultStorageQuotaBytes is storage_quota_bytes of a tenant created
	// without it, and of every tenant that existed before the setting:
	// 1 GiB, a thousand responses of the default max_response_bytes or
	// millions of ordinary ones; an operator raises it per tenant.
	DefaultStorageQuotaBytes = 1 << 30
	// StorageQuotaBytesLimit bounds storage_quota_bytes (1 TiB): an operator
	// gives a tenant as much as the disk holds, never "unlimited".
	StorageQuotaBytesLimit = 1 << 40
	// DefaultRetryBudgetPercent is retry_budget_percent of a tenant
	// created without it, and of every tenant that existed before the
	// setting: retries may add a tenth to the first attempts (the share
	// Envoy's and gRPC's retry budgets default to).
	DefaultRetryBudgetPercent = 10
	// RetryBudgetOff is the retry_budget_percent that turns the budget off.
	RetryBudgetOff = 100
)

// Validate checks every bound of the settings and returns an
// invalid_request *Error naming each offending field, or nil.
func (s Settings) Validate() error {
	var fields []FieldError
	check := func(ok bool, field, format string, args ...any) {
		if !ok {
			fields = append(fields, FieldError{Field: "settings." + field, Message: fmt.Sprintf(format, args...)})
		}
	}
	check(s.ReplayWindowSeconds >= 1 && s.ReplayWindowSeconds <= MaxWindowSeconds,
		"replay_window_seconds", "must be between 1 and %d", MaxWindowSeconds)
	// A record lives at least as long as its lease could run: the reaper
	// must never delete a key whose claimant may still be working on it.
	check(s.ReaperThresholdSeconds >= s.ReplayWindowSeconds && s.ReaperThresholdSeconds >= s.LeaseSecondsMax &&
		s.ReaperThresholdSeconds <= MaxWindowSeconds,
		"reaper_threshold_seconds", "must be at least replay_window_seconds (%d) and lease_seconds_max (%d), and at most %d",
		s.ReplayWindowSeconds, s.LeaseSecondsMax, MaxWindowSeconds)
	check(s.LeaseSecondsMax >= 1 && s.LeaseSecondsMax <= MaxLeaseSeconds,
		"lease_seconds_max", "must be between 1 and %d", MaxLeaseSeconds)
	check(s.LeaseSecondsDefault >= 1 && s.LeaseSecondsDefault <= s.LeaseSecondsMax,
		"lease_seconds_default", "must be between 1 and lease_seconds_max (%d)", s.LeaseSecondsMax)
	check(s.MaxResponseBytes >= 1 && s.MaxResponseBytes <= MaxResponseBytesLimit,
		"max_response_bytes", "must be between 1 and %d", MaxResponseBytesLimit)
	check(s.RateLimitPerSecond >= 0 && s.RateLimitPerSecond <= MaxRateLimitPerSecond,
		"rate_limit_per_second", "must be between 0 and %d", MaxRateLimitPerSecond)
	check(s.MaxWaitSeconds >= 0 && s.MaxWaitSeconds <= MaxWaitSecondsLimit,
		"max_wait_seconds", "must be between 0 and %d", MaxWaitSecondsLimit)
	// One full response must fit: a quota below it would refuse a
	// tenant's claims while it stores nothing it could shrink.
	check(s.StorageQuotaBytes >= int64(s.MaxResponseBytes) && s.StorageQuotaBytes <= StorageQuotaBytesLimit,
		"storage_quota_bytes", "must be at least max_response_bytes (%d) and at most %d", s.MaxResponseBytes, int64(StorageQuotaBytesLimit))
	check(s.RetryBudgetPercent >= 0 && s.RetryBudgetPercent <= RetryBudgetOff,
		"retry_budget_percent", "must be between 0 and %d (%d turns the retry budget off)", RetryBudgetOff, RetryBudgetOff)
	if len(fields) > 0 {
		return &Error{Code: CodeInvalidRequest, Detail: "invalid tenant settings", Fields: fields}
	}
	return nil
}

// SettingsPatch is a partial change of Settings; nil fields stay as they are.
type SettingsPatch struct {
	ReplayWindowSeconds    *int   `json:"replay_window_seconds"`
	ReaperThresholdSeconds *int   `json:"reaper_threshold_seconds"`
	LeaseSecondsDefault    *int   `json:"lease_seconds_default"`
	LeaseSecondsMax        *int   `json:"lease_seconds_max"`
	MaxResponseBytes       *int   `json:"max_response_bytes"`
	RateLimitPerSecond     *int   `json:"rate_limit_per_second"`
	MaxWaitSeconds         *int   `json:"max_wait_seconds"`
	StorageQuotaBytes      *int64 `json:"storage_quota_bytes"`
	RetryBudgetPercent     *int   `json:"retry_budget_percent"`
}

// Apply returns s with the patch's non-nil fields applied. Validate the
// result.
func (s Settings) Apply(p SettingsPatch) Settings {
	set := func(dst *int, v *int) {
		if v != nil {
			*dst = *v
		}
	}
	set(&s.ReplayWindowSeconds, p.ReplayWindowSeconds)
	set(&s.ReaperThresholdSeconds, p.ReaperThresholdSeconds)
	set(&s.LeaseSecondsDefault, p.LeaseSecondsDefault)
	set(&s.LeaseSecondsMax, p.LeaseSecondsMax)
	set(&s.MaxResponseBytes, p.MaxResponseBytes)
	set(&s.RateLimitPerSecond, p.RateLimitPerSecond)
	set(&s.MaxWaitSeconds, p.MaxWaitSeconds)
	set(&s.RetryBudgetPercent, p.RetryBudgetPercent)
	if p.StorageQuotaBytes != nil {
		s.StorageQuotaBytes = *p.StorageQuotaBytes
	}
	return s
}

// LeaseFor returns the lease for a request that asked for requested seconds
// (0 = the tenant's default), or an invalid_request *Error when it exceeds
// lease_seconds_max or is negative.
func (s Settings) LeaseFor(requested int) (time.Duration, error) {
	switch {
	case requested == 0:
		return time.Duration(s.LeaseSecondsDefault) * time.Second, nil
	case requested < 0 || requested > s.LeaseSecondsMax:
		return 0, &Error{
			Code:   CodeInvalidRequest,
			Detail: fmt.Sprintf("lease_seconds must be between 1 and %d", s.LeaseSecondsMax),
			Fields: []FieldError{{Field: "lease_seconds", Message: fmt.Sprintf("must be between 1 and the tenant's lease_seconds_max (%d)", s.LeaseSecondsMax)}},
		}
	}
	return time.Duration(requested) * time.Second, nil
}

// WaitFor returns how long a claim that asked to wait requested seconds may
// be held when its key is in flight: requested capped by max_wait_seconds
// (a wait is a preference, so a longer one is shortened, not refused).
func (s Settings) WaitFor(requested int) time.Duration {
	return time.Duration(max(min(requested, s.MaxWaitSeconds), 0)) * time.Second
}

// ReplayWindow returns the replay window as a duration.
func (s Settings) ReplayWindow() time.Duration {
	return time.Duration(s.ReplayWindowSeconds) * time.Second
}

// ReaperThreshold returns the reaper threshold as a duration.
func (s Settings) ReaperThreshold() time.Duration {
	return time.Duration(s.ReaperThresholdSeconds) * time.Second
}

// ValidateTenantID checks a tenant id: 1–64 of [a-z0-9_-]. It returns an
// invalid_request *Error or nil.
func ValidateTenantID(id string) error {
	bad := id == "" || len(id) > MaxTenantIDBytes
	for i := 0; i < len(id) && !bad; i++ {
		c := id[i]
		bad = !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '-')
	}
	if bad {
		return &Error{
			Code:   CodeInvalidRequest,
			Detail: "invalid tenant id",
			Fields: []FieldError{{Field: "id", Message: "must be 1-64 characters of [a-z0-9_-]"}},
		}
	}
	return nil
}
