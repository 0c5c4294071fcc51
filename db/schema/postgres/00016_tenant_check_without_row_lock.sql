-- +goose Up

-- The foreign key from idempotency_keys to tenants took a FOR KEY SHARE
-- lock on the tenant's row for every record a claim inserted: with
-- concurrent claims of one tenant a MultiXact, two more WAL records per
-- claim and the tenant's page dirtied (docs/benchmarks.md, issue 23 goal
-- 4). What it guaranteed stays, kept by the two sides instead:
--   * a claim inserts a record only while its snapshot holds the tenant,
--     not being deleted (ClaimKey reads the row, no lock): a record never
--     precedes its tenant;
--   * deleting a tenant (Store.DeleteTenant) first sets deleting_at, so
--     no claim whose snapshot is taken after that creates a record,
--     deletes the records in batches, and then in one transaction locks
--     the tenant's row, takes SHARE ROW EXCLUSIVE on idempotency_keys
--     (it waits for every write in progress, the claims that read the
--     tenant before deleting_at included, and holds new ones back until
--     it commits; a claim takes its snapshot after its lock), deletes what
--     is left and the tenant's row: a record never outlives its tenant.
-- A tenant with deleting_at set is gone for every other call: not found,
-- and its id not free again until the deletion has finished.
ALTER TABLE tenants ADD COLUMN deleting_at timestamptz;
ALTER TABLE idempotency_keys DROP CONSTRAINT idempotency_keys_tenant_id_fkey;

-- +goose Down
DELETE FROM idempotency_keys k WHERE NOT EXISTS (SELECT 1 FROM tenants t WHERE t.id = k.tenant_id);
ALTER TABLE idempotency_keys ADD CONSTRAINT idempotency_keys_tenant_id_fkey
    FOREIGN KEY (tenant_id) REFERENCES tenants (id) ON DELETE CASCADE;
ALTER TABLE tenants DROP COLUMN deleting_at;
