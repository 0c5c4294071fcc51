-- +goose Up

-- Claims waiting on a key in flight (wait_seconds) are woken by a NOTIFY on
-- the channel idem_keys when the key is completed or deleted (released,
-- reaped, its tenant deleted). The triggers send it from the statement that
-- makes the change, so it is delivered exactly when that transaction
-- commits and never for one that rolls back. The payload is
-- "schema\ntenant\nkey": one server may hold several ledgers in different
-- schemas, and every listener keeps only its own.
-- +goose StatementBegin
CREATE FUNCTION idem_notify_key_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('idem_keys', TG_TABLE_SCHEMA || E'\n' || OLD.tenant_id || E'\n' || OLD.key);
    RETURN NULL;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER idempotency_keys_completed_notify
    AFTER UPDATE ON idempotency_keys
    FOR EACH ROW WHEN (OLD.state = 'in_flight' AND NEW.state = 'completed')
    EXECUTE FUNCTION idem_notify_key_changed();

CREATE TRIGGER idempotency_keys_deleted_notify
    AFTER DELETE ON idempotency_keys
    FOR EACH ROW
    EXECUTE FUNCTION idem_notify_key_changed();

-- +goose Down
DROP TRIGGER idempotency_keys_deleted_notify ON idempotency_keys;
DROP TRIGGER idempotency_keys_completed_notify ON idempotency_keys;
DROP FUNCTION idem_notify_key_changed();
