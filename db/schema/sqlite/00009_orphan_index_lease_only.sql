-- +goose Up

-- The same index as PostgreSQL's 00009: the orphan index keyed by
-- lease_expires_at alone, so no statement that addresses one record by
-- (tenant_id, key) can be planned on it (SQLite chose the primary key here,
-- but the two stores keep one schema shape), and it stays small.
DROP INDEX idempotency_keys_orphans_idx;
CREATE INDEX idempotency_keys_orphans_idx ON idempotency_keys (lease_expires_at)
    WHERE state = 'in_flight';

-- +goose Down
DROP INDEX idempotency_keys_orphans_idx;
CREATE INDEX idempotency_keys_orphans_idx ON idempotency_keys (lease_expires_at, tenant_id, key)
    WHERE state = 'in_flight';
