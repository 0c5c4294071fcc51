-- +goose Up

-- A tenant's reaper threshold must be at least its longest lease, or the
-- reaper could delete a key whose claimant is still working on it. Settings
-- stored before this rule are raised to lease_seconds_max: records are then
-- kept longer, never shorter. (The reaper also skips every in-flight record
-- whose lease still runs, so records created before this migration are safe
-- too.)
UPDATE tenants SET reaper_threshold_seconds = lease_seconds_max
WHERE reaper_threshold_seconds < lease_seconds_max;

-- +goose Down

-- Nothing to undo: the old thresholds are not kept, and the raised ones are
-- valid under the old rules too.
SELECT 1;
