-- A cheaper key_seq, same contract: what the producer's INSERT
-- pays besides its own row, measured with `go run ./bench produce`
-- (docs/performance.md).
--
-- 1. The key's counter is bumped with a plain UPDATE, and only a key's
--    first row takes the INSERT ... ON CONFLICT path. An upsert that finds
--    the row locks it first (one more WAL record, heap_lock_tuple) and
--    then updates it; an UPDATE does both in one step. Its row lock, held
--    until commit, still serialises the key's producers, and under READ
--    COMMITTED a waiting UPDATE increments the version the lock holder
--    committed, so commit order = key_seq order as before.
-- 2. outbox_keys keeps half of every page free, so that a counter's new
--    version fits on its own page (a HOT update: no new primary key
--    entry, no extra WAL). Pages written before this migration fill up
--    as they were; each counter moves to a roomier page at its first
--    update that does not fit.
-- 3. The unique index on seq goes: no reader looks rows up by seq alone
--    (the relay and the backlog read (partition, seq) among pending rows:
--    outbox_pending_by_partition), the identity column hands out each
--    value once, and every insert maintained it.
-- 4. The five CHECK constraints on what a producer writes (the lengths of
--    correlation_id, exchange, routing_key and type; headers an object)
--    become checks in this trigger, with the same names and SQLSTATE
--    23514. PostgreSQL 15 parses and prepares every CHECK constraint of a
--    table anew for each INSERT statement (measured here: 8 constraints
--    cost a one-row INSERT about 20 µs of CPU, as much as the rest of a
--    classic outbox's insert); the trigger's checks are compiled once per
--    session. Nothing but an INSERT writes these columns. The checks on
--    relay bookkeeping (outbox_attempts_nonnegative,
--    outbox_dead_is_processed) and outbox_partition_range (it depends on
--    P) stay constraints.
--
-- The "id exists?" probe (0006, moved after the counter lock by 0007)
-- stays: it is what keeps a retried INSERT ... ON CONFLICT (id) DO NOTHING
-- from consuming a key_seq, and it is one probe of a primary key page the
-- insert itself is about to touch. SET enable_seqscan = off (0008) stays
-- too: it also keeps the UPDATE's generic plan on the counter's primary
-- key when outbox_keys looked empty at planning.
ALTER TABLE outbox_keys SET (fillfactor = 50);

ALTER TABLE outbox
    DROP CONSTRAINT outbox_seq_key,
    DROP CONSTRAINT outbox_correlation_id_length,
    DROP CONSTRAINT outbox_exchange_length,
    DROP CONSTRAINT outbox_routing_key_length,
    DROP CONSTRAINT outbox_type_length,
    DROP CONSTRAINT outbox_headers_object;

CREATE OR REPLACE FUNCTION outbox_assign_key_seq() RETURNS trigger
LANGUAGE plpgsql SET enable_seqscan = off AS $$
DECLARE
    key_partition int;
    refused text;
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
