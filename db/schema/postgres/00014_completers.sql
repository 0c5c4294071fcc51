-- +goose Up

-- completers are the resume endpoints a tenant registered (issue 24,
-- completer.go): the completer job calls one for each orphan of the tenant
-- whose operation its operation_pattern matches ('' every operation; a
-- trailing '*' a prefix), signed with secret (Standard Webhooks).
CREATE TABLE completers (
    tenant_id         text        NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    id                text        NOT NULL,
    url               text        NOT NULL,
    secret            text        NOT NULL,
    operation_pattern text        NOT NULL DEFAULT '',
    created_at        timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, id)
);

-- The completer's hold on a record: completer_state is NULL until the
-- completer takes the record over, then 'resuming' (an attempt runs under
-- the completer's lease), 'unknown' (the next attempt is due at
-- completer_next_at) or 'review' (it gave up; review_note says why). A
-- completion or a release clears it. A claim never takes such a record
-- over (ClaimKey).
ALTER TABLE idempotency_keys ADD COLUMN completer_state text
    CHECK (completer_state IN ('resuming', 'unknown', 'review'));
ALTER TABLE idempotency_keys ADD COLUMN completer_id text;
ALTER TABLE idempotency_keys ADD COLUMN completer_attempts integer NOT NULL DEFAULT 0;
ALTER TABLE idempotency_keys ADD COLUMN completer_next_at timestamptz;
ALTER TABLE idempotency_keys ADD COLUMN completer_deadline timestamptz;

-- The completer's stats and the unknown/review listings.
CREATE INDEX idempotency_keys_completer_idx ON idempotency_keys (tenant_id, completer_state)
    WHERE completer_state IS NOT NULL;

-- The completer's attempts go to the audit log beside a person's
-- resolutions, one entry per attempt written with its outcome.
ALTER TABLE key_audit DROP CONSTRAINT key_audit_action_check;
ALTER TABLE key_audit ADD CONSTRAINT key_audit_action_check CHECK (action IN (
    'release', 'complete', 'review',
    'completer_completed', 'completer_released', 'completer_unknown', 'completer_review'));

-- +goose Down
DROP INDEX idempotency_keys_completer_idx;
DELETE FROM key_audit WHERE action LIKE 'completer_%';
ALTER TABLE key_audit DROP CONSTRAINT key_audit_action_check;
ALTER TABLE key_audit ADD CONSTRAINT key_audit_action_check CHECK (action IN ('release', 'complete', 'review'));
ALTER TABLE idempotency_keys DROP COLUMN completer_deadline;
ALTER TABLE idempotency_keys DROP COLUMN completer_next_at;
ALTER TABLE idempotency_keys DROP COLUMN completer_attempts;
ALTER TABLE idempotency_keys DROP COLUMN completer_id;
ALTER TABLE idempotency_keys DROP COLUMN completer_state;
DROP TABLE completers;
