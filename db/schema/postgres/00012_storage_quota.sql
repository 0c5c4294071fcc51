-- +goose Up

-- A tenant's stored bytes are bounded (storage_quota_bytes; idem.Settings):
-- a claim that would create a record while the tenant is at or over it is
-- refused. Existing tenants get the default.
ALTER TABLE tenants ADD COLUMN storage_quota_bytes bigint NOT NULL DEFAULT 1073741824;

-- stored_bytes is what the record counts against the quota
-- (idem.Record.StoredBytes): key, operation, fingerprint, recovery point and
-- data, response body and header names and values. stored_bytes_before is
-- its value before the last write of the row: PostgreSQL 15's RETURNING
-- shows only the new row, and the statement that changes stored_bytes adds
-- the difference to tenant_usage from what it returns (the old value read
-- anywhere else may be stale under concurrent writes of the row).
ALTER TABLE idempotency_keys
    ADD COLUMN stored_bytes bigint NOT NULL DEFAULT 0,
    ADD COLUMN stored_bytes_before bigint NOT NULL DEFAULT 0;

UPDATE idempotency_keys k SET stored_bytes =
    octet_length(k.key) + octet_length(k.operation) + octet_length(k.fingerprint)
    + coalesce(octet_length(k.recovery_point), 0) + coalesce(octet_length(k.recovery_data), 0)
    + coalesce(octet_length(k.response_body), 0)
    + coalesce((SELECT sum(octet_length(h.key) + octet_length(h.value))
        FROM jsonb_each_text(k.response_headers) h), 0),
    stored_bytes_before = 0;

-- tenant_usage holds each tenant's stored bytes as the sum of 64 counter
-- rows (slots 0-63): a write adds its difference to the slot of its
-- connection (pg_backend_pid() % 64), so concurrent writes of one tenant
-- rarely wait on one row lock, which a writer holds until its commit is
-- flushed (with eight slots, 16 clients of one tenant lost a third of
-- their pairs per second to those waits; docs/benchmarks.md). Only the
-- sum means anything; one slot may be negative. The rows are made with
-- the tenant and go with it.
CREATE TABLE tenant_usage (
    tenant_id    text     NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    slot         smallint NOT NULL,
    stored_bytes bigint   NOT NULL,
    PRIMARY KEY (tenant_id, slot)
);

INSERT INTO tenant_usage (tenant_id, slot, stored_bytes)
SELECT t.id, s.slot, CASE WHEN s.slot = 0
        THEN coalesce((SELECT sum(k.stored_bytes) FROM idempotency_keys k WHERE k.tenant_id = t.id), 0)
        ELSE 0 END
FROM tenants t, generate_series(0, 63) AS s(slot);

-- +goose StatementBegin
CREATE FUNCTION idem_tenant_usage_rows() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO tenant_usage (tenant_id, slot, stored_bytes)
    SELECT NEW.id, s.slot, 0 FROM generate_series(0, 63) AS s(slot);
    RETURN NULL;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER tenants_usage_rows AFTER INSERT ON tenants
    FOR EACH ROW EXECUTE FUNCTION idem_tenant_usage_rows();

-- Deletions (release, reap, an operator's release, a tenant's cascade) take
-- the records' bytes off their tenants in the deleting statement, once per
-- statement and tenant. They are off the claim and complete path, where
-- the statements count in themselves (ClaimKey, CheckpointKey, CompleteKey,
-- ResolveCompleteKey): a row trigger there costs every claim (migration
-- 00010). A tenant's cascade updates usage rows its own cascade then
-- deletes.
-- +goose StatementBegin
CREATE FUNCTION idem_uncount_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- A reaper's batch spans tenants: lock their counter rows in one order
    -- (tenant id), so two reapers sharing a slot cannot deadlock.
    PERFORM 1 FROM tenant_usage u
    WHERE u.slot = pg_backend_pid() % 64 AND u.tenant_id IN (SELECT d.tenant_id FROM deleted d)
    ORDER BY u.tenant_id
    FOR UPDATE;
    UPDATE tenant_usage u SET stored_bytes = u.stored_bytes - g.bytes
    FROM (SELECT d.tenant_id, sum(d.stored_bytes) AS bytes FROM deleted d GROUP BY d.tenant_id) g
    WHERE u.tenant_id = g.tenant_id AND u.slot = pg_backend_pid() % 64 AND g.bytes <> 0;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER idempotency_keys_uncount_deleted AFTER DELETE ON idempotency_keys
    REFERENCING OLD TABLE AS deleted
    FOR EACH STATEMENT EXECUTE FUNCTION idem_uncount_deleted();

-- +goose Down
DROP TRIGGER idempotency_keys_uncount_deleted ON idempotency_keys;
DROP FUNCTION idem_uncount_deleted();
DROP TRIGGER tenants_usage_rows ON tenants;
DROP FUNCTION idem_tenant_usage_rows();
DROP TABLE tenant_usage;
ALTER TABLE idempotency_keys DROP COLUMN stored_bytes_before, DROP COLUMN stored_bytes;
ALTER TABLE tenants DROP COLUMN storage_quota_bytes;
