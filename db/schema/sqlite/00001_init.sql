-- +goose Up

-- Times are INTEGER unix microseconds (UTC). SQLite has no time type: an
-- integer compares and sorts exactly inside indexes, needs no parsing, does not
-- depend on a text format, and microseconds are the precision of PostgreSQL's
-- timestamptz, so both stores round-trip the same instants.

-- fencing_counter is the one source of fencing tokens: a single row whose
-- value only grows, so a token is greater than every token handed out before
-- it, for any key, even after a release or the reaper deleted the row that
-- held the previous one.
CREATE TABLE fencing_counter (
    id    INTEGER PRIMARY KEY CHECK (id = 1),
    value INTEGER NOT NULL
);
INSERT INTO fencing_counter (id, value) VALUES (1, 0);

CREATE TABLE tenants (
    id                       TEXT    PRIMARY KEY NOT NULL,
    name                     TEXT    NOT NULL,
    replay_window_seconds    INTEGER NOT NULL,
    reaper_threshold_seconds INTEGER NOT NULL,
    lease_seconds_default    INTEGER NOT NULL,
    lease_seconds_max        INTEGER NOT NULL,
    max_response_bytes       INTEGER NOT NULL,
    rate_limit_per_second    INTEGER NOT NULL,
    disabled_at              INTEGER,
    created_at               INTEGER NOT NULL,
    updated_at               INTEGER NOT NULL
);

-- idempotency_keys stores only the states in_flight and completed; orphaned
-- and expired are derived from lease_expires_at and replay_until at read time.
CREATE TABLE idempotency_keys (
    tenant_id                TEXT    NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    key                      TEXT    NOT NULL,
    state                    TEXT    NOT NULL CHECK (state IN ('in_flight', 'completed')),
    operation                TEXT    NOT NULL,
    fingerprint              TEXT    NOT NULL,
    fencing_token            INTEGER NOT NULL,
    attempt                  INTEGER NOT NULL,
    -- lease_expires_at is NULL once completed.
    lease_expires_at         INTEGER,
    recovery_point           TEXT,
    -- recovery_data is kept verbatim (a BLOB) so it reads back byte for byte
    -- as it was saved.
    recovery_data            BLOB,
    response_status          INTEGER,
    -- response_headers is a JSON object of strings.
    response_headers         TEXT,
    response_body            BLOB,
    response_body_encoding   TEXT,
    -- The tenant's windows at the time the record was created.
    replay_window_seconds    INTEGER NOT NULL,
    reaper_threshold_seconds INTEGER NOT NULL,
    created_at               INTEGER NOT NULL,
    updated_at               INTEGER NOT NULL,
    completed_at             INTEGER,
    replay_until             INTEGER,
    purge_after              INTEGER NOT NULL,
    PRIMARY KEY (tenant_id, key)
);

-- The reaper's batch scan.
CREATE INDEX idempotency_keys_purge_after_idx ON idempotency_keys (purge_after);

-- The orphan watch and the orphan listing: only in-flight rows, so the scan
-- never touches completed records. tenant_id and key make the listing order
-- and the per-tenant stats index-only.
CREATE INDEX idempotency_keys_orphans_idx ON idempotency_keys (lease_expires_at, tenant_id, key)
    WHERE state = 'in_flight';

-- A tenant's listing, newest first, with a keyset cursor.
CREATE INDEX idempotency_keys_listing_idx ON idempotency_keys (tenant_id, created_at DESC, key DESC);

-- +goose Down
DROP TABLE idempotency_keys;
DROP TABLE tenants;
DROP TABLE fencing_counter;
