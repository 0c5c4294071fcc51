-- name: LockTenantEndpoints :one
-- LockTenantEndpoints locks the tenant's row (FOR NO KEY UPDATE: claims,
-- whose foreign key takes KEY SHARE, go on) until the end of the
-- transaction, so that endpoint creates of one tenant count one after the
-- other. It returns no row for an unknown tenant.
SELECT t.id FROM tenants t WHERE t.id = sqlc.arg('tenant_id') FOR NO KEY UPDATE;

-- name: CreateWebhookEndpoint :one
-- CreateWebhookEndpoint adds an endpoint while the tenant has fewer than
-- max_endpoints; it returns no row at the bound. The caller holds
-- LockTenantEndpoints, so this statement's snapshot, taken after the lock,
-- counts every endpoint created before it.
WITH clock AS (
    SELECT coalesce(sqlc.narg('now')::timestamptz, now())::timestamptz AS now
)
INSERT INTO webhook_endpoints (tenant_id, id, url, secret, events, enabled, created_at, updated_at)
SELECT sqlc.arg('tenant_id')::text, sqlc.arg('id')::text, sqlc.arg('url')::text,
    sqlc.arg('secret')::text, sqlc.arg('events')::text, sqlc.arg('enabled')::boolean,
    clock.now, clock.now
FROM clock
WHERE (SELECT count(*) FROM webhook_endpoints e WHERE e.tenant_id = sqlc.arg('tenant_id')::text) < sqlc.arg('max_endpoints')::bigint
RETURNING *;

-- name: GetWebhookEndpoint :one
SELECT * FROM webhook_endpoints
WHERE tenant_id = sqlc.arg('tenant_id') AND id = sqlc.arg('id');

-- name: ListWebhookEndpoints :many
SELECT * FROM webhook_endpoints
WHERE tenant_id = sqlc.arg('tenant_id')
ORDER BY created_at, id;

-- name: UpdateWebhookEndpoint :one
-- UpdateWebhookEndpoint replaces url, filter and enabled flag; enabling an
-- endpoint clears its failure streak and the reason it was disabled.
WITH clock AS (
    SELECT coalesce(sqlc.narg('now')::timestamptz, now())::timestamptz AS now
)
UPDATE webhook_endpoints e SET
    url = sqlc.arg('url')::text,
    events = sqlc.arg('events')::text,
    disabled_reason = CASE WHEN sqlc.arg('enabled')::boolean THEN NULL ELSE e.disabled_reason END,
    consecutive_failures = CASE WHEN sqlc.arg('enabled')::boolean AND NOT e.enabled THEN 0 ELSE e.consecutive_failures END,
    failing_since = CASE WHEN sqlc.arg('enabled')::boolean AND NOT e.enabled THEN NULL ELSE e.failing_since END,
    enabled = sqlc.arg('enabled')::boolean,
    updated_at = clock.now
FROM clock
WHERE e.tenant_id = sqlc.arg('tenant_id') AND e.id = sqlc.arg('id')
RETURNING e.*;

-- name: DeleteWebhookEndpoint :execrows
DELETE FROM webhook_endpoints
WHERE tenant_id = sqlc.arg('tenant_id') AND id = sqlc.arg('id');

-- name: EnqueueEvent :execrows
-- EnqueueEvent fans one event out to every enabled endpoint of the tenant
-- whose filter takes its type: one outbox row each, due at once.
WITH clock AS (
    SELECT coalesce(sqlc.narg('now')::timestamptz, now())::timestamptz AS now
)
INSERT INTO webhook_deliveries (tenant_id, endpoint_id, event_id, event_type, payload, next_attempt_at, created_at)
SELECT e.tenant_id, e.id, sqlc.arg('event_id')::text, sqlc.arg('event_type')::text,
    sqlc.arg('payload')::bytea, clock.now, clock.now
FROM webhook_endpoints e, clock
WHERE e.tenant_id = sqlc.arg('tenant_id')::text AND e.enabled
    AND (e.events = '' OR (',' || e.events || ',') LIKE ('%,' || sqlc.arg('event_type')::text || ',%'));

-- name: EnqueueTestEvent :one
-- EnqueueTestEvent queues an event for one enabled endpoint, whatever its
-- filter.
WITH clock AS (
    SELECT coalesce(sqlc.narg('now')::timestamptz, now())::timestamptz AS now
)
INSERT INTO webhook_deliveries (tenant_id, endpoint_id, event_id, event_type, payload, next_attempt_at, created_at)
SELECT e.tenant_id, e.id, sqlc.arg('event_id')::text, sqlc.arg('event_type')::text,
    sqlc.arg('payload')::bytea, clock.now, clock.now
FROM webhook_endpoints e, clock
WHERE e.tenant_id = sqlc.arg('tenant_id')::text AND e.id = sqlc.arg('endpoint_id')::text AND e.enabled
RETURNING *;

-- name: ListWebhookDeliveries :many
SELECT id, tenant_id, endpoint_id, event_id, event_type, state, attempts,
    next_attempt_at, created_at, last_attempt_at, last_status, last_error, delivered_at
FROM webhook_deliveries
WHERE tenant_id = sqlc.arg('tenant_id') AND endpoint_id = sqlc.arg('endpoint_id')
    AND (sqlc.arg('before_id')::bigint = 0 OR id < sqlc.arg('before_id')::bigint)
ORDER BY id DESC
LIMIT sqlc.arg('row_limit')::integer;

-- name: ClaimWebhookDeliveries :many
-- ClaimWebhookDeliveries takes due pending deliveries of enabled endpoints,
-- counts the attempt and moves next_attempt_at to the end of the claim's
-- lease. One tenant gives at most per_tenant deliveries, spread over its
-- endpoints in turns (each endpoint's oldest due, then each one's second,
-- ...; a LATERAL walk of each endpoint's webhook_deliveries_endpoint_due
-- queue), and the claim takes the tenants in turns too: every tenant's
-- first, then every tenant's second, each turn oldest first, up to
-- row_limit. So one tenant's backlog, however old and on however many
-- endpoints, cannot fill a claim and hold back the other tenants'
-- deliveries. Within a turn the tenants go least recently served first:
-- served maps a tenant to when the caller last took one of its
-- deliveries (a JSON object of tenant id to a number, larger is more
-- recent; a tenant not in it comes first), then oldest first; so a caller
-- that claims one free slot at a time still goes round the tenants
-- instead of back to the one with the oldest backlog. The rows come back
-- in that order. FOR UPDATE SKIP LOCKED
-- lets several replicas claim at once without taking the same row or
-- waiting on each other; once the statement commits, the moved
-- next_attempt_at keeps the row away from every other claimer until the
-- lease runs out. When nothing at all is due (the first entry of the due
-- index says so), the endpoints are not walked.
WITH clock AS (
    SELECT coalesce(sqlc.narg('now')::timestamptz, now())::timestamptz AS now
), queued AS (
    SELECT q.id, q.next_attempt_at, e.tenant_id,
        row_number() OVER (PARTITION BY e.tenant_id, e.id ORDER BY q.next_attempt_at, q.id) AS endpoint_turn
    FROM webhook_endpoints e
    CROSS JOIN LATERAL (
        SELECT d.id, d.next_attempt_at
        FROM webhook_deliveries d
        WHERE d.tenant_id = e.tenant_id AND d.endpoint_id = e.id
            AND d.state = 'pending' AND d.next_attempt_at <= (SELECT clock.now FROM clock)
        ORDER BY d.next_attempt_at, d.id
        LIMIT sqlc.arg('per_tenant')::integer
        FOR UPDATE OF d SKIP LOCKED
    ) q
    WHERE e.enabled AND (
        SELECT min(w.next_attempt_at) FROM webhook_deliveries w WHERE w.state = 'pending'
    ) <= (SELECT clock.now FROM clock)
), due AS (
    SELECT t.id, t.next_attempt_at AS due_at, t.turn, t.served
    FROM (
        SELECT queued.id, queued.next_attempt_at,
            coalesce((sqlc.arg('served')::jsonb ->> queued.tenant_id)::bigint, 0)::bigint AS served,
            row_number() OVER (PARTITION BY queued.tenant_id
                ORDER BY queued.endpoint_turn, queued.next_attempt_at, queued.id) AS turn
        FROM queued
    ) t
    WHERE t.turn <= sqlc.arg('per_tenant')::integer
    ORDER BY t.turn, t.served, t.next_attempt_at, t.id
    LIMIT sqlc.arg('row_limit')::integer
), claimed AS (
    UPDATE webhook_deliveries d SET
        attempts = d.attempts + 1,
        last_attempt_at = (SELECT clock.now FROM clock),
        next_attempt_at = (SELECT clock.now FROM clock) + sqlc.arg('lease_us')::bigint * interval '1 microsecond'
    FROM due, webhook_endpoints e
    WHERE d.id = due.id AND e.tenant_id = d.tenant_id AND e.id = d.endpoint_id
    RETURNING d.id, d.tenant_id, d.endpoint_id, d.event_id, d.event_type, d.payload, d.state,
        d.attempts, d.next_attempt_at, d.created_at, d.last_attempt_at, d.last_status,
        d.last_error, d.delivered_at, e.url, e.secret, due.turn, due.served, due.due_at
)
SELECT c.id, c.tenant_id, c.endpoint_id, c.event_id, c.event_type, c.payload, c.state,
    c.attempts, c.next_attempt_at, c.created_at, c.last_attempt_at, c.last_status,
    c.last_error, c.delivered_at, c.url, c.secret, (SELECT clock.now FROM clock)::timestamptz AS observed_at
FROM claimed c
ORDER BY c.turn, c.served, c.due_at, c.id;

-- name: LockDeliveryEndpoint :one
-- LockDeliveryEndpoint locks a delivery's endpoint before the delivery is
-- updated. Deleting an endpoint or its tenant locks the endpoint, then its
-- deliveries (ON DELETE CASCADE); a transaction that locked a delivery and
-- then its endpoint could deadlock with it. No row: the delivery or its
-- endpoint is gone.
SELECT e.tenant_id, e.id
FROM webhook_endpoints e
JOIN webhook_deliveries d ON d.tenant_id = e.tenant_id AND d.endpoint_id = e.id
WHERE d.id = sqlc.arg('id')
FOR NO KEY UPDATE OF e;

-- name: FinishWebhookDelivery :one
-- FinishWebhookDelivery records an attempt's outcome, only if the row is
-- still held by that attempt (attempts unchanged). retry_us = 0 on failure
-- gives up.
WITH clock AS (
    SELECT coalesce(sqlc.narg('now')::timestamptz, now())::timestamptz AS now
)
UPDATE webhook_deliveries d SET
    state = CASE WHEN sqlc.arg('ok')::boolean THEN 'delivered'
        WHEN sqlc.arg('retry_us')::bigint > 0 THEN 'pending' ELSE 'failed' END,
    next_attempt_at = clock.now + sqlc.arg('retry_us')::bigint * interval '1 microsecond',
    last_status = sqlc.narg('last_status')::integer,
    last_error = sqlc.narg('last_error')::text,
    delivered_at = CASE WHEN sqlc.arg('ok')::boolean THEN clock.now ELSE NULL END
FROM clock
WHERE d.id = sqlc.arg('id') AND d.attempts = sqlc.arg('attempts')::integer AND d.state = 'pending'
RETURNING d.tenant_id, d.endpoint_id;

-- name: RecordEndpointSuccess :exec
UPDATE webhook_endpoints SET consecutive_failures = 0, failing_since = NULL
WHERE tenant_id = sqlc.arg('tenant_id') AND id = sqlc.arg('id') AND consecutive_failures > 0;

-- name: RecordEndpointFailure :one
-- RecordEndpointFailure extends the failure streak, and disables the
-- endpoint once the streak is both disable_after old and min_failures long.
WITH clock AS (
    SELECT coalesce(sqlc.narg('now')::timestamptz, now())::timestamptz AS now
)
UPDATE webhook_endpoints e SET
    consecutive_failures = e.consecutive_failures + 1,
    failing_since = coalesce(e.failing_since, clock.now),
    enabled = e.enabled AND NOT (e.consecutive_failures + 1 >= sqlc.arg('min_failures')::integer
        AND coalesce(e.failing_since, clock.now) <= clock.now - sqlc.arg('disable_after_us')::bigint * interval '1 microsecond'),
    disabled_reason = CASE WHEN e.enabled AND e.consecutive_failures + 1 >= sqlc.arg('min_failures')::integer
        AND coalesce(e.failing_since, clock.now) <= clock.now - sqlc.arg('disable_after_us')::bigint * interval '1 microsecond'
        THEN 'sustained_failure' ELSE e.disabled_reason END,
    updated_at = clock.now
FROM clock
WHERE e.tenant_id = sqlc.arg('tenant_id') AND e.id = sqlc.arg('id')
RETURNING e.enabled;

-- name: MarkOrphans :many
-- MarkOrphans sets orphan_event_token on at most row_limit orphans not yet
-- reported for their current token (from the partial orphan index), and
-- returns them. SKIP LOCKED: a row being claimed or marked elsewhere waits
-- for the next watch. The rows are updated by the addresses (ctid) the
-- locking scan returned, as ReapKeys deletes its batch.
WITH clock AS (
    SELECT coalesce(sqlc.narg('now')::timestamptz, now())::timestamptz AS now
)
UPDATE idempotency_keys k SET orphan_event_token = k.fencing_token
WHERE k.ctid = ANY (ARRAY(
    SELECT o.ctid
    FROM idempotency_keys o
    WHERE o.state = 'in_flight' AND o.lease_expires_at <= (SELECT clock.now FROM clock)
        AND o.orphan_event_token IS DISTINCT FROM o.fencing_token
        -- the completer's own takeovers are not new orphans (completer.go)
        AND o.completer_state IS NULL
    ORDER BY o.lease_expires_at
    LIMIT sqlc.arg('row_limit')::integer
    FOR UPDATE OF o SKIP LOCKED
))
RETURNING
    k.tenant_id, k.key, k.state, k.operation, k.fingerprint, k.fencing_token,
    k.attempt, k.lease_expires_at, k.recovery_point,
    k.replay_window_seconds, k.reaper_threshold_seconds, k.created_at,
    k.updated_at, k.completed_at, k.replay_until, k.purge_after,
    k.review_note, k.review_at,
    k.completer_state, k.completer_id, k.completer_attempts, k.completer_next_at, k.completer_deadline,
    (SELECT clock.now FROM clock)::timestamptz AS observed_at;

-- name: PurgeWebhookDeliveries :execrows
WITH clock AS (
    SELECT coalesce(sqlc.narg('now')::timestamptz, now())::timestamptz AS now
)
DELETE FROM webhook_deliveries d
WHERE d.id IN (
    SELECT x.id FROM webhook_deliveries x
    WHERE x.state <> 'pending'
        AND x.created_at <= (SELECT clock.now FROM clock) - sqlc.arg('older_than_us')::bigint * interval '1 microsecond'
    LIMIT sqlc.arg('row_limit')::integer
);
