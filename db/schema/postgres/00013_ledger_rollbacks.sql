-- +goose Up

-- ledger_rollbacks records each time a replica found the fencing token
-- source (the fencing_tokens sequence) below a token it had seen issued:
-- the database went back in time — a failover to a standby that had not
-- received the latest commits, a restore of an older backup — and lost
-- acknowledged writes, so keys completed before would run again and tokens
-- already given out would be given out again. While a row has no
-- acknowledged_at, every replica refuses key writes (503 store_unavailable)
-- and GET /readyz answers 503; `idem ledger acknowledge-rollback` sets it,
-- after moving the sequence past every seen_token. The detecting replica
-- writes the row after the rollback, so a restored database has it too.
CREATE TABLE ledger_rollbacks (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    detected_at     timestamptz NOT NULL,
    replica         text        NOT NULL,
    seen_token      bigint      NOT NULL,
    source_token    bigint      NOT NULL,
    acknowledged_at timestamptz,
    acknowledged_by text
);

-- +goose Down
DROP TABLE ledger_rollbacks;
