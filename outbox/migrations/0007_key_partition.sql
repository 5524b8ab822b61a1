-- A key's rows all go to one partition, or its order is lost: a plain
-- INSERT whose partition disagrees with the key's earlier rows is refused.
-- The key's partition is kept in its counter row, which the BEFORE INSERT
-- trigger already upserts and locks, so the check costs one column of a
-- row already written.
--
-- Existing keys get the partition of their latest row (the one producers
-- write to now, if a key is already split). A key whose rows are all gone
-- (retention) stays NULL, and its next row sets it.
ALTER TABLE outbox_keys ADD COLUMN partition int;

UPDATE outbox_keys k SET partition = (
    SELECT o.partition FROM outbox o
    WHERE o.correlation_id = k.correlation_id
    ORDER BY o.key_seq DESC LIMIT 1);

-- The same function also closes the gap migration 0006 left: a retried
-- INSERT of an id whose first attempt was still uncommitted passed the
-- "id exists?" check, waited for the key's counter lock, took the next
-- key_seq and was then dropped by ON CONFLICT, leaving that key_seq to no
-- row (consumers wait for it forever). The check now runs after the
-- counter lock, when a first attempt that held it has ended (each
-- statement of the function sees what committed before it); a repeated id
-- gives its counter step back under that same lock.
--
-- SET enable_seqscan = off is migration 0008's setting, kept here because
-- CREATE OR REPLACE resets it and a database already at 0008 applies this
-- migration after it.
CREATE OR REPLACE FUNCTION outbox_assign_key_seq() RETURNS trigger
LANGUAGE plpgsql SET enable_seqscan = off AS $$
DECLARE
    key_partition int;
BEGIN
    INSERT INTO outbox_keys AS k (correlation_id, last_key_seq, partition)
    VALUES (NEW.correlation_id, 1, NEW.partition)
    ON CONFLICT (correlation_id) DO UPDATE
        SET last_key_seq = k.last_key_seq + 1,
            partition = coalesce(k.partition, EXCLUDED.partition)
    RETURNING k.last_key_seq, k.partition INTO NEW.key_seq, key_partition;
    IF EXISTS (SELECT 1 FROM outbox WHERE id = NEW.id) THEN
        -- The row is there already: nothing to insert, nothing to count.
        IF NEW.key_seq = 1 THEN
            DELETE FROM outbox_keys WHERE correlation_id = NEW.correlation_id;
        ELSE
            UPDATE outbox_keys SET last_key_seq = last_key_seq - 1 WHERE correlation_id = NEW.correlation_id;
        END IF;
        RETURN NULL;
    END IF;
    IF key_partition IS DISTINCT FROM NEW.partition THEN
        -- The statement fails, so the counter's increment is undone too.
        RAISE EXCEPTION 'outbox: correlation_id % belongs to partition % (its earlier rows), but this row says partition %',
                quote_literal(NEW.correlation_id), key_partition, NEW.partition
            USING ERRCODE = 'check_violation', CONSTRAINT = 'outbox_key_partition',
                  TABLE = 'outbox', COLUMN = 'partition',
                  HINT = 'partition must be xxhash64(correlation_id) mod P for every row of a key; see docs/outbox-table.md';
    END IF;
    NEW.occurred_at := clock_timestamp();
    RETURN NEW;
END
$$;
