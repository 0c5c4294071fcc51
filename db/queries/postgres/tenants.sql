-- name: CreateTenant :one
-- CreateTenant takes UpdateTenant's arguments, in the same order (id after
-- the disabled flag), so the store builds them once (tenantArgs); a tenant
-- created disabled is disabled from its creation.
WITH clock AS (
    SELECT coalesce(sqlc.narg('now')::timestamptz, now())::timestamptz AS now
)
INSERT INTO tenants (
    name, replay_window_seconds, reaper_threshold_seconds,
    lease_seconds_default, lease_seconds_max, max_response_bytes,
    rate_limit_per_second, max_wait_seconds, storage_quota_bytes, retry_budget_percent,
    disabled_at, id, created_at, updated_at
)
SELECT
    sqlc.arg('name')::text,
    sqlc.arg('replay_window_seconds')::integer, sqlc.arg('reaper_threshold_seconds')::integer,
    sqlc.arg('lease_seconds_default')::integer, sqlc.arg('lease_seconds_max')::integer,
    sqlc.arg('max_response_bytes')::integer, sqlc.arg('rate_limit_per_second')::integer,
    sqlc.arg('max_wait_seconds')::integer, sqlc.arg('storage_quota_bytes')::bigint,
    sqlc.arg('retry_budget_percent')::integer,
    CASE WHEN sqlc.arg('disabled')::boolean THEN clock.now END,
    sqlc.arg('id')::text, clock.now, clock.now
FROM clock
RETURNING *;

-- name: GetTenant :one
-- GetTenant and ListTenants add the tenant's usage (TenantStoredBytes). A
-- tenant being deleted (deleting_at, migration 00016) is gone for them and
-- for every other statement but the deletion's.
SELECT sqlc.embed(t),
    (SELECT coalesce(sum(u.stored_bytes), 0) FROM tenant_usage u WHERE u.tenant_id = t.id)::bigint AS stored_bytes
FROM tenants t WHERE t.id = sqlc.arg('id') AND t.deleting_at IS NULL;

-- name: ListTenants :many
SELECT sqlc.embed(t),
    (SELECT coalesce(sum(u.stored_bytes), 0) FROM tenant_usage u WHERE u.tenant_id = t.id)::bigint AS stored_bytes
FROM tenants t WHERE t.deleting_at IS NULL ORDER BY t.id;

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
WHERE t.id = sqlc.arg('id') AND t.deleting_at IS NULL
RETURNING sqlc.embed(t),
    (SELECT coalesce(sum(u.stored_bytes), 0) FROM tenant_usage u WHERE u.tenant_id = t.id)::bigint AS stored_bytes;

-- name: MarkTenantDeleting :execrows
-- MarkTenantDeleting starts a tenant's deletion (migration 00016): from its
-- commit on, no claim creates a record of the tenant and every other call
-- finds it gone. A deletion that stopped half-way is taken up again.
UPDATE tenants SET deleting_at = coalesce(deleting_at, now()) WHERE id = sqlc.arg('id');

-- name: DeleteTenantKeys :execrows
-- DeleteTenantKeys deletes a batch of a tenant's records, through the
-- primary key's prefix, while the tenant is being deleted.
DELETE FROM idempotency_keys k
WHERE k.tenant_id = sqlc.arg('tenant_id') AND k.key IN (
    SELECT e.key FROM idempotency_keys e WHERE e.tenant_id = sqlc.arg('tenant_id')
    LIMIT sqlc.arg('row_limit')::integer);

-- name: LockTenantForDelete :one
-- LockTenantForDelete locks the row of a tenant being deleted, before any
-- of its records (the order every transaction that locks both keeps).
SELECT t.id FROM tenants t WHERE t.id = sqlc.arg('id') AND t.deleting_at IS NOT NULL FOR UPDATE;

-- name: DeleteTenantRest :execrows
-- DeleteTenantRest deletes the records a deletion's batches left: those of
-- the claims that read the tenant before deleting_at. The caller holds
-- LockTenantForDelete and SHARE ROW EXCLUSIVE on idempotency_keys, so no
-- other write of a record runs and this statement's snapshot, taken after
-- the lock, holds every record committed.
DELETE FROM idempotency_keys WHERE tenant_id = sqlc.arg('id');

-- name: DeleteTenant :execrows
-- DeleteTenant deletes the tenant's row, after DeleteTenantRest in the
-- same transaction; ON DELETE CASCADE takes its usage rows, audit entries,
-- endpoints and their deliveries.
DELETE FROM tenants WHERE id = sqlc.arg('id');

-- name: TenantLive :one
-- TenantLive reports whether a claim may create a record of the tenant: it
-- exists and is not being deleted.
SELECT EXISTS (SELECT 1 FROM tenants t WHERE t.id = sqlc.arg('id') AND t.deleting_at IS NULL) AS live;

-- name: LockKeysForTenantDelete :exec
-- LockKeysForTenantDelete waits for every write of a record in progress
-- and holds new ones back until the deletion's transaction ends (SHARE ROW
-- EXCLUSIVE conflicts with the ROW EXCLUSIVE every write takes before its
-- snapshot; reads go on).
LOCK TABLE idempotency_keys IN SHARE ROW EXCLUSIVE MODE;
