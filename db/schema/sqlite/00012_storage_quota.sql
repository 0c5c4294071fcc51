-- +goose Up

-- A tenant's stored bytes are bounded (storage_quota_bytes; idem.Settings):
-- a claim that would create a record while the tenant is at or over it is
-- refused. Existing tenants get the default.
ALTER TABLE tenants ADD COLUMN storage_quota_bytes INTEGER NOT NULL DEFAULT 1073741824;

-- stored_bytes is what the record counts against the quota
-- (idem.Record.StoredBytes): key, operation, fingerprint, recovery point and
-- data, response body and header names and values. Every write that
-- changes it sets it (computed in Go); the triggers below keep the
-- tenant's sum in tenant_usage in the same transaction.
ALTER TABLE idempotency_keys ADD COLUMN stored_bytes INTEGER NOT NULL DEFAULT 0;

UPDATE idempotency_keys SET stored_bytes =
    length(CAST(key AS BLOB)) + length(CAST(operation AS BLOB)) + length(CAST(fingerprint AS BLOB))
    + coalesce(length(CAST(recovery_point AS BLOB)), 0) + coalesce(length(CAST(recovery_data AS BLOB)), 0)
    + coalesce(length(CAST(response_body AS BLOB)), 0)
    + coalesce((SELECT sum(length(CAST(h.key AS BLOB)) + length(CAST(h.value AS BLOB)))
        FROM json_each(response_headers) h), 0);

-- tenant_usage has the shape of PostgreSQL's, whose eight slots spread
-- concurrent writers; SQLite has one writer at a time and one slot (0).
CREATE TABLE tenant_usage (
    tenant_id    TEXT    NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    slot         INTEGER NOT NULL,
    stored_bytes INTEGER NOT NULL,
    PRIMARY KEY (tenant_id, slot)
);

INSERT INTO tenant_usage (tenant_id, slot, stored_bytes)
SELECT t.id, 0, coalesce((SELECT sum(k.stored_bytes) FROM idempotency_keys k WHERE k.tenant_id = t.id), 0)
FROM tenants t;

-- +goose StatementBegin
CREATE TRIGGER tenants_usage_rows AFTER INSERT ON tenants
BEGIN
    INSERT INTO tenant_usage (tenant_id, slot, stored_bytes) VALUES (NEW.id, 0, 0);
END;
-- +goose StatementEnd

-- SQLite compiles a trigger into the statement when it is prepared, so
-- counting in triggers costs the hot path little, unlike PostgreSQL's
-- (whose store counts in its statements); they also catch every deletion
-- (release, reap, a tenant's cascade).
-- +goose StatementBegin
CREATE TRIGGER idempotency_keys_count_insert AFTER INSERT ON idempotency_keys
WHEN NEW.stored_bytes <> 0
BEGIN
    UPDATE tenant_usage SET stored_bytes = stored_bytes + NEW.stored_bytes
    WHERE tenant_id = NEW.tenant_id AND slot = 0;
END;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE TRIGGER idempotency_keys_count_update AFTER UPDATE OF stored_bytes ON idempotency_keys
WHEN NEW.stored_bytes <> OLD.stored_bytes
BEGIN
    UPDATE tenant_usage SET stored_bytes = stored_bytes + NEW.stored_bytes - OLD.stored_bytes
    WHERE tenant_id = NEW.tenant_id AND slot = 0;
END;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE TRIGGER idempotency_keys_count_delete AFTER DELETE ON idempotency_keys
WHEN OLD.stored_bytes <> 0
BEGIN
    UPDATE tenant_usage SET stored_bytes = stored_bytes - OLD.stored_bytes
    WHERE tenant_id = OLD.tenant_id AND slot = 0;
END;
-- +goose StatementEnd

-- +goose Down
DROP TRIGGER idempotency_keys_count_delete;
DROP TRIGGER idempotency_keys_count_update;
DROP TRIGGER idempotency_keys_count_insert;
DROP TRIGGER tenants_usage_rows;
DROP TABLE tenant_usage;
ALTER TABLE idempotency_keys DROP COLUMN stored_bytes;
ALTER TABLE tenants DROP COLUMN storage_quota_bytes;
