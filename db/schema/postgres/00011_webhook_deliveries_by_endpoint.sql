-- +goose Up

-- The delivery claim takes each enabled endpoint's oldest due deliveries,
-- at most a few per endpoint (ClaimWebhookDeliveries), so that one slow or
-- busy endpoint cannot hold back every other endpoint's deliveries. This
-- index is the per-endpoint queue it walks: pending rows of one endpoint by
-- due time. Building it takes a SHARE lock on webhook_deliveries (new
-- events wait) for one scan of the table; the table holds the delivery log
-- of the retention period only.
CREATE INDEX webhook_deliveries_endpoint_due ON webhook_deliveries (tenant_id, endpoint_id, next_attempt_at, id)
    WHERE state = 'pending';

-- +goose Down
DROP INDEX webhook_deliveries_endpoint_due;
