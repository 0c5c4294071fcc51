-- name: CreateTenant :one
WITH clock AS (
    SELECT coalesce(sqlc.narg('now')::timestamptz, now())::timestamptz AS now
)
INSERT INTO tenants (
    id, name, replay_window_seconds, reaper_threshold_seconds,
    lease_seconds_default, lease_seconds_max, max_response_bytes,
    rate_limit_per_second, max_wait_seconds, storage_quota_bytes, retry_budget_percent, created_at, updated_at
)
SELECT
    sqlc.arg('id')::text, sqlc.arg('name')::text,
    sqlc.arg('replay_window_seconds')::integer, sqlc.arg('reaper_threshold_seconds')::integer,
    sqlc.arg('lease_seconds_default')::integer, sqlc.arg('lease_seconds_max')::integer,
    sqlc.arg('max_response_bytes')::integer, sqlc.arg('rate_limit_per_second')::integer,
    sqlc.arg('max_wait_seconds')::integer, sqlc.arg('storage_quota_bytes')::bigint,
    sqlc.arg('retry_budget_percent')::integer, clock.now, clock.now
FROM clock
RETURNING *;

-- name: GetTenant :one
-- GetTenant and ListTenants add the tenant's usage (TenantStoredBytes).
SELECT sqlc.embed(t),
    (SELECT coalesce(sum(u.stored_bytes), 0) FROM tenant_usage u WHERE u.tenant_id = t.id)::bigint AS stored_bytes
FROM tenants t WHERE t.id = sqlc.arg('id');

-- name: ListTenants :many
SELECT sqlc.embed(t),
    (SELECT coalesce(sum(u.stored_bytes), 0) FROM tenant_usage u WHERE u.tenant_id = t.id)::bigint AS stored_bytes
FROM tenants t ORDER BY t.id;

-- name: UpdateTenant :one
-- UpdateTenant replaces name, settings and the disabled flag; disabled_at
-- keeps the instant the tenant was first disabled.
WITH clock AS (
    SELECT coalesce(sqlc.narg('now')::timestamptz, now())::timestamptz AS now
)
UPDATE tenants t SET
    name = sqlc.arg('name')::text,
    replay_window_seconds = sqlc.arg('replay_window_seconds')::integer,
    reaper_threshold_seconds = sqlc.arg('reaper_threshold_seconds')::integer,
    lease_seconds_default = sqlc.arg('lease_seconds_default')::integer,
    lease_seconds_max = sqlc.arg('lease_seconds_max')::integer,
    max_response_bytes = sqlc.arg('max_response_bytes')::integer,
    rate_limit_per_second = sqlc.arg('rate_limit_per_second')::integer,
    max_wait_seconds = sqlc.arg('max_wait_seconds')::integer,
    storage_quota_bytes = sqlc.arg('storage_quota_bytes')::bigint,
    retry_budget_percent = sqlc.arg('retry_budget_percent')::integer,
    disabled_at = CASE WHEN sqlc.arg('disabled')::boolean
        THEN coalesce(t.disabled_at, clock.now) ELSE NULL END,
    updated_at = clock.now
FROM clock
WHERE t.id = sqlc.arg('id')
RETURNING sqlc.embed(t),
    (SELECT coalesce(sum(u.stored_bytes), 0) FROM tenant_usage u WHERE u.tenant_id = t.id)::bigint AS stored_bytes;

-- name: DeleteTenant :execrows
-- DeleteTenant deletes a tenant; ON DELETE CASCADE deletes its records in
-- the same statement.
DELETE FROM tenants WHERE id = sqlc.arg('id');
