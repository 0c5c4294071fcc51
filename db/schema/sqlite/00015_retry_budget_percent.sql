-- +goose Up

-- The share of first attempts that retries may add per replica over a
-- sliding window before a retry is refused (retry_budget_percent;
-- idem.Settings, package retrybudget); 100 turns the budget off. Existing
-- tenants get the default.
ALTER TABLE tenants ADD COLUMN retry_budget_percent integer NOT NULL DEFAULT 10;

-- +goose Down
ALTER TABLE tenants DROP COLUMN retry_budget_percent;
