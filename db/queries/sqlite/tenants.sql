-- name: CreateTenant :one
-- CreateTenant takes UpdateTenant's arguments, in the same order (id last),
-- so the store builds them once (tenantArgs); a tenant created disabled is
-- disabled from its creation.
INSERT INTO tenants (
    name, replay_window_seconds, reaper_threshold_seconds,
    lease_seconds_default, lease_seconds_max, max_response_bytes,
    rate_limit_per_second, max_wait_seconds, storage_quota_bytes, retry_budget_percent,
    disabled_at, created_at, updated_at, id
) VALUES (
    sqlc.arg(name), sqlc.arg(replay_window_seconds), sqlc.arg(reaper_threshold_seconds),
    sqlc.arg(lease_seconds_default), sqlc.arg(lease_seconds_max), sqlc.arg(max_response_bytes),
    sqlc.arg(rate_limit_per_second), sqlc.arg(max_wait_seconds), sqlc.arg(storage_quota_bytes), sqlc.arg(retry_budget_percent),
    CASE WHEN CAST(sqlc.arg(disabled) AS INTEGER) != 0 THEN sqlc.arg(now) ELSE NULL END, sqlc.arg(now), sqlc.arg(now), sqlc.arg(id)
)
RETURNING *;

-- name: GetTenant :one
-- GetTenant and ListTenants add the tenant's usage (TenantStoredBytes).
SELECT sqlc.embed(tenants), CAST((SELECT coalesce(sum(u.stored_bytes), 0) FROM tenant_usage u WHERE u.tenant_id = tenants.id) AS INTEGER) AS stored_bytes
FROM tenants WHERE id = sqlc.arg(id);

-- name: ListTenants :many
SELECT sqlc.embed(tenants), CAST((SELECT coalesce(sum(u.stored_bytes), 0) FROM tenant_usage u WHERE u.tenant_id = tenants.id) AS INTEGER) AS stored_bytes
FROM tenants ORDER BY id;

-- name: UpdateTenant :one
-- UpdateTenant keeps the first disabled_at while the tenant stays disabled.
UPDATE tenants SET
    name = sqlc.arg(name),
    replay_window_seconds = sqlc.arg(replay_window_seconds),
    reaper_threshold_seconds = sqlc.arg(reaper_threshold_seconds),
    lease_seconds_default = sqlc.arg(lease_seconds_default),
    lease_seconds_max = sqlc.arg(lease_seconds_max),
    max_response_bytes = sqlc.arg(max_response_bytes),
    rate_limit_per_second = sqlc.arg(rate_limit_per_second),
    max_wait_seconds = sqlc.arg(max_wait_seconds),
    storage_quota_bytes = sqlc.arg(storage_quota_bytes),
    retry_budget_percent = sqlc.arg(retry_budget_percent),
    disabled_at = CASE WHEN CAST(sqlc.arg(disabled) AS INTEGER) != 0 THEN COALESCE(disabled_at, sqlc.arg(now)) ELSE NULL END,
    updated_at = sqlc.arg(now)
WHERE id = sqlc.arg(id)
RETURNING *;

-- name: DeleteTenant :execrows
-- DeleteTenant deletes a tenant; ON DELETE CASCADE deletes its records in
-- the same statement.
DELETE FROM tenants WHERE id = sqlc.arg(id);
