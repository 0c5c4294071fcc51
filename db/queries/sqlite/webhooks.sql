-- Queries of the webhook outbox on SQLite. Times are unix microseconds. The
-- store runs every write in the writer slot, inside one BEGIN IMMEDIATE
-- transaction where several statements belong together.

-- name: CreateWebhookEndpoint :one
-- CreateWebhookEndpoint adds an endpoint while the tenant has fewer than
-- max_endpoints; it returns no row at the bound. One statement under the
-- write lock, so concurrent creates cannot pass the bound.
INSERT INTO webhook_endpoints (tenant_id, id, url, secret, events, enabled, created_at, updated_at)
SELECT sqlc.arg(tenant_id), sqlc.arg(id), sqlc.arg(url), sqlc.arg(secret), sqlc.arg(events),
    sqlc.arg(enabled), sqlc.arg(now), sqlc.arg(now)
WHERE (SELECT count(*) FROM webhook_endpoints e WHERE e.tenant_id = sqlc.arg(tenant_id)) < CAST(sqlc.arg(max_endpoints) AS INTEGER)
RETURNING *;

-- name: GetWebhookEndpoint :one
SELECT * FROM webhook_endpoints
WHERE tenant_id = sqlc.arg(tenant_id) AND id = sqlc.arg(id);

-- name: ListWebhookEndpoints :many
SELECT * FROM webhook_endpoints
WHERE tenant_id = sqlc.arg(tenant_id)
ORDER BY created_at, id;

-- name: UpdateWebhookEndpoint :one
-- UpdateWebhookEndpoint replaces url, filter and enabled flag; enabling an
-- endpoint clears its failure streak and the reason it was disabled.
UPDATE webhook_endpoints SET
    url = sqlc.arg(url),
    events = sqlc.arg(events),
    disabled_reason = CASE WHEN CAST(sqlc.arg(enabled) AS INTEGER) THEN NULL ELSE disabled_reason END,
    consecutive_failures = CASE WHEN CAST(sqlc.arg(enabled) AS INTEGER) AND NOT enabled THEN 0 ELSE consecutive_failures END,
    failing_since = CASE WHEN CAST(sqlc.arg(enabled) AS INTEGER) AND NOT enabled THEN NULL ELSE failing_since END,
    enabled = CAST(sqlc.arg(enabled) AS INTEGER),
    updated_at = sqlc.arg(now)
WHERE tenant_id = sqlc.arg(tenant_id) AND id = sqlc.arg(id)
RETURNING *;

-- name: DeleteWebhookEndpoint :execrows
DELETE FROM webhook_endpoints
WHERE tenant_id = sqlc.arg(tenant_id) AND id = sqlc.arg(id);

-- name: EnqueueEvent :execrows
-- EnqueueEvent fans one event out to every enabled endpoint of the tenant
-- whose filter takes its type: one outbox row each, due at once.
INSERT INTO webhook_deliveries (tenant_id, endpoint_id, event_id, event_type, payload, next_attempt_at, created_at)
SELECT e.tenant_id, e.id, CAST(sqlc.arg(event_id) AS TEXT), CAST(sqlc.arg(event_type) AS TEXT),
    CAST(sqlc.arg(payload) AS BLOB), CAST(sqlc.arg(now) AS INTEGER), CAST(sqlc.arg(now) AS INTEGER)
FROM webhook_endpoints e
WHERE e.tenant_id = sqlc.arg(tenant_id) AND e.enabled
    AND (e.events = '' OR (',' || e.events || ',') LIKE ('%,' || CAST(sqlc.arg(event_type) AS TEXT) || ',%'));

-- name: EnqueueTestEvent :one
-- EnqueueTestEvent queues an event for one enabled endpoint, whatever its
-- filter.
INSERT INTO webhook_deliveries (tenant_id, endpoint_id, event_id, event_type, payload, next_attempt_at, created_at)
SELECT e.tenant_id, e.id, CAST(sqlc.arg(event_id) AS TEXT), CAST(sqlc.arg(event_type) AS TEXT),
    CAST(sqlc.arg(payload) AS BLOB), CAST(sqlc.arg(now) AS INTEGER), CAST(sqlc.arg(now) AS INTEGER)
FROM webhook_endpoints e
WHERE e.tenant_id = sqlc.arg(tenant_id) AND e.id = sqlc.arg(endpoint_id) AND e.enabled
RETURNING *;

-- name: ListWebhookDeliveries :many
SELECT id, tenant_id, endpoint_id, event_id, event_type, state, attempts,
    next_attempt_at, created_at, last_attempt_at, last_status, last_error, delivered_at
FROM webhook_deliveries
WHERE tenant_id = sqlc.arg(tenant_id) AND endpoint_id = sqlc.arg(endpoint_id)
    AND (CAST(sqlc.arg(before_id) AS INTEGER) = 0 OR id < CAST(sqlc.arg(before_id) AS INTEGER))
ORDER BY id DESC
LIMIT sqlc.arg(row_limit);

-- name: DueWebhookDeliveries :many
-- DueWebhookDeliveries lists due pending deliveries of enabled endpoints,
-- with the endpoint's URL and secret. One tenant gives at most per_tenant
-- deliveries, spread over its endpoints in turns (each endpoint's oldest
-- due from its webhook_deliveries_endpoint_due queue, then each one's
-- second, ...), and the tenants are taken in turns too: every tenant's
-- first, then every tenant's second, each turn oldest first, up to
-- row_limit, so one tenant's backlog cannot fill a claim; within a turn
-- least recently served first (served: a JSON object of "t" and the
-- tenant id's hex(), a path label whatever the id holds, to when the
-- caller last took one of its deliveries, larger is more recent; a tenant
-- not in it first), then oldest first (PostgreSQL's
-- ClaimWebhookDeliveries). When nothing at all is due (the first entry of
-- the due index says so), the endpoints are not walked.
SELECT d.id, d.tenant_id, d.endpoint_id, d.event_id, d.event_type, d.payload, d.state,
    d.attempts, d.next_attempt_at, d.created_at, d.last_attempt_at, d.last_status,
    d.last_error, d.delivered_at, e.url, e.secret
FROM (
    SELECT t.id, t.turn, t.served
    FROM (
        SELECT queued.id,
            coalesce(json_extract(CAST(sqlc.arg(served) AS TEXT), '$.t' || hex(queued.tenant_id)), 0) AS served,
            row_number() OVER (PARTITION BY queued.tenant_id
                ORDER BY queued.endpoint_turn, queued.next_attempt_at, queued.id) AS turn
        FROM (
            SELECT q.id, q.tenant_id, q.next_attempt_at,
                row_number() OVER (PARTITION BY q.tenant_id, q.endpoint_id ORDER BY q.next_attempt_at, q.id) AS endpoint_turn
            FROM webhook_endpoints p
            JOIN webhook_deliveries q ON q.id IN (
                SELECT x.id FROM webhook_deliveries x
                WHERE x.tenant_id = p.tenant_id AND x.endpoint_id = p.id
                    AND x.state = 'pending' AND x.next_attempt_at <= CAST(sqlc.arg(now) AS INTEGER)
                ORDER BY x.next_attempt_at, x.id
                LIMIT CAST(sqlc.arg(per_tenant) AS INTEGER)
            )
            WHERE p.enabled AND (
                SELECT min(w.next_attempt_at) FROM webhook_deliveries w WHERE w.state = 'pending'
            ) <= CAST(sqlc.arg(now) AS INTEGER)
        ) queued
    ) t
    WHERE t.turn <= CAST(sqlc.arg(per_tenant) AS INTEGER)
) due
JOIN webhook_deliveries d ON d.id = due.id
JOIN webhook_endpoints e ON e.tenant_id = d.tenant_id AND e.id = d.endpoint_id
ORDER BY due.turn, due.served, d.next_attempt_at, d.id
LIMIT CAST(sqlc.arg(row_limit) AS INTEGER);

-- name: LeaseWebhookDelivery :exec
-- LeaseWebhookDelivery counts an attempt and moves the delivery's next
-- attempt to the end of the claim's lease.
UPDATE webhook_deliveries SET
    attempts = attempts + 1,
    last_attempt_at = sqlc.arg(now),
    next_attempt_at = sqlc.arg(lease_until)
WHERE id = sqlc.arg(id);

-- name: FinishWebhookDelivery :one
-- FinishWebhookDelivery records an attempt's outcome, only if the row is
-- still held by that attempt (attempts unchanged).
UPDATE webhook_deliveries SET
    state = sqlc.arg(state),
    next_attempt_at = sqlc.arg(next_attempt_at),
    last_status = sqlc.narg(last_status),
    last_error = sqlc.narg(last_error),
    delivered_at = sqlc.narg(delivered_at)
WHERE id = sqlc.arg(id) AND attempts = sqlc.arg(attempts) AND state = 'pending'
RETURNING tenant_id, endpoint_id;

-- name: RecordEndpointSuccess :exec
UPDATE webhook_endpoints SET consecutive_failures = 0, failing_since = NULL
WHERE tenant_id = sqlc.arg(tenant_id) AND id = sqlc.arg(id) AND consecutive_failures > 0;

-- name: RecordEndpointFailure :one
-- RecordEndpointFailure extends the failure streak, and disables the
-- endpoint once the streak is both old enough (failing_since at or before
-- disable_before) and min_failures long.
UPDATE webhook_endpoints SET
    consecutive_failures = consecutive_failures + 1,
    failing_since = coalesce(failing_since, sqlc.arg(now)),
    enabled = enabled AND NOT (consecutive_failures + 1 >= sqlc.arg(min_failures)
        AND coalesce(failing_since, sqlc.arg(now)) <= sqlc.arg(disable_before)),
    disabled_reason = CASE WHEN enabled AND consecutive_failures + 1 >= sqlc.arg(min_failures)
        AND coalesce(failing_since, sqlc.arg(now)) <= sqlc.arg(disable_before)
        THEN 'sustained_failure' ELSE disabled_reason END,
    updated_at = sqlc.arg(now)
WHERE tenant_id = sqlc.arg(tenant_id) AND id = sqlc.arg(id)
RETURNING enabled;

-- name: OrphansToReport :many
-- OrphansToReport lists orphans not yet reported for their current token,
-- oldest lease first, from the partial index of in-flight leases.
SELECT tenant_id, key, state, operation, fingerprint, fencing_token, attempt,
       lease_expires_at, recovery_point,
       replay_window_seconds, reaper_threshold_seconds,
       created_at, updated_at, completed_at, replay_until, purge_after,
       review_note, review_at,
       completer_state, completer_id, completer_attempts, completer_next_at, completer_deadline
FROM idempotency_keys
WHERE state = 'in_flight' AND lease_expires_at <= CAST(sqlc.arg(now) AS INTEGER)
    AND orphan_event_token IS NOT fencing_token
    -- the completer's own takeovers are not new orphans (completer.go)
    AND completer_state IS NULL
ORDER BY lease_expires_at
LIMIT sqlc.arg(row_limit);

-- name: MarkOrphanReported :exec
UPDATE idempotency_keys SET orphan_event_token = fencing_token
WHERE tenant_id = sqlc.arg(tenant_id) AND key = sqlc.arg(key);

-- name: PurgeWebhookDeliveries :execrows
DELETE FROM webhook_deliveries
WHERE id IN (
    SELECT x.id FROM webhook_deliveries x
    WHERE x.state <> 'pending' AND x.created_at <= sqlc.arg(before)
    LIMIT sqlc.arg(row_limit)
);
