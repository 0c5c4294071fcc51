-- +goose Up

-- PostgreSQL serialises the commits of all transactions that NOTIFY (one
-- lock on the notification queue, held across the commit), so the triggers
-- of 00007 firing on every complete and delete halved the ledger's write
-- rate while almost no key has a waiter. A claim that waits on a key in
-- flight now first sets waited on its row (Store.Watch; both writes lock
-- the row, so either the flag is set before the complete or delete, which
-- then notifies, or the waiter sees the key no longer in flight and claims
-- again at once). Nothing resets the flag: a waiter may keep waiting across
-- a takeover, and a spurious notification only costs a claim.
ALTER TABLE idempotency_keys ADD COLUMN waited boolean NOT NULL DEFAULT false;

DROP TRIGGER idempotency_keys_completed_notify ON idempotency_keys;
CREATE TRIGGER idempotency_keys_completed_notify
    AFTER UPDATE ON idempotency_keys
    FOR EACH ROW WHEN (OLD.waited AND OLD.state = 'in_flight' AND NEW.state = 'completed')
    EXECUTE FUNCTION idem_notify_key_changed();

DROP TRIGGER idempotency_keys_deleted_notify ON idempotency_keys;
CREATE TRIGGER idempotency_keys_deleted_notify
    AFTER DELETE ON idempotency_keys
    FOR EACH ROW WHEN (OLD.waited)
    EXECUTE FUNCTION idem_notify_key_changed();

-- +goose Down
DROP TRIGGER idempotency_keys_deleted_notify ON idempotency_keys;
CREATE TRIGGER idempotency_keys_deleted_notify
    AFTER DELETE ON idempotency_keys
    FOR EACH ROW
    EXECUTE FUNCTION idem_notify_key_changed();

DROP TRIGGER idempotency_keys_completed_notify ON idempotency_keys;
CREATE TRIGGER idempotency_keys_completed_notify
    AFTER UPDATE ON idempotency_keys
    FOR EACH ROW WHEN (OLD.state = 'in_flight' AND NEW.state = 'completed')
    EXECUTE FUNCTION idem_notify_key_changed();

ALTER TABLE idempotency_keys DROP COLUMN waited;
