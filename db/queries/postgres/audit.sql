-- name: InsertAudit :one
-- InsertAudit writes one audit entry of a resolution, inside the
-- resolution's transaction, at the same clock instant.
INSERT INTO key_audit (
    tenant_id, key, action, fencing_token, new_fencing_token, note,
    actor_subject, actor_tenant, actor_scope, created_at
) VALUES (
    sqlc.arg('tenant_id')::text, sqlc.arg('key')::text, sqlc.arg('action')::text,
    sqlc.arg('fencing_token')::bigint, sqlc.narg('new_fencing_token')::bigint,
    sqlc.arg('note')::text, sqlc.arg('actor_subject')::text,
    sqlc.arg('actor_tenant')::text, sqlc.arg('actor_scope')::text,
    sqlc.arg('created_at')::timestamptz
)
RETURNING *;

-- name: ListAudit :many
-- ListAudit lists audit entries newest first, for one key of a tenant, one
-- tenant, or ('') every tenant, with a keyset cursor on (created_at, id).
SELECT *
FROM key_audit a
WHERE (sqlc.arg('tenant_filter')::text = '' OR a.tenant_id = sqlc.arg('tenant_filter')::text)
    AND (sqlc.arg('key_filter')::text = '' OR a.key = sqlc.arg('key_filter')::text)
    -- the first page passes the cursor ('infinity', 0), as ListKeys
    AND (a.created_at, a.id) < (sqlc.arg('after_time')::timestamptz, sqlc.arg('after_id')::bigint)
ORDER BY a.created_at DESC, a.id DESC
LIMIT sqlc.arg('row_limit')::integer;
