-- +goose Up

-- webhook_endpoints are the URLs a tenant receives events at. events is the
-- filter: event types joined by commas, '' for every type. A failure streak
-- (consecutive_failures since failing_since) long enough disables the
-- endpoint (enabled = 0, disabled_reason set). Times are unix microseconds.
CREATE TABLE webhook_endpoints (
    tenant_id            TEXT    NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    id                   TEXT    NOT NULL,
    url                  TEXT    NOT NULL,
    secret               TEXT    NOT NULL,
    events               TEXT    NOT NULL DEFAULT '',
    enabled              INTEGER NOT NULL DEFAULT 1,
    disabled_reason      TEXT,
    consecutive_failures INTEGER NOT NULL DEFAULT 0,
    failing_since        INTEGER,
    created_at           INTEGER NOT NULL,
    updated_at           INTEGER NOT NULL,
    PRIMARY KEY (tenant_id, id)
);

-- webhook_deliveries is the outbox and the delivery log: one row per event
-- and endpoint, written in the transaction of the change the event reports.
-- payload is the exact body that is signed and sent; event_id is the
-- webhook-id every attempt carries.
CREATE TABLE webhook_deliveries (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    tenant_id       TEXT    NOT NULL,
    endpoint_id     TEXT    NOT NULL,
    event_id        TEXT    NOT NULL,
    event_type      TEXT    NOT NULL,
    payload         BLOB    NOT NULL,
    state           TEXT    NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'delivered', 'failed')),
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_attempt_at INTEGER NOT NULL,
    created_at      INTEGER NOT NULL,
    last_attempt_at INTEGER,
    last_status     INTEGER,
    last_error      TEXT,
    delivered_at    INTEGER,
    FOREIGN KEY (tenant_id, endpoint_id) REFERENCES webhook_endpoints (tenant_id, id) ON DELETE CASCADE
);
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_at) WHERE state = 'pending';
CREATE INDEX webhook_deliveries_log ON webhook_deliveries (tenant_id, endpoint_id, id DESC);
CREATE INDEX webhook_deliveries_done ON webhook_deliveries (created_at) WHERE state <> 'pending';

-- orphan_event_token is the fencing token whose orphaning key.orphaned has
-- been queued for: the orphan watch sets it in the transaction that queues
-- the event, so each (key, token) is reported once.
ALTER TABLE idempotency_keys ADD COLUMN orphan_event_token INTEGER;

-- +goose Down
ALTER TABLE idempotency_keys DROP COLUMN orphan_event_token;
DROP TABLE webhook_deliveries;
DROP TABLE webhook_endpoints;
