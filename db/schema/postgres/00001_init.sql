-- +goose Up

-- Fencing tokens come from one global sequence, so a token is greater than
-- every token handed out before it, for any key, even after a release or a
-- reap deleted the row that held the previous one.
CREATE SEQUENCE fencing_tokens AS bigint;

CREATE TABLE tenants (
    id                       text        PRIMARY KEY,
    name                     text        NOT NULL,
    replay_window_seconds    integer     NOT NULL,
    reaper_threshold_seconds integer     NOT NULL,
    lease_seconds_default    integer     NOT NULL,
    lease_seconds_max        integer     NOT NULL,
    max_response_bytes       integer     NOT NULL,
    rate_limit_per_second    integer     NOT NULL,
    disabled_at              timestamptz,
    created_at               timestamptz NOT NULL,
    updated_at               timestamptz NOT NULL
);

-- idempotency_keys stores only the states in_flight and completed; orphaned
-- and expired are derived from lease_expires_at and replay_until at read time.
CREATE TABLE idempotency_keys (
    tenant_id                text        NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    key                      text        NOT NULL,
    state                    text        NOT NULL CHECK (state IN ('in_flight', 'completed')),
    operation                text        NOT NULL,
    fingerprint              text        NOT NULL,
    fencing_token            bigint      NOT NULL,
    attempt                  integer     NOT NULL,
    -- lease_expires_at is NULL once completed.
    lease_expires_at         timestamptz,
    recovery_point           text,
    -- recovery_data is kept verbatim (bytea, not jsonb) so it reads back
    -- byte for byte as it was saved.
    recovery_data            bytea,
    response_status          integer,
    response_headers         jsonb,
    response_body            bytea,
    response_body_encoding   text,
    -- The tenant's windows at the time the record was created.
    replay_window_seconds    integer     NOT NULL,
    reaper_threshold_seconds integer     NOT NULL,
    created_at               timestamptz NOT NULL,
    updated_at               timestamptz NOT NULL,
    completed_at             timestamptz,
    replay_until             timestamptz,
    purge_after              timestamptz NOT NULL,
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
DROP SEQUENCE fencing_tokens;
