-- A producer that retries an INSERT with the same id (for example with
-- ON CONFLICT (id) DO NOTHING) must not consume a key_seq: the BEFORE
-- trigger runs before the conflict check, so it now skips a row whose id
-- already exists instead of counting it. (Two concurrent first inserts of
-- one id can still both reach the counter; retry only after the first
-- attempt's transaction has ended.)
CREATE OR REPLACE FUNCTION outbox_assign_key_seq() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM outbox WHERE id = NEW.id) THEN
        RETURN NULL; -- the row is there already: nothing to insert, nothing to count
    END IF;
    INSERT INTO outbox_keys AS k (correlation_id, last_key_seq)
    VALUES (NEW.correlation_id, 1)
    ON CONFLICT (correlation_id) DO UPDATE SET last_key_seq = k.last_key_seq + 1
    RETURNING k.last_key_seq INTO NEW.key_seq;
    NEW.occurred_at := clock_timestamp();
    RETURN NEW;
END
$$;
