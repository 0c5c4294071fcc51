-- +goose Up

-- ledger_rollbacks records each time a replica found the fencing token
-- source (fencing_counter) below a token it had seen issued: the database
-- went back in time — an older copy of the file put back, a restore — and
-- lost acknowledged writes, so keys completed before would run again and
-- tokens already given out would be given out again. While a row has no
-- acknowledged_at, the server refuses key writes (503 store_unavailable)
-- and GET /readyz answers 503; `idem ledger acknowledge-rollback` sets it,
-- after moving the counter past every seen_token. The detecting replica
-- writes the row after the rollback, so the restored file has it too.
-- Times are unix microseconds, as everywhere.
CREATE TABLE ledger_rollbacks (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    detected_at     INTEGER NOT NULL,
    replica         TEXT    NOT NULL,
    seen_token      INTEGER NOT NULL,
    source_token    INTEGER NOT NULL,
    acknowledged_at INTEGER,
    acknowledged_by TEXT
);

-- +goose Down
DROP TABLE ledger_rollbacks;
