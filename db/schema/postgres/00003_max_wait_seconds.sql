-- +goose Up

-- How long a claim of a key in flight may wait for the holder to finish
-- (wait_seconds, Prefer: wait=N); 0 turns waiting off.
ALTER TABLE tenants ADD COLUMN max_wait_seconds integer NOT NULL DEFAULT 20;

-- +goose Down
ALTER TABLE tenants DROP COLUMN max_wait_seconds;
