-- The owner's numbers go into a journal, not into the rows. Numbering
-- by UPDATE wrote each pending row a second time: key_seq is indexed, so
-- the update was never HOT, and every number cost a new version of the
-- whole row (payload included) and an entry in each of its indexes,
-- about 1,200 B of WAL per message, and a PL/pgSQL loop of four
-- statements per key.
--
-- outbox_numbers holds a number per row that the owner numbered and no
-- owner write has written back yet: a narrow row and two index entries.
-- The relay's read takes a row's key_seq from there (or from the row,
-- numbered by the trigger or written back), and every owner write that
-- changes the row anyway writes its key_seq into it and deletes the
-- journal entry in the same statement: the mark (not HOT either way, as
-- processed_at ends the row's pending index entries), the failure record
-- and park, and the hold behind a parked row. So an entry lives from the
-- read that numbered the row to the mark that published it, and a row
-- that is parked, held, dead or processed has its key_seq in the row.
-- Anything else that reads a pending row's key_seq reads
-- coalesce(o.key_seq, n.key_seq).
--
-- A row deleted by hand while journaled leaves its entry behind: it
-- names a key_seq no row holds (a gap, as any deleted row leaves), and
-- the read treats it as not pending.
CREATE TABLE outbox_numbers (
    id             uuid   PRIMARY KEY,
    partition      int    NOT NULL,
    correlation_id text   NOT NULL,
    key_seq        bigint NOT NULL,
    CONSTRAINT outbox_numbers_key_seq_key UNIQUE (correlation_id, key_seq)
);

-- outbox_journal_rows numbers, in outbox_numbers, the pending rows of
-- each partition partitions[i] up to seq up_to[i] (NULL: no bound) that
-- have no key_seq in the row or in the journal and are neither parked nor
-- held, while node holds the partition, and returns how many rows it
-- numbered or parked. The rules are outbox_number_rows's (migration 16):
-- the lease rows locked FOR SHARE in partition order until the numbers
-- commit, each key's rows numbered in seq order and its counter moved
-- once (counters locked in key order), rows the trigger would have
-- refused parked unnumbered with the reason. It is one set-wise
-- statement whatever the number of keys: the counters move in one
-- INSERT ... ON CONFLICT, the numbers go in one INSERT.
--
-- A key whose rows are in two partitions of one call is numbered in its
-- counter's partition (the partition of its earlier rows), or for a new
-- key in the lowest; its rows in the other partition are parked.
CREATE FUNCTION outbox_journal_rows(node text, partitions int[], up_to bigint[]) RETURNS bigint
LANGUAGE plpgsql SET enable_seqscan = off AS $$
DECLARE
    held int[];
    total bigint;
BEGIN
    SELECT coalesce(array_agg(l.partition), '{}') INTO held FROM (
        SELECT partition FROM ordo_leases
        WHERE owner = node AND partition = ANY(partitions)
        ORDER BY partition
        FOR SHARE) AS l;
    IF cardinality(held) = 0 THEN
        RETURN 0;
    END IF;
    -- One numbering of a partition at a time (two reads of one node
    -- would both count the same rows), in partition order. The lock
    -- class is 'ordn'.
    PERFORM pg_advisory_xact_lock(1869767790, s.p) FROM (SELECT p FROM unnest(held) AS p ORDER BY p) AS s;
    WITH b AS (
        SELECT u.part, max(coalesce(u.top, 9223372036854775807)) AS top
        FROM unnest(partitions, up_to) AS u(part, top)
        WHERE u.part = ANY(held) GROUP BY u.part
    ), c AS (
        SELECT x.id, x.correlation_id AS key, x.partition AS part, x.seq,
               CASE WHEN octet_length(x.correlation_id) NOT BETWEEN 1 AND 255 THEN 'correlation_id must be 1 to 255 bytes'
                    WHEN octet_length(x.exchange) > 255 THEN 'exchange is longer than 255 bytes'
                    WHEN octet_length(x.routing_key) > 255 THEN 'routing_key is longer than 255 bytes'
                    WHEN octet_length(x.type) > 255 THEN 'type is longer than 255 bytes'
                    WHEN jsonb_typeof(x.headers) <> 'object' THEN 'headers must be a JSON object' END AS refused
        FROM b JOIN outbox AS x ON x.partition = b.part AND x.processed_at IS NULL AND x.seq <= b.top
        WHERE x.key_seq IS NULL AND x.parked_at IS NULL AND x.held_behind IS NULL
          AND NOT EXISTS (SELECT 1 FROM outbox_numbers AS n WHERE n.id = x.id)
    ), w AS (
        -- Each row with its key's home: the counter's partition, or for a
        -- new key the lowest partition its acceptable rows are in.
        SELECT c.id, c.key, c.part, c.seq, c.refused,
               coalesce(ck.partition, min(c.part) FILTER (WHERE c.refused IS NULL) OVER (PARTITION BY c.key)) AS home
        FROM c LEFT JOIN outbox_keys AS ck ON ck.correlation_id = c.key
    ), r AS (
        -- The rows to number: each key's place among them (rn) and count.
        SELECT w.id, w.key, w.part, row_number() OVER (PARTITION BY w.key ORDER BY w.seq) AS rn,
               count(*) OVER (PARTITION BY w.key) AS n
        FROM w WHERE w.refused IS NULL AND w.part = w.home
    ), up AS (
        INSERT INTO outbox_keys AS ck (correlation_id, last_key_seq, partition)
        SELECT r.key, r.n, r.part FROM r WHERE r.rn = 1 ORDER BY r.key
        ON CONFLICT (correlation_id) DO UPDATE
            SET last_key_seq = ck.last_key_seq + EXCLUDED.last_key_seq,
                partition = coalesce(ck.partition, EXCLUDED.partition)
            WHERE ck.partition IS NULL OR ck.partition = EXCLUDED.partition
        RETURNING ck.correlation_id AS key, ck.last_key_seq AS top
    ), m AS (
        -- Each moved counter's new value, by key: a lookup, not a join
        -- (the planner cannot know these sets' sizes, and a nested loop
        -- over two of them costs rows times keys).
        SELECT coalesce(jsonb_object_agg(up.key, up.top), '{}') AS tops FROM up
    ), numbered AS (
        INSERT INTO outbox_numbers (id, partition, correlation_id, key_seq)
        SELECT r.id, r.part, r.key, (m.tops ->> r.key)::bigint - r.n + r.rn
        FROM r CROSS JOIN m
        WHERE m.tops ? r.key
        RETURNING 1
    ), parked AS (
        UPDATE outbox AS o SET parked_at = clock_timestamp(), last_error = CASE
                WHEN w.refused IS NOT NULL THEN 'outbox: row refused: ' || w.refused || ' (docs/outbox-table.md)'
                ELSE format('outbox: row refused: correlation_id %s belongs to partition %s (its earlier rows), '
                    'but this row says partition %s; partition must be xxhash64(correlation_id) mod P (docs/outbox-table.md)',
                    quote_literal(w.key), w.home, w.part) END
        FROM w CROSS JOIN m
        WHERE o.id = w.id AND o.processed_at IS NULL AND o.parked_at IS NULL
          AND (w.refused IS NOT NULL OR w.part <> w.home OR NOT m.tops ? w.key)
        RETURNING 1
    )
    SELECT (SELECT count(*) FROM numbered) + (SELECT count(*) FROM parked) INTO total;
    RETURN total;
END
$$;

-- Relays older than this migration number rows with outbox_number_rows
-- and read key_seq from the row. When one takes over a partition whose
-- rows are journaled, the function first writes the journal's numbers of
-- that partition into the rows (they keep their numbers) and deletes the
-- entries, and then numbers the rest as before.
ALTER FUNCTION outbox_number_rows(text, int[], bigint[]) RENAME TO outbox_number_unjournaled_rows;

CREATE FUNCTION outbox_number_rows(node text, partitions int[], up_to bigint[]) RETURNS bigint
LANGUAGE plpgsql SET enable_seqscan = off AS $$
DECLARE
    held int[];
BEGIN
    SELECT coalesce(array_agg(l.partition), '{}') INTO held FROM (
        SELECT partition FROM ordo_leases
        WHERE owner = node AND partition = ANY(partitions)
        ORDER BY partition
        FOR SHARE) AS l;
    WITH j AS (
        DELETE FROM outbox_numbers AS n WHERE n.partition = ANY(held)
        RETURNING n.id, n.key_seq
    )
    UPDATE outbox AS o SET key_seq = j.key_seq
    FROM j WHERE o.id = j.id AND o.key_seq IS NULL;
    RETURN outbox_number_unjournaled_rows(node, partitions, up_to);
END
$$;
