-- +goose Up

-- SQLite stores a row as one record: the part that does not fit its page
-- goes to a chain of overflow pages, and a column is reached only by
-- walking that chain up to it. The large columns (recovery_data,
-- response_headers, response_body: up to max_response_bytes, or a
-- checkpoint's body) sat in the middle of idempotency_keys, and the
-- columns added since (attempt_id, review_*, orphan_event_token,
-- stored_bytes, completer_*) after them, so every read of a column after
-- them walked the whole response: listing 100 records of 8 MB read 800 MB
-- and ran into the store timeout. The table is rebuilt with every other
-- column first and the large ones last; a read that does not select them
-- now touches the row's first page, whatever the response's size.
-- (PostgreSQL keeps large values out of line, TOAST, so its table stays.)
-- review_note (up to 2,000 bytes) is the last of the small columns.
--
-- A column added to this table later must not go after the large ones:
-- ALTER TABLE ADD COLUMN appends, so such a migration rebuilds the table
-- as this one does (TestLargeKeyColumnsLast checks the order).
--
-- The standard rebuild (https://www.sqlite.org/lang_altertable.html):
-- inside goose's transaction, with foreign keys on. No table references
-- idempotency_keys, so dropping it deletes nothing elsewhere, and a DROP
-- TABLE fires no trigger: the copy leaves tenant_usage as it was, and the
-- counting triggers are created again after it. Every index and trigger on
-- the table is recreated; no view refers to it.
CREATE TABLE idempotency_keys_new (
    tenant_id                TEXT    NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    key                      TEXT    NOT NULL,
    state                    TEXT    NOT NULL CHECK (state IN ('in_flight', 'completed')),
    operation                TEXT    NOT NULL,
    fingerprint              TEXT    NOT NULL,
    fencing_token            INTEGER NOT NULL,
    attempt                  INTEGER NOT NULL,
    attempt_id               TEXT,
    lease_expires_at         INTEGER,
    recovery_point           TEXT,
    response_status          INTEGER,
    response_body_encoding   TEXT,
    replay_window_seconds    INTEGER NOT NULL,
    reaper_threshold_seconds INTEGER NOT NULL,
    created_at               INTEGER NOT NULL,
    updated_at               INTEGER NOT NULL,
    completed_at             INTEGER,
    replay_until             INTEGER,
    purge_after              INTEGER NOT NULL,
    orphan_event_token       INTEGER,
    stored_bytes             INTEGER NOT NULL DEFAULT 0,
    completer_state          TEXT    CHECK (completer_state IN ('resuming', 'unknown', 'review')),
    completer_id             TEXT,
    completer_attempts       INTEGER NOT NULL DEFAULT 0,
    completer_next_at        INTEGER,
    completer_deadline       INTEGER,
    review_at                INTEGER,
    review_note              TEXT,
    -- The large columns, last.
    recovery_data            BLOB,
    response_headers         TEXT,
    response_body            BLOB,
    PRIMARY KEY (tenant_id, key)
);
INSERT INTO idempotency_keys_new (
    tenant_id, key, state, operation, fingerprint, fencing_token, attempt, attempt_id,
    lease_expires_at, recovery_point, response_status, response_body_encoding,
    replay_window_seconds, reaper_threshold_seconds, created_at, updated_at, completed_at,
    replay_until, purge_after, orphan_event_token, stored_bytes,
    completer_state, completer_id, completer_attempts, completer_next_at, completer_deadline,
    review_at, review_note, recovery_data, response_headers, response_body
)
SELECT
    tenant_id, key, state, operation, fingerprint, fencing_token, attempt, attempt_id,
    lease_expires_at, recovery_point, response_status, response_body_encoding,
    replay_window_seconds, reaper_threshold_seconds, created_at, updated_at, completed_at,
    replay_until, purge_after, orphan_event_token, stored_bytes,
    completer_state, completer_id, completer_attempts, completer_next_at, completer_deadline,
    review_at, review_note, recovery_data, response_headers, response_body
FROM idempotency_keys;
DROP TABLE idempotency_keys;
ALTER TABLE idempotency_keys_new RENAME TO idempotency_keys;

CREATE INDEX idempotency_keys_purge_after_idx ON idempotency_keys (purge_after);
CREATE INDEX idempotency_keys_orphans_idx ON idempotency_keys (lease_expires_at)
    WHERE state = 'in_flight';
CREATE INDEX idempotency_keys_listing_idx ON idempotency_keys (tenant_id, created_at DESC, key DESC);
CREATE INDEX idempotency_keys_completer_idx ON idempotency_keys (tenant_id, completer_state)
    WHERE completer_state IS NOT NULL;

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

-- The order of 00017: 00001's columns, then those ALTER TABLE added.
CREATE TABLE idempotency_keys_old (
    tenant_id                TEXT    NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    key                      TEXT    NOT NULL,
    state                    TEXT    NOT NULL CHECK (state IN ('in_flight', 'completed')),
    operation                TEXT    NOT NULL,
    fingerprint              TEXT    NOT NULL,
    fencing_token            INTEGER NOT NULL,
    attempt                  INTEGER NOT NULL,
    lease_expires_at         INTEGER,
    recovery_point           TEXT,
    recovery_data            BLOB,
    response_status          INTEGER,
    response_headers         TEXT,
    response_body            BLOB,
    response_body_encoding   TEXT,
    replay_window_seconds    INTEGER NOT NULL,
    reaper_threshold_seconds INTEGER NOT NULL,
    created_at               INTEGER NOT NULL,
    updated_at               INTEGER NOT NULL,
    completed_at             INTEGER,
    replay_until             INTEGER,
    purge_after              INTEGER NOT NULL,
    attempt_id               TEXT,
    review_note              TEXT,
    review_at                INTEGER,
    orphan_event_token       INTEGER,
    stored_bytes             INTEGER NOT NULL DEFAULT 0,
    completer_state          TEXT    CHECK (completer_state IN ('resuming', 'unknown', 'review')),
    completer_id             TEXT,
    completer_attempts       INTEGER NOT NULL DEFAULT 0,
    completer_next_at        INTEGER,
    completer_deadline       INTEGER,
    PRIMARY KEY (tenant_id, key)
);
INSERT INTO idempotency_keys_old (
    tenant_id, key, state, operation, fingerprint, fencing_token, attempt,
    lease_expires_at, recovery_point, recovery_data, response_status, response_headers,
    response_body, response_body_encoding, replay_window_seconds, reaper_threshold_seconds,
    created_at, updated_at, completed_at, replay_until, purge_after, attempt_id,
    review_note, review_at, orphan_event_token, stored_bytes,
    completer_state, completer_id, completer_attempts, completer_next_at, completer_deadline
)
SELECT
    tenant_id, key, state, operation, fingerprint, fencing_token, attempt,
    lease_expires_at, recovery_point, recovery_data, response_status, response_headers,
    response_body, response_body_encoding, replay_window_seconds, reaper_threshold_seconds,
    created_at, updated_at, completed_at, replay_until, purge_after, attempt_id,
    review_note, review_at, orphan_event_token, stored_bytes,
    completer_state, completer_id, completer_attempts, completer_next_at, completer_deadline
FROM idempotency_keys;
DROP TABLE idempotency_keys;
ALTER TABLE idempotency_keys_old RENAME TO idempotency_keys;

CREATE INDEX idempotency_keys_purge_after_idx ON idempotency_keys (purge_after);
CREATE INDEX idempotency_keys_orphans_idx ON idempotency_keys (lease_expires_at)
    WHERE state = 'in_flight';
CREATE INDEX idempotency_keys_listing_idx ON idempotency_keys (tenant_id, created_at DESC, key DESC);
CREATE INDEX idempotency_keys_completer_idx ON idempotency_keys (tenant_id, completer_state)
    WHERE completer_state IS NOT NULL;

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
