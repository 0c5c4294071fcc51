-- name: LedgerState :one
-- LedgerState reads the fencing token source and the rollbacks not yet
-- acknowledged. The sequence is not transactional: its last value counts
-- every nextval already returned, committed or not, so it is at least every
-- token any replica has seen (NULL before the first nextval: 0).
SELECT
    coalesce(pg_sequence_last_value('fencing_tokens'::regclass), 0)::bigint AS source_token,
    (SELECT count(*) FROM ledger_rollbacks r WHERE r.acknowledged_at IS NULL)::bigint AS open_rollbacks,
    (SELECT coalesce(max(r.seen_token), 0) FROM ledger_rollbacks r WHERE r.acknowledged_at IS NULL)::bigint AS open_seen_token;

-- name: InsertLedgerRollback :one
INSERT INTO ledger_rollbacks (detected_at, replica, seen_token, source_token)
VALUES (coalesce(sqlc.narg('detected_at')::timestamptz, now()), sqlc.arg('replica')::text,
        sqlc.arg('seen_token')::bigint, sqlc.arg('source_token')::bigint)
RETURNING *;

-- name: AdvanceFencingTokens :one
-- AdvanceFencingTokens moves the sequence to at least at_least, so no token
-- handed out before a rollback is handed out again.
SELECT setval('fencing_tokens'::regclass, GREATEST(
    coalesce(pg_sequence_last_value('fencing_tokens'::regclass), 0),
    sqlc.arg('at_least')::bigint, 1))::bigint AS source_token;

-- name: AcknowledgeLedgerRollbacks :many
UPDATE ledger_rollbacks
SET acknowledged_at = coalesce(sqlc.narg('acknowledged_at')::timestamptz, now()),
    acknowledged_by = sqlc.arg('acknowledged_by')::text
WHERE acknowledged_at IS NULL
RETURNING *;
