-- A cheaper INSERT, same contract: the wake-up leaves the
-- statement trigger. Measured in one backend, one-row transactions,
-- variants alternating (bench/pgbench/alternate.sh; docs/outbox-table.md,
-- "What an insert costs").
--
-- 1. The wake-up moves from the statement-level AFTER INSERT trigger
--    (outbox_notify, migration 10) into the row trigger, with the same
--    rule: for each partition a transaction writes to, try the advisory
--    lock (1869767791, partition) shared; if a relay holds it (it is idle
--    and armed the partition), notify instead. The statement trigger
--    cost a one-row INSERT about 20 us of CPU (a transition table, a
--    second PL/pgSQL call, a query over the new rows); the same test in
--    the row trigger costs about nothing. A transaction tries each
--    partition once, and holds at most 16 of these locks: it notifies
--    the other partitions it writes to without a lock, as a statement
--    over more than 16 partitions did. It keeps the partitions it has
--    passed in the transaction-local setting ordo.woken_partitions
--    (",3,17,"); a producer must not set it.
-- 2. The CHECK constraints left on outbox stay. PostgreSQL 15 prepares
--    every CHECK constraint of a table anew for each INSERT or UPDATE
--    statement (the three cost a one-row INSERT about 5 us of CPU), but
--    moving outbox_attempts_nonnegative and outbox_dead_is_processed
--    into a BEFORE UPDATE trigger makes every relay mark lock its row
--    first: one more WAL record (~54 B) per marked row, measured with
--    pg_walinspect, paid in the same database. outbox_partition_range
--    stays too: checking it in the trigger needs P, and a read of
--    ordo_settings there (under the trigger's enable_seqscan = off) was
--    JIT-compiled for every key's first row.
--
-- The id probe, the length checks and SET enable_seqscan = off stay
-- (migrations 7, 11 and 8: each is pinned by a test, and together they
-- cost a few us).
DROP TRIGGER outbox_notify ON outbox;
DROP FUNCTION outbox_notify();

CREATE OR REPLACE FUNCTION outbox_assign_key_seq() RETURNS trigger
LANGUAGE plpgsql SET enable_seqscan = off AS $$
DECLARE
    key_partition int;
    refused text;
    woken text;
BEGIN
    -- The former CHECK constraints, first: a refused row touches no counter.
    IF octet_length(NEW.correlation_id) NOT BETWEEN 1 AND 255 OR octet_length(NEW.exchange) > 255
            OR octet_length(NEW.routing_key) > 255 OR octet_length(NEW.type) > 255
            OR jsonb_typeof(NEW.headers) <> 'object' THEN
        refused := CASE
            WHEN octet_length(NEW.correlation_id) NOT BETWEEN 1 AND 255 THEN 'outbox_correlation_id_length'
            WHEN octet_length(NEW.exchange) > 255 THEN 'outbox_exchange_length'
            WHEN octet_length(NEW.routing_key) > 255 THEN 'outbox_routing_key_length'
            WHEN octet_length(NEW.type) > 255 THEN 'outbox_type_length'
            ELSE 'outbox_headers_object' END;
        RAISE EXCEPTION 'new row for relation "outbox" violates check constraint "%"', refused
            USING ERRCODE = 'check_violation', CONSTRAINT = refused, TABLE = 'outbox',
                  HINT = 'correlation_id is 1 to 255 bytes; exchange, routing_key and type at most 255; headers a JSON object; see docs/outbox-table.md';
    END IF;
    UPDATE outbox_keys
        SET last_key_seq = last_key_seq + 1
        WHERE correlation_id = NEW.correlation_id AND partition IS NOT NULL
        RETURNING last_key_seq, partition INTO NEW.key_seq, key_partition;
    IF NOT FOUND THEN
        -- The key's first row (or two first rows racing: the loser waits
        -- for the winner's commit and then takes the update branch), or
        -- a counter row without a partition: this row's becomes the key's.
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
    -- Wake a relay that waits for this partition, once per partition and
    -- transaction: the shared lock, held until the transaction ends, or,
    -- if a relay armed the partition (or this transaction already holds
    -- 16 of these locks), a notification.
    woken := coalesce(nullif(current_setting('ordo.woken_partitions', true), ''), ',');
    IF position(',' || NEW.partition || ',' IN woken) = 0 THEN
        IF length(woken) - length(replace(woken, ',', '')) > 16
                OR NOT pg_try_advisory_xact_lock_shared(1869767791, NEW.partition) THEN
            PERFORM pg_notify('ordo_outbox', NEW.partition::text);
        END IF;
        woken := set_config('ordo.woken_partitions', woken || NEW.partition || ',', true);
    END IF;
    NEW.occurred_at := clock_timestamp();
    RETURN NEW;
END
$$;
