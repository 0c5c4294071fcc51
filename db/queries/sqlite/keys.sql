-- Queries of the embedded SQLite store. Times are unix microseconds. The
-- store runs every read-decide-write sequence inside one BEGIN IMMEDIATE
-- transaction, so these statements need no conditions of their own to be
-- race-free.

-- name: NextFencingToken :one
UPDATE fencing_counter SET value = value + 1 WHERE id = 1
RETURNING value;

-- name: GetKey :one
-- GetKey also tells an empty response body from none: the driver reads both
-- a zero-length BLOB and NULL as a nil slice.
SELECT sqlc.embed(idempotency_keys),
       CAST(response_body IS NOT NULL AS INTEGER) AS has_response_body
FROM idempotency_keys
WHERE tenant_id = sqlc.arg(tenant_id) AND key = sqlc.arg(key);

-- name: CreateKey :one
-- CreateKey inserts a fresh in-flight record, or overwrites an expired one
-- with a fresh record: attempt 1, response and recovery point cleared. It
-- is kept for the reaper threshold, and never less than the lease
-- (PostgreSQL's ClaimKey: greatest(...)).
INSERT INTO idempotency_keys (
    tenant_id, key, state, operation, fingerprint, fencing_token, attempt, attempt_id,
    lease_expires_at, recovery_point, recovery_data,
    response_status, response_headers, response_body, response_body_encoding,
    replay_window_seconds, reaper_threshold_seconds,
    created_at, updated_at, completed_at, replay_until, purge_after, stored_bytes
) VALUES (
    sqlc.arg(tenant_id), sqlc.arg(key), 'in_flight', sqlc.arg(operation), sqlc.arg(fingerprint),
    sqlc.arg(fencing_token), 1, sqlc.narg(attempt_id),
    sqlc.arg(lease_expires_at), NULL, NULL,
    NULL, NULL, NULL, NULL,
    sqlc.arg(replay_window_seconds), sqlc.arg(reaper_threshold_seconds),
    sqlc.arg(now), sqlc.arg(now), NULL, NULL,
    max(sqlc.arg(now) + sqlc.arg(reaper_threshold_seconds) * 1000000, sqlc.arg(lease_expires_at)),
    sqlc.arg(stored_bytes)
)
ON CONFLICT (tenant_id, key) DO UPDATE SET
    state = excluded.state,
    operation = excluded.operation,
    fingerprint = excluded.fingerprint,
    fencing_token = excluded.fencing_token,
    attempt = excluded.attempt,
    attempt_id = excluded.attempt_id,
    lease_expires_at = excluded.lease_expires_at,
    recovery_point = NULL,
    recovery_data = NULL,
    response_status = NULL,
    response_headers = NULL,
    response_body = NULL,
    response_body_encoding = NULL,
    replay_window_seconds = excluded.replay_window_seconds,
    reaper_threshold_seconds = excluded.reaper_threshold_seconds,
    created_at = excluded.created_at,
    updated_at = excluded.updated_at,
    completed_at = NULL,
    replay_until = NULL,
    purge_after = excluded.purge_after,
    stored_bytes = excluded.stored_bytes,
    completer_state = NULL,
    completer_id = NULL,
    completer_attempts = 0,
    completer_next_at = NULL,
    completer_deadline = NULL
RETURNING *;

-- name: TakeoverKey :one
-- TakeoverKey hands an orphaned record to a new attempt; the recovery point
-- and data stay for the new owner. The purge is the record's reaper
-- threshold from now, and never before the new lease ends.
UPDATE idempotency_keys SET
    fencing_token = sqlc.arg(fencing_token),
    attempt = attempt + 1,
    attempt_id = sqlc.narg(attempt_id),
    lease_expires_at = sqlc.arg(lease_expires_at),
    updated_at = sqlc.arg(now),
    purge_after = max(sqlc.arg(now) + reaper_threshold_seconds * 1000000, sqlc.arg(lease_expires_at))
WHERE tenant_id = sqlc.arg(tenant_id) AND key = sqlc.arg(key)
RETURNING *;

-- name: RenewAttemptLease :one
-- RenewAttemptLease gives a recovered attempt (a claim repeated with its
-- attempt id) a lease from now; the purge follows the lease (at least the
-- reaper threshold from now, never before the new lease ends, never
-- earlier than it was).
UPDATE idempotency_keys SET
    lease_expires_at = sqlc.arg(lease_expires_at),
    updated_at = sqlc.arg(now),
    purge_after = max(purge_after, sqlc.arg(now) + reaper_threshold_seconds * 1000000, sqlc.arg(lease_expires_at))
WHERE tenant_id = sqlc.arg(tenant_id) AND key = sqlc.arg(key)
RETURNING *;

-- name: CheckpointKey :one
-- CheckpointKey saves the recovery point, renews the lease and postpones the
-- purge (as RenewAttemptLease). The new recovery point and data, of
-- recovery_bytes (idem.RecoveryBytes), replace the old ones in
-- stored_bytes; the caller checked the token, the state and the quota in
-- the same transaction.
UPDATE idempotency_keys SET
    recovery_point = sqlc.arg(recovery_point),
    recovery_data = sqlc.narg(recovery_data),
    stored_bytes = stored_bytes - coalesce(length(CAST(recovery_point AS BLOB)), 0)
        - coalesce(length(CAST(recovery_data AS BLOB)), 0) + sqlc.arg(recovery_bytes),
    lease_expires_at = sqlc.arg(lease_expires_at),
    updated_at = sqlc.arg(now),
    purge_after = max(purge_after, sqlc.arg(now) + reaper_threshold_seconds * 1000000, sqlc.arg(lease_expires_at))
WHERE tenant_id = sqlc.arg(tenant_id) AND key = sqlc.arg(key)
RETURNING *;

-- name: CompleteKey :one
-- CompleteKey stores the response and starts the replay window; a
-- completion clears the review flag. The response's size (idem.Response
-- Size) goes to stored_bytes.
UPDATE idempotency_keys SET
    state = 'completed',
    lease_expires_at = NULL,
    response_status = sqlc.arg(response_status),
    response_headers = sqlc.arg(response_headers),
    response_body = sqlc.arg(response_body),
    response_body_encoding = sqlc.arg(response_body_encoding),
    stored_bytes = stored_bytes + sqlc.arg(response_bytes),
    review_note = NULL,
    review_at = NULL,
    completer_state = NULL,
    completer_next_at = NULL,
    updated_at = sqlc.arg(now),
    completed_at = sqlc.arg(now),
    replay_until = sqlc.arg(now) + replay_window_seconds * 1000000,
    purge_after = sqlc.arg(now) + reaper_threshold_seconds * 1000000
WHERE tenant_id = sqlc.arg(tenant_id) AND key = sqlc.arg(key)
RETURNING *;

-- name: ReleaseKey :execrows
-- ReleaseKey deletes the record; the caller checked inside the same
-- transaction that the token is current and the record in flight.
DELETE FROM idempotency_keys
WHERE tenant_id = sqlc.arg(tenant_id) AND key = sqlc.arg(key) AND fencing_token = sqlc.arg(fencing_token);

-- name: ListKeys :many
-- ListKeys lists a tenant's records newest first, without responses or
-- recovery data (a listing stays small whatever the records hold). The
-- state filter is the API state at now ('' for all). The keyset cursor is
-- always present (the first page passes the largest possible position) so
-- the listing index serves it as a range.
SELECT tenant_id, key, state, operation, fingerprint, fencing_token, attempt,
       lease_expires_at, recovery_point,
       replay_window_seconds, reaper_threshold_seconds,
       created_at, updated_at, completed_at, replay_until, purge_after,
       review_note, review_at,
       completer_state, completer_id, completer_attempts, completer_next_at, completer_deadline
FROM idempotency_keys
WHERE tenant_id = sqlc.arg(tenant_id)
  AND (created_at, key) < (CAST(sqlc.arg(after_time) AS INTEGER), CAST(sqlc.arg(after_key) AS TEXT))
  AND (CAST(sqlc.arg(state_filter) AS TEXT) = ''
       OR CAST(sqlc.arg(state_filter) AS TEXT) = CASE
            WHEN state = 'in_flight' AND lease_expires_at > CAST(sqlc.arg(now) AS INTEGER) THEN 'in_flight'
            WHEN state = 'in_flight' THEN 'orphaned'
            WHEN replay_until > CAST(sqlc.arg(now) AS INTEGER) THEN 'completed'
            ELSE 'expired'
          END)
  AND (CAST(sqlc.arg(completion_filter) AS TEXT) = ''
       OR (CAST(sqlc.arg(completion_filter) AS TEXT) = 'unknown' AND completer_state IN ('resuming', 'unknown'))
       OR (CAST(sqlc.arg(completion_filter) AS TEXT) = 'review' AND completer_state = 'review'))
ORDER BY created_at DESC, key DESC
LIMIT sqlc.arg(row_limit);

-- name: ListOrphanKeys :many
-- ListOrphanKeys lists orphaned records without recovery data, oldest lease
-- first, from the partial index of in-flight leases; tenant '' lists every
-- tenant.
SELECT tenant_id, key, state, operation, fingerprint, fencing_token, attempt,
       lease_expires_at, recovery_point,
       replay_window_seconds, reaper_threshold_seconds,
       created_at, updated_at, completed_at, replay_until, purge_after,
       review_note, review_at,
       completer_state, completer_id, completer_attempts, completer_next_at, completer_deadline
FROM idempotency_keys
WHERE state = 'in_flight'
  AND lease_expires_at <= CAST(sqlc.arg(now) AS INTEGER)
  AND (CAST(sqlc.arg(tenant_filter) AS TEXT) = '' OR tenant_id = sqlc.arg(tenant_filter))
  AND (CAST(sqlc.arg(completion_filter) AS TEXT) = ''
       OR (CAST(sqlc.arg(completion_filter) AS TEXT) = 'unknown' AND completer_state IN ('resuming', 'unknown'))
       OR (CAST(sqlc.arg(completion_filter) AS TEXT) = 'review' AND completer_state = 'review'))
  AND (lease_expires_at, tenant_id, key)
      > (CAST(sqlc.arg(after_time) AS INTEGER), CAST(sqlc.arg(after_tenant_id) AS TEXT), CAST(sqlc.arg(after_key) AS TEXT))
ORDER BY lease_expires_at, tenant_id, key
LIMIT sqlc.arg(row_limit);

-- name: OrphanStats :many
SELECT tenant_id,
       COUNT(*) AS orphans,
       CAST(MIN(lease_expires_at) AS INTEGER) AS oldest_lease_expiry
FROM idempotency_keys
WHERE state = 'in_flight' AND lease_expires_at <= CAST(sqlc.arg(now) AS INTEGER)
GROUP BY tenant_id
ORDER BY tenant_id;

-- name: ReapKeys :many
-- ReapKeys deletes one bounded batch of records past purge_after and returns
-- them without responses or recovery data. An in-flight record whose lease
-- still runs is never deleted, whatever its purge_after says: its claimant
-- may still be working.
DELETE FROM idempotency_keys
WHERE rowid IN (
    SELECT k.rowid FROM idempotency_keys AS k
    WHERE k.purge_after <= sqlc.arg(now)
      AND (k.state <> 'in_flight' OR k.lease_expires_at <= sqlc.arg(now))
    LIMIT sqlc.arg(row_limit)
)
RETURNING tenant_id, key, state, operation, fingerprint, fencing_token, attempt,
          lease_expires_at, recovery_point,
          replay_window_seconds, reaper_threshold_seconds,
          created_at, updated_at, completed_at, replay_until, purge_after,
          review_note, review_at,
          completer_state, completer_id, completer_attempts, completer_next_at, completer_deadline;

-- name: ResolveCompleteKey :one
-- ResolveCompleteKey stores the response a person supplied for an orphan,
-- hands the record a new fencing token (the late worker is fenced off) and
-- clears the review flag; the caller checked the record in the same
-- transaction. Its size goes to stored_bytes, as CompleteKey's.
UPDATE idempotency_keys SET
    state = 'completed',
    fencing_token = sqlc.arg(new_fencing_token),
    lease_expires_at = NULL,
    response_status = sqlc.arg(response_status),
    response_headers = sqlc.arg(response_headers),
    response_body = sqlc.arg(response_body),
    response_body_encoding = sqlc.arg(response_body_encoding),
    stored_bytes = stored_bytes + sqlc.arg(response_bytes),
    review_note = NULL,
    review_at = NULL,
    completer_state = NULL,
    completer_next_at = NULL,
    updated_at = sqlc.arg(now),
    completed_at = sqlc.arg(now),
    replay_until = sqlc.arg(now) + replay_window_seconds * 1000000,
    purge_after = sqlc.arg(now) + reaper_threshold_seconds * 1000000
WHERE tenant_id = sqlc.arg(tenant_id) AND key = sqlc.arg(key)
RETURNING *;

-- name: ReviewKey :one
-- ReviewKey flags an in-flight record for review with a note; the caller
-- checked the record in the same transaction.
UPDATE idempotency_keys SET
    review_note = sqlc.arg(review_note),
    review_at = sqlc.arg(now),
    updated_at = sqlc.arg(now)
WHERE tenant_id = sqlc.arg(tenant_id) AND key = sqlc.arg(key)
RETURNING *;

-- name: TenantStoredBytes :one
-- TenantStoredBytes is the tenant's usage: the sum of its counter rows.
SELECT CAST(coalesce(sum(stored_bytes), 0) AS INTEGER) AS stored_bytes
FROM tenant_usage WHERE tenant_id = sqlc.arg(tenant_id);
