-- The owner's numbering holds a parked key's new rows itself. A row
-- committed to a key whose parked row still waits for an operator went
-- into the journal, came back in the next read behind the parked row,
-- and was then held by the read (its number written into the row, its
-- journal entry deleted): a journal entry written and deleted, and a
-- read, for each such row. The numbering now writes such rows' numbers
-- into the rows and holds them behind the key's parked row in the same
-- statement, the parked row locked FOR SHARE as the read's hold locks it
-- (docs/outbox-table.md, "Rows held behind a parked row"). Rules, order
-- and result are otherwise migration 22's.
CREATE OR REPLACE FUNCTION outbox_journal_rows(node text, partitions int[], up_to bigint[]) RETURNS bigint
LANGUAGE plpgsql SET enable_seqscan = off AS $$
DECLARE
    held int[];
    total bigint;
    park uuid[];
    errors text[];
    parked bigint;
    by_range boolean;
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
    -- Each partition walked by a range scan of its own, unless
    -- outbox_pending_by_partition is there and the outbox has statistics:
    -- that index covers the parked and held rows too, and beside a sparse
    -- outbox_ready_by_partition (rows parked or published since it was
    -- built) the planner costs it cheaper for one partition's range and
    -- would walk them. The join then costs the whole scan of each, and
    -- picks the ready index.
    SELECT to_regclass('outbox_pending_by_partition') IS NULL OR c.reltuples < 0 INTO by_range
    FROM pg_class AS c WHERE c.oid = 'outbox'::regclass;
    IF by_range THEN
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
            FROM b CROSS JOIN LATERAL (
                SELECT y.id, y.correlation_id, y.partition, y.seq, y.exchange, y.routing_key, y.type, y.headers
                FROM outbox AS y
                WHERE y.partition = b.part AND y.processed_at IS NULL AND y.parked_at IS NULL
                  AND y.held_behind IS NULL AND y.key_seq IS NULL AND y.seq <= b.top
                ORDER BY y.seq
                OFFSET 0) AS x
            LEFT JOIN LATERAL (
                SELECT true AS numbered FROM outbox_numbers AS n WHERE n.id = x.id
                LIMIT 1) AS j ON true
            WHERE j.numbered IS NULL
        ), w AS (
            -- Each row with its key's home: the counter's partition, or for a
            -- new key the lowest partition its acceptable rows are in.
            SELECT c.id, c.key, c.part, c.seq, c.refused,
                   coalesce(ck.partition, min(c.part) FILTER (WHERE c.refused IS NULL) OVER (PARTITION BY c.key)) AS home,
                   ck.correlation_id IS NOT NULL AS known
            FROM c LEFT JOIN outbox_keys AS ck ON ck.correlation_id = c.key
        ), r AS (
            -- The rows to number: each key's place among them (rn) and count.
            SELECT w.id, w.key, w.part, w.known, row_number() OVER (PARTITION BY w.key ORDER BY w.seq) AS rn,
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
        ), pp AS MATERIALIZED (
            -- The partitions numbered here that hold a parked row (one
            -- probe of outbox_parked each, once: inlined, the probe ran
            -- for every row and partition): only their keys can have one,
            -- and most calls look at no key.
            SELECT coalesce(array_agg(rp.part), '{}') AS parts FROM (SELECT DISTINCT r.part FROM r WHERE r.known) AS rp
            WHERE EXISTS (SELECT 1 FROM outbox AS z
                          WHERE z.partition = rp.part AND z.parked_at IS NOT NULL AND z.processed_at IS NULL)
        ), top AS (
            -- Each known key's highest row with its number in the row (one
            -- step down the (correlation_id, key_seq) index): a parked row
            -- and the rows held behind it have theirs there, and a parked
            -- row's later rows are all pending, so if the key has a parked
            -- row that still waits, this row is it or is held behind it. A
            -- key without a counter has no numbered row.
            SELECT k.key, t.processed_at, coalesce(t.held_behind, CASE WHEN t.parked_at IS NOT NULL THEN t.key_seq END) AS head
            FROM (SELECT DISTINCT r.key FROM r CROSS JOIN pp WHERE r.known AND r.part = ANY(pp.parts)) AS k
            CROSS JOIN LATERAL (
                SELECT x.key_seq, x.processed_at, x.parked_at, x.held_behind FROM outbox AS x
                WHERE x.correlation_id = k.key AND x.key_seq IS NOT NULL
                ORDER BY x.key_seq DESC
                LIMIT 1) AS t
        ), heads AS (
            -- The parked rows, each found by its number and locked as a
            -- hold locks them: a retry or skip of one, whose trigger
            -- releases the rows held behind it, waits for this statement's
            -- holds; one being changed now is skipped, and its key's rows
            -- go to the journal. Its state is tested on the version locked,
            -- outside the probe (OFFSET 0): the planner would otherwise walk
            -- outbox_parked, every parked row, for each key.
            SELECT top.key, x.key_seq AS head FROM top
            CROSS JOIN LATERAL (
                SELECT y.key_seq, y.parked_at, y.processed_at FROM outbox AS y
                WHERE y.correlation_id = top.key AND y.key_seq = top.head
                OFFSET 0
                FOR SHARE SKIP LOCKED) AS x
            WHERE top.processed_at IS NULL AND top.head IS NOT NULL AND x.parked_at IS NOT NULL AND x.processed_at IS NULL
        ), hm AS (
            -- The parked rows by key: a lookup, as m is.
            SELECT coalesce(jsonb_object_agg(heads.key, heads.head), '{}') AS heads FROM heads
        ), numbered AS (
            INSERT INTO outbox_numbers (id, partition, correlation_id, key_seq)
            SELECT r.id, r.part, r.key, (m.tops ->> r.key)::bigint - r.n + r.rn
            FROM r CROSS JOIN m CROSS JOIN hm
            WHERE m.tops ? r.key AND NOT hm.heads ? r.key
            RETURNING 1
        ), holding AS (
            -- A parked key's rows are held behind its parked row, with
            -- their numbers in the row, as a read's hold would hold them.
            -- The parked keys' rows are picked before any outbox row is
            -- read (OFFSET 0): joined first, each row numbered cost a
            -- primary-key probe whether its key was parked or not.
            UPDATE outbox AS o
            SET key_seq = (m.tops ->> h.key)::bigint - h.n + h.rn,
                held_behind = CASE WHEN o.processed_at IS NULL AND o.parked_at IS NULL THEN h.head END
            FROM (SELECT r.id, r.key, r.n, r.rn, (hm.heads ->> r.key)::bigint AS head
                  FROM r CROSS JOIN hm
                  WHERE hm.heads ? r.key
                  OFFSET 0) AS h
            CROSS JOIN m
            WHERE o.id = h.id AND m.tops ? h.key
            RETURNING 1
        )
        -- The rows to park, with their reasons: usually none.
        SELECT (SELECT count(*) FROM numbered) + (SELECT count(*) FROM holding), z.ids, z.errors
        INTO total, park, errors
        FROM (SELECT coalesce(array_agg(w.id), '{}') AS ids, array_agg(CASE
                    WHEN w.refused IS NOT NULL THEN 'outbox: row refused: ' || w.refused || ' (docs/outbox-table.md)'
                    ELSE format('outbox: row refused: correlation_id %s belongs to partition %s (its earlier rows), '
                        'but this row says partition %s; partition must be xxhash64(correlation_id) mod P (docs/outbox-table.md)',
                        quote_literal(w.key), w.home, w.part) END) AS errors
              FROM w CROSS JOIN m
              WHERE w.refused IS NOT NULL OR w.part <> w.home OR NOT m.tops ? w.key) AS z;
    ELSE
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
            LEFT JOIN LATERAL (
                SELECT true AS numbered FROM outbox_numbers AS n WHERE n.id = x.id
                LIMIT 1) AS j ON true
            WHERE x.key_seq IS NULL AND x.parked_at IS NULL AND x.held_behind IS NULL
              AND j.numbered IS NULL
        ), w AS (
            -- Each row with its key's home: the counter's partition, or for a
            -- new key the lowest partition its acceptable rows are in.
            SELECT c.id, c.key, c.part, c.seq, c.refused,
                   coalesce(ck.partition, min(c.part) FILTER (WHERE c.refused IS NULL) OVER (PARTITION BY c.key)) AS home,
                   ck.correlation_id IS NOT NULL AS known
            FROM c LEFT JOIN outbox_keys AS ck ON ck.correlation_id = c.key
        ), r AS (
            -- The rows to number: each key's place among them (rn) and count.
            SELECT w.id, w.key, w.part, w.known, row_number() OVER (PARTITION BY w.key ORDER BY w.seq) AS rn,
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
        ), pp AS MATERIALIZED (
            -- The partitions numbered here that hold a parked row (one
            -- probe of outbox_parked each, once: inlined, the probe ran
            -- for every row and partition): only their keys can have one,
            -- and most calls look at no key.
            SELECT coalesce(array_agg(rp.part), '{}') AS parts FROM (SELECT DISTINCT r.part FROM r WHERE r.known) AS rp
            WHERE EXISTS (SELECT 1 FROM outbox AS z
                          WHERE z.partition = rp.part AND z.parked_at IS NOT NULL AND z.processed_at IS NULL)
        ), top AS (
            -- Each known key's highest row with its number in the row (one
            -- step down the (correlation_id, key_seq) index): a parked row
            -- and the rows held behind it have theirs there, and a parked
            -- row's later rows are all pending, so if the key has a parked
            -- row that still waits, this row is it or is held behind it. A
            -- key without a counter has no numbered row.
            SELECT k.key, t.processed_at, coalesce(t.held_behind, CASE WHEN t.parked_at IS NOT NULL THEN t.key_seq END) AS head
            FROM (SELECT DISTINCT r.key FROM r CROSS JOIN pp WHERE r.known AND r.part = ANY(pp.parts)) AS k
            CROSS JOIN LATERAL (
                SELECT x.key_seq, x.processed_at, x.parked_at, x.held_behind FROM outbox AS x
                WHERE x.correlation_id = k.key AND x.key_seq IS NOT NULL
                ORDER BY x.key_seq DESC
                LIMIT 1) AS t
        ), heads AS (
            -- The parked rows, each found by its number and locked as a
            -- hold locks them: a retry or skip of one, whose trigger
            -- releases the rows held behind it, waits for this statement's
            -- holds; one being changed now is skipped, and its key's rows
            -- go to the journal. Its state is tested on the version locked,
            -- outside the probe (OFFSET 0): the planner would otherwise walk
            -- outbox_parked, every parked row, for each key.
            SELECT top.key, x.key_seq AS head FROM top
            CROSS JOIN LATERAL (
                SELECT y.key_seq, y.parked_at, y.processed_at FROM outbox AS y
                WHERE y.correlation_id = top.key AND y.key_seq = top.head
                OFFSET 0
                FOR SHARE SKIP LOCKED) AS x
            WHERE top.processed_at IS NULL AND top.head IS NOT NULL AND x.parked_at IS NOT NULL AND x.processed_at IS NULL
        ), hm AS (
            -- The parked rows by key: a lookup, as m is.
            SELECT coalesce(jsonb_object_agg(heads.key, heads.head), '{}') AS heads FROM heads
        ), numbered AS (
            INSERT INTO outbox_numbers (id, partition, correlation_id, key_seq)
            SELECT r.id, r.part, r.key, (m.tops ->> r.key)::bigint - r.n + r.rn
            FROM r CROSS JOIN m CROSS JOIN hm
            WHERE m.tops ? r.key AND NOT hm.heads ? r.key
            RETURNING 1
        ), holding AS (
            -- A parked key's rows are held behind its parked row, with
            -- their numbers in the row, as a read's hold would hold them.
            -- The parked keys' rows are picked before any outbox row is
            -- read (OFFSET 0): joined first, each row numbered cost a
            -- primary-key probe whether its key was parked or not.
            UPDATE outbox AS o
            SET key_seq = (m.tops ->> h.key)::bigint - h.n + h.rn,
                held_behind = CASE WHEN o.processed_at IS NULL AND o.parked_at IS NULL THEN h.head END
            FROM (SELECT r.id, r.key, r.n, r.rn, (hm.heads ->> r.key)::bigint AS head
                  FROM r CROSS JOIN hm
                  WHERE hm.heads ? r.key
                  OFFSET 0) AS h
            CROSS JOIN m
            WHERE o.id = h.id AND m.tops ? h.key
            RETURNING 1
        )
        -- The rows to park, with their reasons: usually none.
        SELECT (SELECT count(*) FROM numbered) + (SELECT count(*) FROM holding), z.ids, z.errors
        INTO total, park, errors
        FROM (SELECT coalesce(array_agg(w.id), '{}') AS ids, array_agg(CASE
                    WHEN w.refused IS NOT NULL THEN 'outbox: row refused: ' || w.refused || ' (docs/outbox-table.md)'
                    ELSE format('outbox: row refused: correlation_id %s belongs to partition %s (its earlier rows), '
                        'but this row says partition %s; partition must be xxhash64(correlation_id) mod P (docs/outbox-table.md)',
                        quote_literal(w.key), w.home, w.part) END) AS errors
              FROM w CROSS JOIN m
              WHERE w.refused IS NOT NULL OR w.part <> w.home OR NOT m.tops ? w.key) AS z;
    END IF;
    IF cardinality(park) > 0 THEN
        UPDATE outbox AS o SET parked_at = clock_timestamp(), last_error = p.error
        FROM unnest(park, errors) AS p(id, error)
        WHERE o.id = p.id AND o.processed_at IS NULL AND o.parked_at IS NULL;
        GET DIAGNOSTICS parked = ROW_COUNT;
        total := total + parked;
    END IF;
    RETURN total;
END
$$;
