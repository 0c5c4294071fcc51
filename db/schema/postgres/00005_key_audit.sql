-- +goose Up

-- The review flag a person set on an in-flight record (a resolution with
-- action review): the note and the database clock when it was set. A
-- release deletes the row; a completion, by a worker or a person, clears it.
ALTER TABLE idempotency_keys ADD COLUMN review_note text;
ALTER TABLE idempotency_keys ADD COLUMN review_at timestamptz;

-- key_audit is the audit log of resolutions (release, complete, review by
-- a tenant admin or an operator). An entry is written in the same
-- transaction as the change it records, outlives the record (a release
-- deletes it) and goes with its tenant. id comes from an identity column:
-- unique and increasing in the order entries were inserted.
CREATE TABLE key_audit (
    id                 bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id          text        NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    key                text        NOT NULL,
    action             text        NOT NULL CHECK (action IN ('release', 'complete', 'review')),
    fencing_token      bigint      NOT NULL,
    -- the token a completion handed the record; NULL for the other actions
    new_fencing_token  bigint,
    note               text        NOT NULL,
    actor_subject      text        NOT NULL,
    actor_tenant       text        NOT NULL,
    actor_scope        text        NOT NULL,
    created_at         timestamptz NOT NULL
);

-- The listings, newest first with a keyset cursor: per tenant, per key,
-- and across tenants.
CREATE INDEX key_audit_tenant_idx ON key_audit (tenant_id, created_at DESC, id DESC);
CREATE INDEX key_audit_key_idx ON key_audit (tenant_id, key, created_at DESC, id DESC);
CREATE INDEX key_audit_created_idx ON key_audit (created_at DESC, id DESC);

-- +goose Down
DROP TABLE key_audit;
ALTER TABLE idempotency_keys DROP COLUMN review_at;
ALTER TABLE idempotency_keys DROP COLUMN review_note;
