-- Queries of the completer on SQLite (completer.go). Times are unix
-- microseconds. The store runs them in the writer slot, inside one BEGIN
-- IMMEDIATE transaction where several belong together.

-- name: CreateCompleter :one
-- CreateCompleter adds a completer while the tenant has fewer than
-- max_completers; no row at the bound (one statement under the write lock).
INSERT INTO completers (tenant_id, id, url, secret, operation_pattern, created_at)
SELECT sqlc.arg(tenant_id), sqlc.arg(id), sqlc.arg(url), sqlc.arg(secret),
    sqlc.arg(operation_pattern), sqlc.arg(now)
WHERE (SELECT count(*) FROM completers c WHERE c.tenant_id = sqlc.arg(tenant_id)) < CAST(sqlc.arg(max_completers) AS INTEGER)
RETURNING *;

-- name: GetCompleter :one
SELECT * FROM completers
WHERE tenant_id = sqlc.arg(tenant_id) AND id = sqlc.arg(id);

-- name: ListCompleters :many
SELECT * FROM completers
WHERE tenant_id = sqlc.arg(tenant_id)
ORDER BY created_at, id;

-- name: DeleteCompleter :execrows
DELETE FROM completers
WHERE tenant_id = sqlc.arg(tenant_id) AND id = sqlc.arg(id);

-- name: PickCompletionCandidates :many
-- PickCompletionCandidates lists, oldest lease first, the records the
-- completer may take now (PostgreSQL's PickCompletions says which): at
-- most per_tenant of one tenant, its oldest leases first, and none of
-- skip_tenants (one tenant's backlog never takes every slot). The caller
-- takes each with TakeCompletion in the same transaction.
SELECT r.tenant_id, r.key
FROM (
    SELECT e.tenant_id, e.key, e.lease_expires_at,
        row_number() OVER (PARTITION BY e.tenant_id ORDER BY e.lease_expires_at, e.key) AS tenant_rank
    FROM idempotency_keys e
    WHERE e.state = 'in_flight' AND e.lease_expires_at <= CAST(sqlc.arg(now) AS INTEGER)
        AND e.review_note IS NULL
        -- a JSON array, not sqlc.slice: the slice's expanded ? would take
        -- the numbers of the named parameters after it
        AND e.tenant_id NOT IN (SELECT value FROM json_each(CAST(sqlc.arg(skip_tenants) AS TEXT)))
        AND (e.completer_state = 'resuming'
            OR (e.completer_state = 'unknown' AND e.completer_next_at <= CAST(sqlc.arg(now) AS INTEGER))
            OR (e.completer_state IS NULL AND EXISTS (
                SELECT 1 FROM completers c
                WHERE c.tenant_id = e.tenant_id
                    AND (c.operation_pattern = '' OR c.operation_pattern = e.operation
                        OR (substr(c.operation_pattern, -1) = '*'
                            AND substr(e.operation, 1, length(c.operation_pattern) - 1)
                                = substr(c.operation_pattern, 1, length(c.operation_pattern) - 1))))))
) r
WHERE r.tenant_rank <= CAST(sqlc.arg(per_tenant) AS INTEGER)
ORDER BY r.lease_expires_at
LIMIT sqlc.arg(row_limit);

-- name: TakeCompletion :one
-- TakeCompletion gives a record the completer picked what a takeover gives
-- (a new token, attempt+1, the recovery point kept, no attempt id) and the
-- completer's lease, counting the attempt.
UPDATE idempotency_keys SET
    fencing_token = sqlc.arg(fencing_token),
    attempt = attempt + 1,
    attempt_id = NULL,
    lease_expires_at = sqlc.arg(lease_expires_at),
    completer_state = 'resuming',
    completer_attempts = completer_attempts + 1,
    completer_next_at = NULL,
    -- the policy's deadline from the first takeover, never past the
    -- record's purge time (the reaper would delete it first)
    completer_deadline = coalesce(completer_deadline,
        min(sqlc.arg(now) + CAST(sqlc.arg(deadline_us) AS INTEGER), purge_after)),
    updated_at = sqlc.arg(now),
    purge_after = max(purge_after, sqlc.arg(lease_expires_at))
WHERE tenant_id = sqlc.arg(tenant_id) AND key = sqlc.arg(key)
RETURNING *;

-- name: SetCompletionUnknown :one
-- SetCompletionUnknown keeps a record held after an unknown attempt: the
-- next attempt is due at next_at, the completer's lease ends now.
UPDATE idempotency_keys SET
    completer_state = 'unknown',
    completer_next_at = sqlc.arg(next_at),
    lease_expires_at = sqlc.arg(now),
    updated_at = sqlc.arg(now)
WHERE tenant_id = sqlc.arg(tenant_id) AND key = sqlc.arg(key)
RETURNING *;

-- name: SetCompletionReview :one
-- SetCompletionReview flags a record the completer gave up on for review
-- with the note; the completer's lease ends now.
UPDATE idempotency_keys SET
    completer_state = 'review',
    completer_next_at = NULL,
    review_note = sqlc.arg(review_note),
    review_at = sqlc.arg(now),
    lease_expires_at = sqlc.arg(now),
    updated_at = sqlc.arg(now)
WHERE tenant_id = sqlc.arg(tenant_id) AND key = sqlc.arg(key)
RETURNING *;

-- name: CompletionStats :many
SELECT tenant_id,
       CAST(completer_state AS TEXT) AS completer_state,
       COUNT(*) AS records,
       CAST(MIN(updated_at) AS INTEGER) AS oldest
FROM idempotency_keys
WHERE completer_state IS NOT NULL AND state = 'in_flight'
GROUP BY tenant_id, completer_state
ORDER BY tenant_id, completer_state;
