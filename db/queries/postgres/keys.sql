-- Every query takes the clock as the nullable parameter "now": NULL means the
-- database clock (now()), so replicas with skewed clocks agree; tests pass a
-- fake clock. Each returns that instant as observed_at.

-- name: ClaimKey :one
-- ClaimKey creates the record, or in the same statement takes over an
-- orphaned one with the same operation and fingerprint (attempt+1, new
-- token, recovery point kept), or replaces a completed one past its replay
-- window with a fresh record. A record the claim would not change (the
-- first row of "stored": completed within its replay window, or in flight
-- with its lease running) is not written at all: the statement returns it
-- as its snapshot holds it, response included (written false), and the
-- caller decides a replay, a refusal or the recovery of its attempt from
-- it. Such a claim is one read: no row lock, no sequence value, no second
-- statement. A completed record is immutable until its window ends, so
-- the snapshot's answer is the answer at the statement's instant. When
-- neither applies (a record completed or changed by another transaction
-- after the snapshot, over the quota, the tenant unknown or being deleted)
-- it returns no row; the caller then reads the stored row to tell why. The nextval of a claim that conflicts
-- and does not apply is lost, which only leaves a gap.
-- A record is created (the key absent, or expired) only while the tenant's
-- usage is below storage_quota_bytes, read in this statement (0: no check,
-- and the counters are not read); a takeover keeps the record and its
-- bytes, so the quota never refuses it. The claim counts what it stores
-- (stored_bytes) in the same statement.
-- The clock is written where it is used, not as a CTE joined to each step:
-- now() is one instant in a statement, and each CTE and join was a plan
-- node to start and finish in every claim (docs/benchmarks.md, "Where the
-- pair's PostgreSQL CPU goes").
WITH stored AS (
    SELECT
        e.tenant_id, e.key, e.state, e.operation, e.fingerprint, e.fencing_token,
        e.attempt, e.lease_expires_at, e.recovery_point,
        e.replay_window_seconds, e.reaper_threshold_seconds, e.created_at,
        e.updated_at, e.completed_at, e.replay_until, e.purge_after,
        e.review_note, e.review_at, e.recovery_data, e.attempt_id,
        e.response_status, e.response_headers, e.response_body, e.response_body_encoding,
        e.completer_state, e.completer_id, e.completer_attempts, e.completer_next_at, e.completer_deadline
    FROM idempotency_keys e
    WHERE e.tenant_id = sqlc.arg('tenant_id')::text AND e.key = sqlc.arg('key')::text
        -- as CASEs, so no plan makes them a range scan of the orphan index
        -- (TestGenericPlans)
        AND CASE WHEN e.state = 'completed' THEN e.replay_until > coalesce(sqlc.narg('now')::timestamptz, now())
            ELSE CASE WHEN e.lease_expires_at > coalesce(sqlc.narg('now')::timestamptz, now()) THEN true ELSE false END END
),
-- read only when a record would be created (an InitPlan, evaluated on
-- first use)
quota AS (
    SELECT sqlc.arg('storage_quota_bytes')::bigint = 0
        OR (SELECT coalesce(sum(u.stored_bytes), 0) FROM tenant_usage u
            WHERE u.tenant_id = sqlc.arg('tenant_id')::text)
            < sqlc.arg('storage_quota_bytes')::bigint AS room
),
w AS (
INSERT INTO idempotency_keys AS k (
    tenant_id, key, state, operation, fingerprint, fencing_token, attempt,
    attempt_id, lease_expires_at, replay_window_seconds, reaper_threshold_seconds,
    created_at, updated_at, purge_after, stored_bytes, stored_bytes_before
)
SELECT
    sqlc.arg('tenant_id')::text, sqlc.arg('key')::text, 'in_flight',
    sqlc.arg('operation')::text, sqlc.arg('fingerprint')::text,
    nextval('fencing_tokens'), 1, sqlc.narg('attempt_id')::text,
    coalesce(sqlc.narg('now')::timestamptz, now()) + sqlc.arg('lease_us')::bigint * interval '1 microsecond',
    sqlc.arg('replay_window_seconds')::integer,
    sqlc.arg('reaper_threshold_seconds')::integer,
    coalesce(sqlc.narg('now')::timestamptz, now()), coalesce(sqlc.narg('now')::timestamptz, now()),
    -- kept for the reaper threshold, and never less than the lease
    greatest(coalesce(sqlc.narg('now')::timestamptz, now()) + sqlc.arg('reaper_threshold_seconds')::integer * interval '1 second',
        coalesce(sqlc.narg('now')::timestamptz, now()) + sqlc.arg('lease_us')::bigint * interval '1 microsecond'),
    sqlc.arg('stored_bytes')::bigint, 0
-- nothing to write when the snapshot holds a record the claim keeps; a
-- record only of a tenant the snapshot holds, not being deleted (read, not
-- locked: migration 00016); over the quota, only a key that exists goes on
-- to ON CONFLICT (takeover). A CASE: the quota is read only after the
-- snapshot's record is ruled out.
WHERE CASE WHEN EXISTS (SELECT 1 FROM stored) THEN false
    WHEN NOT EXISTS (SELECT 1 FROM tenants t
        WHERE t.id = sqlc.arg('tenant_id')::text AND t.deleting_at IS NULL) THEN false
    ELSE (SELECT q.room FROM quota q) OR EXISTS (
        SELECT 1 FROM idempotency_keys e
        WHERE e.tenant_id = sqlc.arg('tenant_id')::text AND e.key = sqlc.arg('key')::text) END
ON CONFLICT (tenant_id, key) DO UPDATE SET
    state = 'in_flight',
    operation = excluded.operation,
    fingerprint = excluded.fingerprint,
    fencing_token = excluded.fencing_token,
    attempt = CASE WHEN k.state = 'completed' THEN 1 ELSE k.attempt + 1 END,
    attempt_id = excluded.attempt_id,
    lease_expires_at = excluded.lease_expires_at,
    recovery_point = CASE WHEN k.state = 'completed' THEN NULL ELSE k.recovery_point END,
    recovery_data = CASE WHEN k.state = 'completed' THEN NULL ELSE k.recovery_data END,
    response_status = NULL,
    response_headers = NULL,
    response_body = NULL,
    response_body_encoding = NULL,
    replay_window_seconds = CASE WHEN k.state = 'completed' THEN excluded.replay_window_seconds ELSE k.replay_window_seconds END,
    reaper_threshold_seconds = CASE WHEN k.state = 'completed' THEN excluded.reaper_threshold_seconds ELSE k.reaper_threshold_seconds END,
    created_at = CASE WHEN k.state = 'completed' THEN excluded.created_at ELSE k.created_at END,
    updated_at = excluded.updated_at,
    completed_at = NULL,
    replay_until = NULL,
    purge_after = CASE WHEN k.state = 'completed' THEN excluded.purge_after
        ELSE greatest(excluded.created_at + k.reaper_threshold_seconds * interval '1 second',
            excluded.lease_expires_at) END,
    stored_bytes = CASE WHEN k.state = 'completed' THEN excluded.stored_bytes ELSE k.stored_bytes END,
    stored_bytes_before = k.stored_bytes,
    -- a record the completer held never gets here (see WHERE); a completed
    -- one forgets the completer's past attempts
    completer_id = NULL,
    completer_attempts = 0,
    completer_deadline = NULL
WHERE
    -- takeover of an orphan by the same request
    (k.state = 'in_flight' AND k.lease_expires_at <= excluded.created_at
        AND k.operation = excluded.operation AND k.fingerprint = excluded.fingerprint
        -- never a record the completer holds or flagged (completer.go)
        AND k.completer_state IS NULL)
    -- a completed record past its replay window counts as absent (a new
    -- record: only below the quota)
    OR (k.state = 'completed' AND k.replay_until <= excluded.created_at
        AND (SELECT q.room FROM quota q))
RETURNING
    k.tenant_id, k.key, k.state, k.operation, k.fingerprint, k.fencing_token,
    k.attempt, k.lease_expires_at, k.recovery_point,
    k.replay_window_seconds, k.reaper_threshold_seconds, k.created_at,
    k.updated_at, k.completed_at, k.replay_until, k.purge_after,
    k.review_note, k.review_at, k.recovery_data, k.attempt_id,
    k.stored_bytes, k.stored_bytes_before
),
-- adds the write's difference to the tenant's usage, in this statement
counted AS (
    UPDATE tenant_usage u SET stored_bytes = u.stored_bytes + (w.stored_bytes - w.stored_bytes_before)
    FROM w
    WHERE u.tenant_id = w.tenant_id AND u.slot = pg_backend_pid() % 64
        AND w.stored_bytes <> w.stored_bytes_before
)
-- The record written, without its response, which a claim has just set
-- to NULL, or the record kept, with its response. At most one of the two
-- exists.
SELECT
    w.tenant_id, w.key, w.state, w.operation, w.fingerprint, w.fencing_token,
    w.attempt, w.lease_expires_at, w.recovery_point,
    w.replay_window_seconds, w.reaper_threshold_seconds, w.created_at,
    w.updated_at, w.completed_at, w.replay_until, w.purge_after,
    w.review_note, w.review_at, w.recovery_data, w.attempt_id,
    NULL::integer AS response_status, NULL::jsonb AS response_headers,
    NULL::bytea AS response_body, NULL::text AS response_body_encoding,
    -- a record a claim writes is never one the completer holds
    NULL::text AS completer_state, NULL::text AS completer_id, 0::integer AS completer_attempts,
    NULL::timestamptz AS completer_next_at, NULL::timestamptz AS completer_deadline,
    w.updated_at AS observed_at, true AS written
FROM w
UNION ALL
SELECT
    s.tenant_id, s.key, s.state, s.operation, s.fingerprint, s.fencing_token,
    s.attempt, s.lease_expires_at, s.recovery_point,
    s.replay_window_seconds, s.reaper_threshold_seconds, s.created_at,
    s.updated_at, s.completed_at, s.replay_until, s.purge_after,
    s.review_note, s.review_at, s.recovery_data, s.attempt_id,
    s.response_status, s.response_headers, s.response_body, s.response_body_encoding,
    s.completer_state, s.completer_id, s.completer_attempts, s.completer_next_at, s.completer_deadline,
    coalesce(sqlc.narg('now')::timestamptz, now()) AS observed_at, false AS written
FROM stored s;

-- name: GetKey :one
WITH clock AS (
    SELECT coalesce(sqlc.narg('now')::timestamptz, now())::timestamptz AS now
)
SELECT sqlc.embed(k), clock.now AS observed_at
FROM idempotency_keys k, clock
WHERE k.tenant_id = sqlc.arg('tenant_id') AND k.key = sqlc.arg('key');

-- name: RenewAttemptLease :one
-- RenewAttemptLease gives a recovered attempt (a claim repeated with its
-- attempt id) a lease from now, only while the token is current and the
-- record in flight with its lease running under that attempt id; the purge
-- follows the lease. It returns no row when the record changed meanwhile.
WITH clock AS (
    SELECT coalesce(sqlc.narg('now')::timestamptz, now())::timestamptz AS now
)
UPDATE idempotency_keys k SET
    lease_expires_at = clock.now + sqlc.arg('lease_us')::bigint * interval '1 microsecond',
    updated_at = clock.now,
    purge_after = greatest(k.purge_after, clock.now + k.reaper_threshold_seconds * interval '1 second',
        clock.now + sqlc.arg('lease_us')::bigint * interval '1 microsecond')
FROM clock
WHERE k.tenant_id = sqlc.arg('tenant_id') AND k.key = sqlc.arg('key')
    AND k.fencing_token = sqlc.arg('fencing_token') AND k.state = 'in_flight'
    -- the lease test as a CASE: the planner cannot make it a range scan of
    -- the orphan index, so the row is found by its primary key (see
    -- TestGenericPlans)
    AND CASE WHEN k.lease_expires_at > clock.now THEN true ELSE false END
    AND k.attempt_id = sqlc.arg('attempt_id')::text
RETURNING sqlc.embed(k), clock.now AS observed_at;

-- name: CheckpointKey :one
-- CheckpointKey saves the recovery point, renews the lease and postpones the
-- purge (to at least the reaper threshold from now and never before the new
-- lease ends), only while the token is current and the record in flight.
-- The new recovery point and data replace the old ones in stored_bytes, and
-- the difference goes to the tenant's usage in the same statement.
-- A checkpoint whose recovery data grows is saved only while the tenant's
-- usage, read in this statement (storage_quota_bytes 0: not read), plus
-- the record's growth stays within storage_quota_bytes; otherwise it
-- renews the lease and the purge time only and keeps the earlier point and
-- data, whose bytes (fewer than recovery_bytes: it would have grown) tell
-- the caller so. One whose data does not grow always fits: a lease
-- keeper's renewal, whose point (at most 128 bytes) may be new. The test
-- is used + growth <= greatest(quota, used): within the quota, or not
-- growing the record. The growth is computed from the row version the
-- update applies to, after any wait on a concurrent writer of the key.
-- clock is MATERIALIZED: inlined, each of the nine uses of clock.used
-- became a sum of the tenant's counter rows of its own.
WITH clock AS MATERIALIZED (
    SELECT coalesce(sqlc.narg('now')::timestamptz, now())::timestamptz AS now,
        CASE WHEN sqlc.arg('storage_quota_bytes')::bigint = 0 THEN NULL::bigint
            ELSE (SELECT coalesce(sum(u.stored_bytes), 0) FROM tenant_usage u
                WHERE u.tenant_id = sqlc.arg('tenant_id')::text)::bigint END AS used
),
w AS (
UPDATE idempotency_keys k SET
    recovery_point = CASE WHEN clock.used IS NULL
            OR coalesce(octet_length(sqlc.narg('recovery_data')::bytea), 0) <= coalesce(octet_length(k.recovery_data), 0)
            OR clock.used + sqlc.arg('recovery_bytes')::bigint - coalesce(octet_length(k.recovery_point), 0)
                - coalesce(octet_length(k.recovery_data), 0) <= greatest(sqlc.arg('storage_quota_bytes')::bigint, clock.used)
        THEN sqlc.arg('recovery_point')::text ELSE k.recovery_point END,
    recovery_data = CASE WHEN clock.used IS NULL
            OR coalesce(octet_length(sqlc.narg('recovery_data')::bytea), 0) <= coalesce(octet_length(k.recovery_data), 0)
            OR clock.used + sqlc.arg('recovery_bytes')::bigint - coalesce(octet_length(k.recovery_point), 0)
                - coalesce(octet_length(k.recovery_data), 0) <= greatest(sqlc.arg('storage_quota_bytes')::bigint, clock.used)
        THEN sqlc.narg('recovery_data')::bytea ELSE k.recovery_data END,
    lease_expires_at = clock.now + sqlc.arg('lease_us')::bigint * interval '1 microsecond',
    updated_at = clock.now,
    purge_after = greatest(k.purge_after, clock.now + k.reaper_threshold_seconds * interval '1 second',
        clock.now + sqlc.arg('lease_us')::bigint * interval '1 microsecond'),
    stored_bytes = CASE WHEN clock.used IS NULL
            OR coalesce(octet_length(sqlc.narg('recovery_data')::bytea), 0) <= coalesce(octet_length(k.recovery_data), 0)
            OR clock.used + sqlc.arg('recovery_bytes')::bigint - coalesce(octet_length(k.recovery_point), 0)
                - coalesce(octet_length(k.recovery_data), 0) <= greatest(sqlc.arg('storage_quota_bytes')::bigint, clock.used)
        THEN k.stored_bytes - coalesce(octet_length(k.recovery_point), 0)
            - coalesce(octet_length(k.recovery_data), 0) + sqlc.arg('recovery_bytes')::bigint
        ELSE k.stored_bytes END,
    stored_bytes_before = k.stored_bytes
FROM clock
WHERE k.tenant_id = sqlc.arg('tenant_id') AND k.key = sqlc.arg('key')
    AND k.fencing_token = sqlc.arg('fencing_token') AND k.state = 'in_flight'
RETURNING
    k.tenant_id, k.key, k.state, k.operation, k.fingerprint, k.fencing_token,
    k.attempt, k.lease_expires_at, k.recovery_point,
    k.replay_window_seconds, k.reaper_threshold_seconds, k.created_at,
    k.updated_at, k.completed_at, k.replay_until, k.purge_after,
    k.review_note, k.review_at, k.recovery_data, k.attempt_id,
    k.stored_bytes, k.stored_bytes_before, clock.now AS observed_at
),
-- adds the write's difference to the tenant's usage, in this statement
counted AS (
    UPDATE tenant_usage u SET stored_bytes = u.stored_bytes + (w.stored_bytes - w.stored_bytes_before)
    FROM w
    WHERE u.tenant_id = w.tenant_id AND u.slot = pg_backend_pid() % 64
        AND w.stored_bytes <> w.stored_bytes_before
)
-- An in-flight record has no response (writeRow's columns).
SELECT
    w.tenant_id, w.key, w.state, w.operation, w.fingerprint, w.fencing_token,
    w.attempt, w.lease_expires_at, w.recovery_point,
    w.replay_window_seconds, w.reaper_threshold_seconds, w.created_at,
    w.updated_at, w.completed_at, w.replay_until, w.purge_after,
    w.review_note, w.review_at, w.recovery_data, w.attempt_id,
    w.observed_at
FROM w;

-- name: CompleteKey :one
-- CompleteKey stores the response and starts the replay window, only while
-- the token is current and the record in flight (the lease may have run out).
-- A completion clears the review flag. The response's size (idem.Response
-- Size) goes to stored_bytes and the tenant's usage in the same statement.
-- The response is stored only while the tenant's usage, read in this
-- statement (storage_quota_bytes 0: not read), plus its size stays within
-- storage_quota_bytes; otherwise the record is completed all the same with
-- the unstored_* response in its place (idem.UnstoredResponse: the work
-- ran, the key must not run again), and stored is false.
-- quota is MATERIALIZED: inlined, each of its five uses would sum the
-- usage again. The clock is written where it is used (ClaimKey), and the
-- stored flag comes back through RETURNING, so no step joins a CTE but the
-- update.
WITH quota AS MATERIALIZED (
    SELECT sqlc.arg('storage_quota_bytes')::bigint = 0
            -- no bigger than the unstored response: storing it costs less
            OR sqlc.arg('response_bytes')::bigint <= sqlc.arg('unstored_bytes')::bigint
            OR (SELECT coalesce(sum(u.stored_bytes), 0) FROM tenant_usage u
                WHERE u.tenant_id = sqlc.arg('tenant_id')::text) + sqlc.arg('response_bytes')::bigint
                <= sqlc.arg('storage_quota_bytes')::bigint AS room
),
w AS (
UPDATE idempotency_keys k SET
    state = 'completed',
    lease_expires_at = NULL,
    response_status = sqlc.arg('response_status')::integer,
    response_headers = CASE WHEN quota.room THEN sqlc.arg('response_headers')::jsonb
        ELSE sqlc.arg('unstored_headers')::jsonb END,
    response_body = CASE WHEN quota.room THEN sqlc.arg('response_body')::bytea END,
    response_body_encoding = CASE WHEN quota.room THEN sqlc.arg('response_body_encoding')::text ELSE 'utf8' END,
    review_note = NULL,
    review_at = NULL,
    completer_state = NULL,
    completer_next_at = NULL,
    updated_at = coalesce(sqlc.narg('now')::timestamptz, now()),
    completed_at = coalesce(sqlc.narg('now')::timestamptz, now()),
    replay_until = coalesce(sqlc.narg('now')::timestamptz, now()) + k.replay_window_seconds * interval '1 second',
    purge_after = coalesce(sqlc.narg('now')::timestamptz, now()) + k.reaper_threshold_seconds * interval '1 second',
    stored_bytes = k.stored_bytes + CASE WHEN quota.room THEN sqlc.arg('response_bytes')::bigint
        ELSE sqlc.arg('unstored_bytes')::bigint END,
    stored_bytes_before = k.stored_bytes
FROM quota
WHERE k.tenant_id = sqlc.arg('tenant_id') AND k.key = sqlc.arg('key')
    AND k.fencing_token = sqlc.arg('fencing_token') AND k.state = 'in_flight'
    -- wakes the key's waiters when this commits (migration 00010)
    AND CASE WHEN k.waited THEN idem_notify_key(k.tenant_id, k.key) ELSE true END
RETURNING
    k.tenant_id, k.operation, k.fingerprint, k.attempt, k.recovery_point,
    k.replay_window_seconds, k.reaper_threshold_seconds, k.created_at,
    k.replay_until, k.purge_after, k.recovery_data, k.attempt_id,
    k.stored_bytes, k.stored_bytes_before, k.updated_at AS observed_at,
    quota.room AS stored
),
-- adds the write's difference to the tenant's usage, in this statement
counted AS (
    UPDATE tenant_usage u SET stored_bytes = u.stored_bytes + (w.stored_bytes - w.stored_bytes_before)
    FROM w
    WHERE u.tenant_id = w.tenant_id AND u.slot = pg_backend_pid() % 64
        AND w.stored_bytes <> w.stored_bytes_before
)
-- The columns of the record the caller does not know, and whether the
-- response stored was the caller's or the unstored one. It knows the
-- tenant, key and token it passed and what this statement set: state
-- completed, no lease, no review, updated and completed at observed_at
-- (completedRow). The response it holds is not sent back (a large body
-- would cross the wire twice).
SELECT
    w.operation, w.fingerprint, w.attempt, w.recovery_point,
    w.replay_window_seconds, w.reaper_threshold_seconds, w.created_at,
    w.replay_until, w.purge_after, w.recovery_data, w.attempt_id,
    w.observed_at, w.stored::boolean AS stored
FROM w;

-- name: ReleaseKey :execrows
-- ReleaseKey deletes an in-flight record whose token is current.
DELETE FROM idempotency_keys k
WHERE k.tenant_id = sqlc.arg('tenant_id') AND k.key = sqlc.arg('key')
    AND k.fencing_token = sqlc.arg('fencing_token') AND k.state = 'in_flight';

-- name: ListKeys :many
-- ListKeys lists a tenant's records without responses or recovery data (a
-- listing stays small whatever the records hold), newest first, with an
-- optional API-state filter computed at the clock instant and a keyset cursor
-- on (created_at, key).
WITH clock AS (
    SELECT coalesce(sqlc.narg('now')::timestamptz, now())::timestamptz AS now
)
SELECT
    k.tenant_id, k.key, k.state, k.operation, k.fingerprint, k.fencing_token,
    k.attempt, k.lease_expires_at, k.recovery_point,
    k.replay_window_seconds, k.reaper_threshold_seconds, k.created_at,
    k.updated_at, k.completed_at, k.replay_until, k.purge_after,
    k.review_note, k.review_at,
    k.completer_state, k.completer_id, k.completer_attempts, k.completer_next_at, k.completer_deadline,
    clock.now AS observed_at
FROM idempotency_keys k, clock
WHERE k.tenant_id = sqlc.arg('tenant_id')
    AND CASE sqlc.arg('state_filter')::text
        WHEN '' THEN true
        WHEN 'in_flight' THEN k.state = 'in_flight' AND k.lease_expires_at > clock.now
        WHEN 'orphaned' THEN k.state = 'in_flight' AND k.lease_expires_at <= clock.now
        WHEN 'completed' THEN k.state = 'completed' AND k.replay_until > clock.now
        WHEN 'expired' THEN k.state = 'completed' AND k.replay_until <= clock.now
        ELSE false
    END
    AND CASE sqlc.arg('completion_filter')::text
        WHEN '' THEN true
        WHEN 'unknown' THEN k.completer_state IN ('resuming', 'unknown')
        WHEN 'review' THEN k.completer_state = 'review'
        ELSE false
    END
    -- the first page passes the cursor ('infinity', ''): one form of the
    -- statement, whose cursor is a bound of the listing index scan in a
    -- generic plan too (an "IS NULL OR" made it a filter, and every page
    -- read the tenant's records from the newest on)
    AND (k.created_at, k.key) < (sqlc.arg('after_time')::timestamptz, sqlc.arg('after_key')::text)
ORDER BY k.created_at DESC, k.key DESC
LIMIT sqlc.arg('row_limit')::integer;

-- name: ListOrphanKeys :many
-- ListOrphanKeys lists orphaned records without recovery data, oldest lease
-- expiry first, for one tenant or ('') every tenant, with a keyset cursor on
-- (lease_expires_at, tenant_id, key). It reads the partial orphan index.
WITH clock AS (
    SELECT coalesce(sqlc.narg('now')::timestamptz, now())::timestamptz AS now
)
SELECT
    k.tenant_id, k.key, k.state, k.operation, k.fingerprint, k.fencing_token,
    k.attempt, k.lease_expires_at, k.recovery_point,
    k.replay_window_seconds, k.reaper_threshold_seconds, k.created_at,
    k.updated_at, k.completed_at, k.replay_until, k.purge_after,
    k.review_note, k.review_at,
    k.completer_state, k.completer_id, k.completer_attempts, k.completer_next_at, k.completer_deadline,
    clock.now AS observed_at
FROM idempotency_keys k, clock
WHERE k.state = 'in_flight' AND k.lease_expires_at <= clock.now
    AND (sqlc.arg('tenant_filter')::text = '' OR k.tenant_id = sqlc.arg('tenant_filter')::text)
    AND CASE sqlc.arg('completion_filter')::text
        WHEN '' THEN true
        WHEN 'unknown' THEN k.completer_state IN ('resuming', 'unknown')
        WHEN 'review' THEN k.completer_state = 'review'
        ELSE false
    END
    -- the first page passes the cursor ('-infinity', '', ''), as ListKeys
    AND (k.lease_expires_at, k.tenant_id, k.key)
        > (sqlc.arg('after_time')::timestamptz, sqlc.arg('after_tenant_id')::text, sqlc.arg('after_key')::text)
ORDER BY k.lease_expires_at, k.tenant_id, k.key
LIMIT sqlc.arg('row_limit')::integer;

-- name: OrphanStats :many
-- OrphanStats counts orphans per tenant; the partial orphan index finds them.
WITH clock AS (
    SELECT coalesce(sqlc.narg('now')::timestamptz, now())::timestamptz AS now
)
SELECT
    k.tenant_id,
    count(*)::bigint AS orphans,
    min(k.lease_expires_at)::timestamptz AS oldest_lease_expiry,
    min(clock.now)::timestamptz AS observed_at
FROM idempotency_keys k, clock
WHERE k.state = 'in_flight' AND k.lease_expires_at <= clock.now
GROUP BY k.tenant_id
ORDER BY k.tenant_id;

-- name: ReapKeys :many
-- ReapKeys deletes a batch of records past purge_after, oldest first, from
-- the purge_after index. An in-flight record whose lease still runs is never
-- deleted, whatever its purge_after says: its claimant may still be working.
-- FOR UPDATE SKIP LOCKED lets concurrent reapers on several replicas each
-- take different rows without waiting on one another; a row is deleted by
-- one of them only. The batch is deleted by the row addresses (ctid) the
-- locking scan returned — the rows stay where they are while locked, and a
-- TID scan is the one plan for them, where a join on the key could be
-- planned as a scan of the whole table (SQLite's ReapKeys deletes by rowid
-- the same way). It returns the records without responses or recovery
-- data.
WITH clock AS (
    SELECT coalesce(sqlc.narg('now')::timestamptz, now())::timestamptz AS now
)
DELETE FROM idempotency_keys k
WHERE k.ctid = ANY (ARRAY(
    SELECT e.ctid
    FROM idempotency_keys e
    WHERE e.purge_after <= (SELECT clock.now FROM clock)
        AND (e.state <> 'in_flight' OR e.lease_expires_at <= (SELECT clock.now FROM clock))
    ORDER BY e.purge_after
    LIMIT sqlc.arg('row_limit')::integer
    FOR UPDATE OF e SKIP LOCKED
))
RETURNING
    k.tenant_id, k.key, k.state, k.operation, k.fingerprint, k.fencing_token,
    k.attempt, k.lease_expires_at, k.recovery_point,
    k.replay_window_seconds, k.reaper_threshold_seconds, k.created_at,
    k.updated_at, k.completed_at, k.replay_until, k.purge_after,
    k.review_note, k.review_at,
    k.completer_state, k.completer_id, k.completer_attempts, k.completer_next_at, k.completer_deadline,
    (SELECT clock.now FROM clock)::timestamptz AS observed_at;

-- name: ShareTenant :one
-- ShareTenant takes a share of the tenant's row (FOR KEY SHARE: claims,
-- settings updates and other resolutions go on) before a resolution locks
-- its record. Deleting the tenant locks its row, then its records (ON
-- DELETE CASCADE); a resolution that locked the record first and then
-- needed the tenant's row for its audit entry's foreign key would deadlock
-- with it. No row: the tenant is gone.
SELECT t.id FROM tenants t WHERE t.id = sqlc.arg('tenant_id') FOR KEY SHARE;

-- name: LockKey :one
-- LockKey reads a record and locks its row until the end of the
-- transaction: a resolution decides on the row no other writer can change
-- before it commits (the token-guarded writes and a takeover wait for it).
WITH clock AS (
    SELECT coalesce(sqlc.narg('now')::timestamptz, now())::timestamptz AS now
)
SELECT sqlc.embed(k), clock.now AS observed_at
FROM idempotency_keys k, clock
WHERE k.tenant_id = sqlc.arg('tenant_id') AND k.key = sqlc.arg('key')
FOR UPDATE OF k;

-- name: ResolveCompleteKey :one
-- ResolveCompleteKey stores the response a person supplied for an orphan,
-- hands the record a new fencing token (the late worker is fenced off) and
-- clears the review flag. The caller locked the row and checked it. The
-- response is counted as CompleteKey counts it.
WITH clock AS (
    SELECT coalesce(sqlc.narg('now')::timestamptz, now())::timestamptz AS now
),
w AS (
UPDATE idempotency_keys k SET
    state = 'completed',
    fencing_token = nextval('fencing_tokens'),
    lease_expires_at = NULL,
    response_status = sqlc.arg('response_status')::integer,
    response_headers = sqlc.arg('response_headers')::jsonb,
    response_body = sqlc.arg('response_body')::bytea,
    response_body_encoding = sqlc.arg('response_body_encoding')::text,
    review_note = NULL,
    review_at = NULL,
    completer_state = NULL,
    completer_next_at = NULL,
    updated_at = clock.now,
    completed_at = clock.now,
    replay_until = clock.now + k.replay_window_seconds * interval '1 second',
    purge_after = clock.now + k.reaper_threshold_seconds * interval '1 second',
    stored_bytes = k.stored_bytes + sqlc.arg('response_bytes')::bigint,
    stored_bytes_before = k.stored_bytes
FROM clock
WHERE k.tenant_id = sqlc.arg('tenant_id') AND k.key = sqlc.arg('key')
    AND k.fencing_token = sqlc.arg('fencing_token') AND k.state = 'in_flight'
    -- wakes the key's waiters when this commits (migration 00010)
    AND CASE WHEN k.waited THEN idem_notify_key(k.tenant_id, k.key) ELSE true END
RETURNING
    k.tenant_id, k.key, k.state, k.operation, k.fingerprint, k.fencing_token,
    k.attempt, k.lease_expires_at, k.recovery_point,
    k.replay_window_seconds, k.reaper_threshold_seconds, k.created_at,
    k.updated_at, k.completed_at, k.replay_until, k.purge_after,
    k.review_note, k.review_at, k.recovery_data, k.attempt_id,
    k.stored_bytes, k.stored_bytes_before, clock.now AS observed_at
),
-- adds the write's difference to the tenant's usage, in this statement
counted AS (
    UPDATE tenant_usage u SET stored_bytes = u.stored_bytes + (w.stored_bytes - w.stored_bytes_before)
    FROM w
    WHERE u.tenant_id = w.tenant_id AND u.slot = pg_backend_pid() % 64
        AND w.stored_bytes <> w.stored_bytes_before
)
-- The record without the response it has just stored (writeRow's columns).
SELECT
    w.tenant_id, w.key, w.state, w.operation, w.fingerprint, w.fencing_token,
    w.attempt, w.lease_expires_at, w.recovery_point,
    w.replay_window_seconds, w.reaper_threshold_seconds, w.created_at,
    w.updated_at, w.completed_at, w.replay_until, w.purge_after,
    w.review_note, w.review_at, w.recovery_data, w.attempt_id,
    w.observed_at
FROM w;

-- name: ReviewKey :one
-- ReviewKey flags an in-flight record for review with a note. The caller
-- locked the row and checked it.
WITH clock AS (
    SELECT coalesce(sqlc.narg('now')::timestamptz, now())::timestamptz AS now
)
UPDATE idempotency_keys k SET
    review_note = sqlc.arg('review_note')::text,
    review_at = clock.now,
    updated_at = clock.now
FROM clock
WHERE k.tenant_id = sqlc.arg('tenant_id') AND k.key = sqlc.arg('key')
    AND k.fencing_token = sqlc.arg('fencing_token') AND k.state = 'in_flight'
RETURNING sqlc.embed(k), clock.now AS observed_at;

-- name: KeyWaited :one
-- KeyWaited reads whether a key is in flight and already flagged waited.
SELECT state = 'in_flight' AS in_flight, waited
FROM idempotency_keys
WHERE tenant_id = sqlc.arg('tenant_id') AND key = sqlc.arg('key');

-- name: MarkKeyWaited :execrows
-- MarkKeyWaited flags a key in flight as waited on, so its completion
-- (CompleteKey, ResolveCompleteKey) or deletion (the trigger of migration
-- 00008) notifies. It changes no row when the key is no longer in flight
-- (completed or gone).
UPDATE idempotency_keys SET waited = true
WHERE tenant_id = sqlc.arg('tenant_id') AND key = sqlc.arg('key') AND state = 'in_flight';

-- name: TenantStoredBytes :one
-- TenantStoredBytes is the tenant's usage: the sum of its counter rows.
SELECT coalesce(sum(stored_bytes), 0)::bigint AS stored_bytes
FROM tenant_usage WHERE tenant_id = sqlc.arg('tenant_id');
