-- name: InsertAudit :one
-- InsertAudit writes one audit entry of a resolution, inside the
-- resolution's transaction, at the same clock instant.
INSERT INTO key_audit (
    tenant_id, key, action, fencing_token, new_fencing_token, note,
    actor_subject, actor_tenant, actor_scope, created_at
) VALUES (
    sqlc.arg(tenant_id), sqlc.arg(key), sqlc.arg(action), sqlc.arg(fencing_token),
    sqlc.narg(new_fencing_token), sqlc.arg(note), sqlc.arg(actor_subject),
    sqlc.arg(actor_tenant), sqlc.arg(actor_scope), sqlc.arg(created_at)
)
RETURNING *;

-- name: ListAudit :many
-- ListAudit lists audit entries newest first, for one key of a tenant, one
-- tenant, or ('') every tenant. The keyset cursor on (created_at, id) is
-- always present (the first page passes the largest possible position).
SELECT *
FROM key_audit
WHERE (CAST(sqlc.arg(tenant_filter) AS TEXT) = '' OR tenant_id = sqlc.arg(tenant_filter))
  AND (CAST(sqlc.arg(key_filter) AS TEXT) = '' OR key = sqlc.arg(key_filter))
  AND (created_at, id) < (CAST(sqlc.arg(after_time) AS INTEGER), CAST(sqlc.arg(after_id) AS INTEGER))
ORDER BY created_at DESC, id DESC
LIMIT sqlc.arg(row_limit);
