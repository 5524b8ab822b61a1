-- The partition owner numbers a key's rows (docs/outbox-table.md, "Who
-- numbers a key's rows"). A row may arrive without key_seq (NULL): the
-- relay that holds its partition gives it the key's next numbers, in seq
-- order among the key's rows it sees committed, before it publishes any
-- of them, and writes them into the rows (durable: a republish, by this
-- node or the next owner, carries the same key_seq and prev).
--
-- While the BEFORE INSERT trigger outbox_assign_key_seq is installed it
-- still numbers every row, and nothing changes. Once no relay older than
-- this migration runs, an operator drops it (`node drop-key-seq-trigger`,
-- outbox.DropKeySeqTrigger): producers' INSERTs then pay no trigger.
--
-- occurred_at, which the trigger sets, gets the same value as a default:
-- without the trigger a producer may also supply its own.
ALTER TABLE outbox
    ALTER COLUMN key_seq DROP NOT NULL,
    ALTER COLUMN occurred_at SET DEFAULT clock_timestamp();

-- The relays that number rows: a relay's Store records its node here
-- before its first read. outbox.DropKeySeqTrigger refuses while a node
-- that holds a lease is not listed (an older relay, which cannot read a
-- row without key_seq).
CREATE TABLE ordo_numbering_nodes (
    node     text        PRIMARY KEY,
    since    timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- outbox_number_keys numbers the unnumbered pending rows of keys (each
-- given with the partition it was read in, keys[i] in key_partitions[i])
-- while node holds that partition, and returns how many rows it numbered
-- or parked. The lease rows are locked FOR SHARE, in partition order (as
-- every relay write locks them), until the numbers commit: no other node
-- can claim the partition, and so number its rows, meanwhile. Counters
-- are locked in key order.
--
-- For each key: every pending row of the key in that partition without a
-- key_seq and not parked, as this statement sees them committed, gets the
-- next numbers in seq order, and the key's counter (outbox_keys) moves
-- once. A row the producer's trigger would have refused is parked instead,
-- unnumbered, with the reason in last_error: a correlation_id, exchange,
-- routing_key or type too long, headers not an object, or a partition other
-- than the key's (the partition of its earlier rows).
CREATE FUNCTION outbox_number_keys(node text, key_partitions int[], keys text[]) RETURNS bigint
LANGUAGE plpgsql SET enable_seqscan = off AS $$
DECLARE
    held int[];
    k record;
    base bigint;
    key_partition int;
    created boolean;
    top bigint;
    n bigint;
    total bigint := 0;
BEGIN
    SELECT coalesce(array_agg(l.partition), '{}') INTO held FROM (
        SELECT partition FROM ordo_leases
        WHERE owner = node AND partition = ANY(key_partitions)
        ORDER BY partition
        FOR SHARE) AS l;
    FOR k IN SELECT DISTINCT u.key, u.part FROM unnest(keys, key_partitions) AS u(key, part)
             WHERE u.part = ANY(held) ORDER BY u.key, u.part LOOP
        -- Rows the trigger would have refused: parked, unnumbered.
        UPDATE outbox AS o SET parked_at = clock_timestamp(), last_error = 'outbox: row refused: ' || CASE
                WHEN octet_length(o.correlation_id) NOT BETWEEN 1 AND 255 THEN 'correlation_id must be 1 to 255 bytes'
                WHEN octet_length(o.exchange) > 255 THEN 'exchange is longer than 255 bytes'
                WHEN octet_length(o.routing_key) > 255 THEN 'routing_key is longer than 255 bytes'
                WHEN octet_length(o.type) > 255 THEN 'type is longer than 255 bytes'
                ELSE 'headers must be a JSON object' END || ' (docs/outbox-table.md)'
        WHERE o.correlation_id = k.key AND o.key_seq IS NULL AND o.partition = k.part
          AND o.processed_at IS NULL AND o.parked_at IS NULL
          AND (octet_length(o.correlation_id) NOT BETWEEN 1 AND 255 OR octet_length(o.exchange) > 255
               OR octet_length(o.routing_key) > 255 OR octet_length(o.type) > 255
               OR jsonb_typeof(o.headers) <> 'object');
        GET DIAGNOSTICS n = ROW_COUNT;
        total := total + n;

        created := false;
        SELECT c.last_key_seq, c.partition INTO base, key_partition
        FROM outbox_keys AS c WHERE c.correlation_id = k.key FOR UPDATE;
        IF NOT FOUND THEN
            -- The key's first row: a counter at 1 holds its place until
            -- the rows are numbered (last_key_seq is positive).
            INSERT INTO outbox_keys (correlation_id, last_key_seq, partition) VALUES (k.key, 1, k.part)
            ON CONFLICT (correlation_id) DO NOTHING;
            IF FOUND THEN
                base := 0;
                key_partition := k.part;
                created := true;
            ELSE
                -- Another node created it meanwhile (and committed).
                SELECT c.last_key_seq, c.partition INTO base, key_partition
                FROM outbox_keys AS c WHERE c.correlation_id = k.key FOR UPDATE;
            END IF;
        END IF;

        IF key_partition IS NOT NULL AND key_partition <> k.part THEN
            UPDATE outbox AS o SET parked_at = clock_timestamp(),
                last_error = format('outbox: row refused: correlation_id %s belongs to partition %s (its earlier rows), '
                    'but this row says partition %s; partition must be xxhash64(correlation_id) mod P (docs/outbox-table.md)',
                    quote_literal(k.key), key_partition, k.part)
            WHERE o.correlation_id = k.key AND o.key_seq IS NULL AND o.partition = k.part
              AND o.processed_at IS NULL AND o.parked_at IS NULL;
            GET DIAGNOSTICS n = ROW_COUNT;
            total := total + n;
            CONTINUE;
        END IF;

        WITH s AS (
            SELECT x.id, row_number() OVER (ORDER BY x.seq) AS rn FROM outbox AS x
            WHERE x.correlation_id = k.key AND x.key_seq IS NULL AND x.partition = k.part
              AND x.processed_at IS NULL AND x.parked_at IS NULL
        ), numbered AS (
            UPDATE outbox AS o SET key_seq = base + s.rn
            FROM s
            WHERE o.id = s.id AND o.key_seq IS NULL AND o.processed_at IS NULL AND o.parked_at IS NULL
            RETURNING s.rn
        )
        SELECT coalesce(max(rn), 0), count(*) INTO top, n FROM numbered;
        total := total + n;
        IF top = 0 THEN
            IF created THEN
                DELETE FROM outbox_keys WHERE correlation_id = k.key;
            END IF;
            CONTINUE;
        END IF;
        -- The highest number handed out: a row that vanished meanwhile
        -- leaves a gap, never a number given twice.
        UPDATE outbox_keys SET last_key_seq = base + top, partition = coalesce(partition, k.part)
        WHERE correlation_id = k.key;
    END LOOP;
    RETURN total;
END
$$;
