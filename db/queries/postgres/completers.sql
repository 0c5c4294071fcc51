-- Queries of the completer (completer.go). Every record query addresses
-- in-flight rows; "now" is the nullable clock parameter of keys.sql.

-- name: CreateCompleter :one
-- CreateCompleter adds a completer while the tenant has fewer than
-- max_completers; no row at the bound. The caller holds
-- LockTenantEndpoints, so creates of one tenant count one after the other.
WITH clock AS (
    SELECT coalesce(sqlc.narg('now')::timestamptz, now())::timestamptz AS now
)
INSERT INTO completers (tenant_id, id, url, secret, operation_pattern, created_at)
SELECT sqlc.arg('tenant_id')::text, sqlc.arg('id')::text, sqlc.arg('url')::text,
    sqlc.arg('secret')::text, sqlc.arg('operation_pattern')::text, clock.now
FROM clock
WHERE (SELECT count(*) FROM completers c WHERE c.tenant_id = sqlc.arg('tenant_id')::text) < sqlc.arg('max_completers')::bigint
RETURNING *;

-- name: GetCompleter :one
SELECT * FROM completers
WHERE tenant_id = sqlc.arg('tenant_id') AND id = sqlc.arg('id');

-- name: ListCompleters :many
SELECT * FROM completers
WHERE tenant_id = sqlc.arg('tenant_id')
ORDER BY created_at, id;

-- name: DeleteCompleter :execrows
DELETE FROM completers
WHERE tenant_id = sqlc.arg('tenant_id') AND id = sqlc.arg('id');

-- name: PickCompletions :many
-- PickCompletions takes over, in one statement, at most row_limit records
-- for the completer: orphans nobody flagged for review whose tenant has a
-- completer matching their operation (idem.MatchOperation in SQL), and the
-- records the completer holds whose next attempt is due or whose attempt's
-- lease ran out (a dead replica's). At most per_tenant records of one
-- tenant, its oldest leases first (row_number per tenant), and none of
-- skip_tenants (those whose share of the replica's attempts is in use):
-- one tenant's backlog never takes every slot, so another tenant's orphan
-- is tried in the next pick. FOR UPDATE SKIP LOCKED: concurrent pickers
-- on several replicas take different rows, and a row a claim has locked
-- (a retry taking it over) is left to the claim; the locking scan states
-- the conditions again, so a row that changed since the ranking's
-- snapshot is checked on its newest version. The rows are updated by the
-- addresses the locking scan returned, as ReapKeys does. Each gets what a
-- takeover gives (a new token, attempt+1, the recovery point kept, no
-- attempt id) and the completer's lease.
WITH clock AS (
    SELECT coalesce(sqlc.narg('now')::timestamptz, now())::timestamptz AS now
), ranked AS (
    SELECT r.tenant_id, r.key,
        row_number() OVER (PARTITION BY r.tenant_id ORDER BY r.lease_expires_at, r.key) AS tenant_rank
    FROM idempotency_keys r
    WHERE r.state = 'in_flight' AND r.lease_expires_at <= (SELECT clock.now FROM clock)
        AND r.review_note IS NULL
        AND NOT (r.tenant_id = ANY (sqlc.arg('skip_tenants')::text[]))
        AND (r.completer_state = 'resuming'
            OR (r.completer_state = 'unknown' AND r.completer_next_at <= (SELECT clock.now FROM clock))
            OR (r.completer_state IS NULL AND EXISTS (
                SELECT 1 FROM completers c
                WHERE c.tenant_id = r.tenant_id
                    AND (c.operation_pattern = '' OR c.operation_pattern = r.operation
                        OR (right(c.operation_pattern, 1) = '*'
                            AND left(r.operation, length(c.operation_pattern) - 1)
                                = left(c.operation_pattern, length(c.operation_pattern) - 1))))))
)
UPDATE idempotency_keys k SET
    fencing_token = nextval('fencing_tokens'),
    attempt = k.attempt + 1,
    attempt_id = NULL,
    lease_expires_at = clock.now + sqlc.arg('lease_us')::bigint * interval '1 microsecond',
    completer_state = 'resuming',
    completer_attempts = k.completer_attempts + 1,
    completer_next_at = NULL,
    completer_deadline = coalesce(k.completer_deadline,
        least(clock.now + sqlc.arg('deadline_us')::bigint * interval '1 microsecond', k.purge_after)),
    updated_at = clock.now,
    purge_after = greatest(k.purge_after, clock.now + sqlc.arg('lease_us')::bigint * interval '1 microsecond')
FROM clock
WHERE k.ctid = ANY (ARRAY(
    SELECT e.ctid
    FROM idempotency_keys e
    WHERE (e.tenant_id, e.key) IN (
            SELECT ranked.tenant_id, ranked.key FROM ranked WHERE ranked.tenant_rank <= sqlc.arg('per_tenant')::bigint)
        AND e.state = 'in_flight' AND e.lease_expires_at <= (SELECT clock.now FROM clock)
        AND e.review_note IS NULL
        AND (e.completer_state = 'resuming'
            OR (e.completer_state = 'unknown' AND e.completer_next_at <= (SELECT clock.now FROM clock))
            OR e.completer_state IS NULL)
    ORDER BY e.lease_expires_at
    LIMIT sqlc.arg('row_limit')::integer
    FOR UPDATE OF e SKIP LOCKED
))
RETURNING sqlc.embed(k), clock.now AS observed_at;

-- name: SetCompletionUnknown :one
-- SetCompletionUnknown keeps a record held after an unknown attempt: the
-- next attempt is due at next_at, and the completer's lease ends now (the
-- record shows as orphaned; a claim still gets outcome_unknown). The
-- caller locked and checked the row.
WITH clock AS (
    SELECT coalesce(sqlc.narg('now')::timestamptz, now())::timestamptz AS now
)
UPDATE idempotency_keys k SET
    completer_state = 'unknown',
    completer_next_at = clock.now + sqlc.arg('retry_us')::bigint * interval '1 microsecond',
    lease_expires_at = clock.now,
    updated_at = clock.now
FROM clock
WHERE k.tenant_id = sqlc.arg('tenant_id') AND k.key = sqlc.arg('key')
    AND k.fencing_token = sqlc.arg('fencing_token') AND k.state = 'in_flight'
RETURNING sqlc.embed(k), clock.now AS observed_at;

-- name: SetCompletionReview :one
-- SetCompletionReview flags a record the completer gave up on for review,
-- with the note; the completer's lease ends now, so a person may release
-- or complete it at once. The caller locked and checked the row.
WITH clock AS (
    SELECT coalesce(sqlc.narg('now')::timestamptz, now())::timestamptz AS now
)
UPDATE idempotency_keys k SET
    completer_state = 'review',
    completer_next_at = NULL,
    review_note = sqlc.arg('review_note')::text,
    review_at = clock.now,
    lease_expires_at = clock.now,
    updated_at = clock.now
FROM clock
WHERE k.tenant_id = sqlc.arg('tenant_id') AND k.key = sqlc.arg('key')
    AND k.fencing_token = sqlc.arg('fencing_token') AND k.state = 'in_flight'
RETURNING sqlc.embed(k), clock.now AS observed_at;

-- name: CompletionStats :many
-- CompletionStats counts the records the completer holds or flagged, per
-- tenant and state, from the partial index on completer_state.
WITH clock AS (
    SELECT coalesce(sqlc.narg('now')::timestamptz, now())::timestamptz AS now
)
SELECT
    k.tenant_id,
    k.completer_state::text AS completer_state,
    count(*)::bigint AS records,
    min(k.updated_at)::timestamptz AS oldest,
    min(clock.now)::timestamptz AS observed_at
FROM idempotency_keys k, clock
WHERE k.completer_state IS NOT NULL AND k.state = 'in_flight'
GROUP BY k.tenant_id, k.completer_state
ORDER BY k.tenant_id, k.completer_state;
