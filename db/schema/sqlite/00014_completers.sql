-- +goose Up

-- completers are the resume endpoints a tenant registered (issue 24,
-- completer.go): the completer job calls one for each orphan of the tenant
-- whose operation its operation_pattern matches ('' every operation; a
-- trailing '*' a prefix), signed with secret (Standard Webhooks). Times are
-- unix microseconds.
CREATE TABLE completers (
    tenant_id         TEXT    NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    id                TEXT    NOT NULL,
    url               TEXT    NOT NULL,
    secret            TEXT    NOT NULL,
    operation_pattern TEXT    NOT NULL DEFAULT '',
    created_at        INTEGER NOT NULL,
    PRIMARY KEY (tenant_id, id)
);

-- The completer's hold on a record (PostgreSQL's 00014 says what each
-- state means). A completion or a release clears it.
ALTER TABLE idempotency_keys ADD COLUMN completer_state TEXT
    CHECK (completer_state IN ('resuming', 'unknown', 'review'));
ALTER TABLE idempotency_keys ADD COLUMN completer_id TEXT;
ALTER TABLE idempotency_keys ADD COLUMN completer_attempts INTEGER NOT NULL DEFAULT 0;
ALTER TABLE idempotency_keys ADD COLUMN completer_next_at INTEGER;
ALTER TABLE idempotency_keys ADD COLUMN completer_deadline INTEGER;

-- The completer's stats and the unknown/review listings.
CREATE INDEX idempotency_keys_completer_idx ON idempotency_keys (tenant_id, completer_state)
    WHERE completer_state IS NOT NULL;

-- The completer's attempts go to the audit log beside a person's
-- resolutions. SQLite cannot change a CHECK constraint: the table is
-- rebuilt with the wider one, its ids and indexes kept.
CREATE TABLE key_audit_new (
    id                 INTEGER PRIMARY KEY AUTOINCREMENT,
    tenant_id          TEXT    NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    key                TEXT    NOT NULL,
    action             TEXT    NOT NULL CHECK (action IN (
        'release', 'complete', 'review',
        'completer_completed', 'completer_released', 'completer_unknown', 'completer_review')),
    fencing_token      INTEGER NOT NULL,
    new_fencing_token  INTEGER,
    note               TEXT    NOT NULL,
    actor_subject      TEXT    NOT NULL,
    actor_tenant       TEXT    NOT NULL,
    actor_scope        TEXT    NOT NULL,
    created_at         INTEGER NOT NULL
);
INSERT INTO key_audit_new SELECT * FROM key_audit;
DROP TABLE key_audit;
ALTER TABLE key_audit_new RENAME TO key_audit;
CREATE INDEX key_audit_tenant_idx ON key_audit (tenant_id, created_at DESC, id DESC);
CREATE INDEX key_audit_key_idx ON key_audit (tenant_id, key, created_at DESC, id DESC);
CREATE INDEX key_audit_created_idx ON key_audit (created_at DESC, id DESC);

-- +goose Down
DROP INDEX idempotency_keys_completer_idx;
CREATE TABLE key_audit_old (
    id                 INTEGER PRIMARY KEY AUTOINCREMENT,
    tenant_id          TEXT    NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    key                TEXT    NOT NULL,
    action             TEXT    NOT NULL CHECK (action IN ('release', 'complete', 'review')),
    fencing_token      INTEGER NOT NULL,
    new_fencing_token  INTEGER,
    note               TEXT    NOT NULL,
    actor_subject      TEXT    NOT NULL,
    actor_tenant       TEXT    NOT NULL,
    actor_scope        TEXT    NOT NULL,
    created_at         INTEGER NOT NULL
);
INSERT INTO key_audit_old SELECT * FROM key_audit WHERE action NOT LIKE 'completer_%';
DROP TABLE key_audit;
ALTER TABLE key_audit_old RENAME TO key_audit;
CREATE INDEX key_audit_tenant_idx ON key_audit (tenant_id, created_at DESC, id DESC);
CREATE INDEX key_audit_key_idx ON key_audit (tenant_id, key, created_at DESC, id DESC);
CREATE INDEX key_audit_created_idx ON key_audit (created_at DESC, id DESC);
ALTER TABLE idempotency_keys DROP COLUMN completer_deadline;
ALTER TABLE idempotency_keys DROP COLUMN completer_next_at;
ALTER TABLE idempotency_keys DROP COLUMN completer_attempts;
ALTER TABLE idempotency_keys DROP COLUMN completer_id;
ALTER TABLE idempotency_keys DROP COLUMN completer_state;
DROP TABLE completers;
