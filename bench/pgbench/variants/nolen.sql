-- m11's trigger without the length/headers checks
CREATE OR REPLACE FUNCTION outbox_assign_key_seq() RETURNS trigger
LANGUAGE plpgsql SET enable_seqscan = off AS $$
DECLARE
    key_partition int;
    refused text;
BEGIN
    UPDATE outbox_keys
        SET last_key_seq = last_key_seq + 1,
            partition = coalesce(partition, NEW.partition)
        WHERE correlation_id = NEW.correlation_id
        RETURNING last_key_seq, partition INTO NEW.key_seq, key_partition;
    IF NOT FOUND THEN
        -- The key's first row (or two first rows racing: the loser waits
        -- for the winner's commit and then takes the update branch).
        INSERT INTO outbox_keys AS k (correlation_id, last_key_seq, partition)
        VALUES (NEW.correlation_id, 1, NEW.partition)
        ON CONFLICT (correlation_id) DO UPDATE
            SET last_key_seq = k.last_key_seq + 1,
                partition = coalesce(k.partition, EXCLUDED.partition)
        RETURNING k.last_key_seq, k.partition INTO NEW.key_seq, key_partition;
    END IF;
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
