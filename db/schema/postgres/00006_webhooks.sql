-- +goose Up

-- webhook_endpoints are the URLs a tenant receives events at. events is the
-- filter: event types joined by commas, '' for every type. A failure streak
-- (consecutive_failures since failing_since) long enough disables the
-- endpoint (enabled = false, disabled_reason set).
CREATE TABLE webhook_endpoints (
    tenant_id            text        NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    id                   text        NOT NULL,
    url                  text        NOT NULL,
    secret               text        NOT NULL,
    events               text        NOT NULL DEFAULT '',
    enabled              boolean     NOT NULL DEFAULT true,
    disabled_reason      text,
    consecutive_failures integer     NOT NULL DEFAULT 0,
    failing_since        timestamptz,
    created_at           timestamptz NOT NULL,
    updated_at           timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, id)
);

-- webhook_deliveries is the outbox and the delivery log: one row per event
-- and endpoint, written in the transaction of the change the event reports.
-- payload is the exact body that is signed and sent; event_id is the
-- webhook-id every attempt carries.
CREATE TABLE webhook_deliveries (
    id              bigserial   PRIMARY KEY,
    tenant_id       text        NOT NULL,
    endpoint_id     text        NOT NULL,
    event_id        text        NOT NULL,
    event_type      text        NOT NULL,
    payload         bytea       NOT NULL,
    state           text        NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'delivered', 'failed')),
    attempts        integer     NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL,
    created_at      timestamptz NOT NULL,
    last_attempt_at timestamptz,
    last_status     integer,
    last_error      text,
    delivered_at    timestamptz,
    FOREIGN KEY (tenant_id, endpoint_id) REFERENCES webhook_endpoints (tenant_id, id) ON DELETE CASCADE
);
-- The delivery job's queue: pending rows by due time.
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_at) WHERE state = 'pending';
-- An endpoint's delivery log, newest first.
CREATE INDEX webhook_deliveries_log ON webhook_deliveries (tenant_id, endpoint_id, id DESC);
-- Purging finished rows.
CREATE INDEX webhook_deliveries_done ON webhook_deliveries (created_at) WHERE state <> 'pending';

-- orphan_event_token is the fencing token whose orphaning key.orphaned has
-- been queued for: the orphan watch sets it in the transaction that queues
-- the event, so each (key, token) is reported once, by one replica.
ALTER TABLE idempotency_keys ADD COLUMN orphan_event_token bigint;

-- +goose Down
ALTER TABLE idempotency_keys DROP COLUMN orphan_event_token;
DROP TABLE webhook_deliveries;
DROP TABLE webhook_endpoints;
