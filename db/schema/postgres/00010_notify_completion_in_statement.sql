-- +goose Up

-- The AFTER UPDATE trigger of 00008 cost every statement that can update a
-- record, waited on or not: PostgreSQL reads a trigger's WHEN clause from
-- its catalog text and plans it again on each execution, and a claim's
-- ON CONFLICT DO UPDATE sets the trigger up as well. Measured with one
-- client (scripts/bench-ledger, BENCH_LEDGER_DECOMPOSE=1), 8.6 µs of the
-- pair's executor time, a third of what a minimal ledger spends in all.
-- The two statements that complete a record in flight (CompleteKey,
-- ResolveCompleteKey) now send the notification themselves when the row
-- is waited on, through idem_notify_key: it is queued by the statement and
-- delivered when the transaction commits, as the trigger's was, and the
-- flag is read from the row the statement locks, so a Watch either lands
-- before (and is notified) or finds the key no longer in flight. The
-- delete trigger stays: deletions (release, reap, a tenant's cascade) are
-- off the claim and complete path and come from more places. While a
-- rolling upgrade runs, a server of the previous version completes without
-- notifying: its waiters then answer at the end of their wait
-- (request_in_flight, safe to retry) instead of at once.
-- +goose StatementBegin
CREATE FUNCTION idem_notify_key(text, text) RETURNS boolean LANGUAGE sql VOLATILE AS $$
    SELECT pg_notify('idem_keys', current_schema() || E'\n' || $1 || E'\n' || $2);
    SELECT true;
$$;
-- +goose StatementEnd

DROP TRIGGER idempotency_keys_completed_notify ON idempotency_keys;

-- +goose Down
CREATE TRIGGER idempotency_keys_completed_notify
    AFTER UPDATE ON idempotency_keys
    FOR EACH ROW WHEN (OLD.waited AND OLD.state = 'in_flight' AND NEW.state = 'completed')
    EXECUTE FUNCTION idem_notify_key_changed();

DROP FUNCTION idem_notify_key(text, text);
