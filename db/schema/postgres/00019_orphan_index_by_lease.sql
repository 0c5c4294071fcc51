-- +goose Up

-- The orphan index of 00009, (lease_expires_at) WHERE state = 'in_flight',
-- could still serve every statement that addresses one in-flight record:
-- "state = 'in_flight'" in complete, checkpoint, release, renew, resolve,
-- review and mark waited proves its predicate. On a ledger whose
-- statistics hold no record in flight, as ANALYZE finds a busy ledger (a
-- record is in flight for the milliseconds of its work), the planner
-- estimates the index empty, and those statements' generic plans walked it
-- whole with tenant_id and key as a filter: every complete read every
-- record in flight and every dead entry the completes since the last
-- vacuum left (TestGenericPlans/NoneInFlight; docs/benchmarks.md). Keyed
-- and filtered by the lease alone, the index serves only a statement that
-- bounds the lease (lease_expires_at <= now proves IS NOT NULL): the
-- orphan watch, the orphan listing and stats, the completer's pick. It
-- holds the same rows (a record is in flight exactly while it has a
-- lease: a complete clears it), so those statements, which also test the
-- state, read what they read before. SQLite picks the primary key for an
-- equality on it whatever a partial index holds: nothing to change there.
-- Rebuilding takes a SHARE lock on idempotency_keys (writes wait) for one
-- scan of the table, as 00009 did; run it in a quiet moment on a large
-- ledger.
DROP INDEX idempotency_keys_orphans_idx;
CREATE INDEX idempotency_keys_orphans_idx ON idempotency_keys (lease_expires_at)
    WHERE lease_expires_at IS NOT NULL;

-- +goose Down
DROP INDEX idempotency_keys_orphans_idx;
CREATE INDEX idempotency_keys_orphans_idx ON idempotency_keys (lease_expires_at)
    WHERE state = 'in_flight';
