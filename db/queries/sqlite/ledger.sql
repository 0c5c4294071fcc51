-- name: LedgerState :one
-- LedgerState reads the fencing token source (the counter row, at least
-- every token it handed out) and the rollbacks not yet acknowledged.
SELECT
    CAST((SELECT c.value FROM fencing_counter c WHERE c.id = 1) AS INTEGER) AS source_token,
    CAST((SELECT count(*) FROM ledger_rollbacks r WHERE r.acknowledged_at IS NULL) AS INTEGER) AS open_rollbacks,
    CAST((SELECT coalesce(max(r.seen_token), 0) FROM ledger_rollbacks r WHERE r.acknowledged_at IS NULL) AS INTEGER) AS open_seen_token;

-- name: InsertLedgerRollback :one
INSERT INTO ledger_rollbacks (detected_at, replica, seen_token, source_token)
VALUES (sqlc.arg(detected_at), sqlc.arg(replica), sqlc.arg(seen_token), sqlc.arg(source_token))
RETURNING *;

-- name: AdvanceFencingCounter :one
-- AdvanceFencingCounter moves the counter to at least at_least, so no
-- token handed out before a rollback is handed out again.
UPDATE fencing_counter SET value = max(value, sqlc.arg(at_least)) WHERE id = 1
RETURNING value;

-- name: AcknowledgeLedgerRollbacks :many
UPDATE ledger_rollbacks
SET acknowledged_at = sqlc.arg(acknowledged_at), acknowledged_by = sqlc.arg(acknowledged_by)
WHERE acknowledged_at IS NULL
RETURNING *;
