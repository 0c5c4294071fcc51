-- +goose Up

-- The orphan index of 00001 held (lease_expires_at, tenant_id, key). Because
-- it also held tenant_id and key and its predicate matched their
-- "state = 'in_flight'", the generic plans of the statements that address
-- one record (complete, checkpoint, release, renew, review, mark waited)
-- chose it over the primary key: an index scan with tenant_id and key as
-- non-leading conditions, that is a walk over every entry of the index,
-- including the dead entries completed records leave until vacuum. Each
-- complete cost O(records in flight + not yet vacuumed), and the ledger's
-- write rate fell to a quarter of a minimal ledger's (docs/benchmarks.md).
-- Keyed by lease_expires_at alone the index still serves the orphan watch,
-- the orphan listing and the stats (tenant_id and key come from the heap,
-- for orphans only), and no single-record statement can use it.
-- Rebuilding takes a SHARE lock on idempotency_keys (writes wait) for one
-- scan of the table; run it in a quiet moment on a large ledger.
DROP INDEX idempotency_keys_orphans_idx;
CREATE INDEX idempotency_keys_orphans_idx ON idempotency_keys (lease_expires_at)
    WHERE state = 'in_flight';

-- +goose Down
DROP INDEX idempotency_keys_orphans_idx;
CREATE INDEX idempotency_keys_orphans_idx ON idempotency_keys (lease_expires_at, tenant_id, key)
    WHERE state = 'in_flight';
