-- +goose Up

-- The same index as PostgreSQL's 00011: each endpoint's pending deliveries
-- by due time, the per-endpoint queue the delivery claim walks
-- (DueWebhookDeliveries).
CREATE INDEX webhook_deliveries_endpoint_due ON webhook_deliveries (tenant_id, endpoint_id, next_attempt_at, id)
    WHERE state = 'pending';

-- +goose Down
DROP INDEX webhook_deliveries_endpoint_due;
