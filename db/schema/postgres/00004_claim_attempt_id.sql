-- +goose Up

-- attempt_id is the client-chosen id the current attempt claimed with (NULL
-- when it sent none). A claim that repeats it while the lease runs gets that
-- attempt back (same fencing token) instead of request_in_flight: the way to
-- recover a claim whose answer was lost. A takeover or a fresh record
-- replaces it.
ALTER TABLE idempotency_keys ADD COLUMN attempt_id text;

-- +goose Down
ALTER TABLE idempotency_keys DROP COLUMN attempt_id;
