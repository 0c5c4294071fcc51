import type { StoredResponse, WireResponse } from "./response.js";
/** The state of a record as the service shows it. */
export type State = "in_flight" | "completed" | "orphaned" | "expired";
/** What the service stores for one key (GET /v1/keys/{key}). */
export interface KeyRecord {
    /** Set by the operator's orphan list only. */
    tenant?: string;
    key: string;
    state: State;
    operation?: string;
    fingerprint?: string;
    fencing_token: number;
    attempt: number;
    lease_expires_at?: string | null;
    recovery_point?: string | null;
    recovery_data?: unknown;
    created_at?: string;
    completed_at?: string | null;
    replay_until?: string | null;
    purge_after?: string | null;
    response?: WireResponse | null;
}
/** The answer of a claim, with the stored response decoded. */
export interface ClaimResult {
    record: KeyRecord;
    /** The key was already completed: `response` holds the stored response. */
    replayed: boolean;
    /** This claim took over an orphaned one; `record.recovery_point`/`recovery_data` hold its last checkpoint. */
    resumed: boolean;
    fencingToken: number;
    attempt: number;
    /** The stored response of a replay. */
    response: StoredResponse | undefined;
    /** The wait, in whole seconds, the server applied to this claim (its `Preference-Applied` answer to `waitSeconds`); 0 when none. */
    waitAppliedSeconds: number;
    /**
     * The lease the claim had when the server answered, in ms:
     * `record.lease_expires_at` less the answer's `Date` (whole seconds, so up
     * to a second more). Unlike lease_expires_at less this host's clock, it
     * does not depend on how far the two clocks are apart. 0 when unknown.
     */
    leaseLeftMs: number;
    /**
     * For a replay, how much of the replay window was left when the server
     * answered, in ms: `record.replay_until` less the answer's `Date` and less
     * a second (`Date` is in whole seconds), so never more than what was
     * left, on the server's clock rather than this host's. 0 when the answer
     * had no `Date`, or for a claim. A front door's replay cache keeps the
     * replay no longer (docs/frontdoor.md, "The replay cache").
     */
    replayLeftMs: number;
}
/** The intent a key stands for, sent with every claim. */
export interface ClaimRequest {
    /** A label of at most 128 bytes, e.g. `POST /v1/payments`; it takes part in the mismatch check. */
    operation?: string;
    /** An opaque digest of the request (1–256 characters). Leave it out and set `request` to let the server compute one. */
    fingerprint?: string;
    /** The request itself, any JSON value; the server fingerprints its canonical (JCS) form. */
    request?: unknown;
    /** The lease asked for, in seconds; default the tenant's. */
    leaseSeconds?: number;
}
/** One page of records, newest first. */
export interface KeyPage {
    items: KeyRecord[];
    /** Absent on the last page. */
    next_cursor?: string;
}
/** A tenant's settings. */
export interface Settings {
    replay_window_seconds: number;
    reaper_threshold_seconds: number;
    lease_seconds_default: number;
    lease_seconds_max: number;
    max_response_bytes: number;
    rate_limit_per_second: number;
    /** Longest a claim of a key in flight is held waiting for the holder to finish (`waitSeconds`, `Prefer: wait=N`); 0 turns waiting off. */
    max_wait_seconds: number;
    /** Most bytes the tenant's records may store; at or over it, claims of new keys get 507 `storage_quota_exceeded`. */
    storage_quota_bytes: number;
    /** Share of first attempts that retries may add, per replica and kind of call; past it a retry gets 429 `retry_budget_exhausted`. 100 turns the budget off. */
    retry_budget_percent: number;
}
/** What a tenant's records take against its quotas. */
export interface Usage {
    /** Bytes the tenant's records store, as `storage_quota_bytes` counts them. */
    stored_bytes: number;
}
/** An account of the service. */
export interface Tenant {
    id: string;
    name: string;
    settings: Settings;
    disabled?: boolean;
    usage?: Usage;
    created_at?: string;
    updated_at?: string;
}
/** One decoded, verified call of idem's completer. */
export interface ResumeCall {
    /** The call's `webhook-id`: unique per attempt. */
    webhookId: string;
    tenant: string;
    key: string;
    /** The claim's operation, e.g. `POST /orders`. */
    operation: string;
    /** This resume attempt, 1-based, of at most maxAttempts. */
    attempt: number;
    maxAttempts: number;
    /** The token idem took the key over with: checkpoints carry it; the late original worker's is stale. */
    fencingToken: number;
    /** The last checkpoint's name, null when the key was never checkpointed. */
    recoveryPoint: string | null;
    /** The last checkpoint's data verbatim, null when none. */
    recoveryData: unknown;
    /** When the completer's lease on the key runs out. */
    leaseExpiresAt: Date;
    /** After this idem marks the key for review instead of asking again. */
    deadline: Date;
}
