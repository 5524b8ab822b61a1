-- The owner's numbering walks each partition by a range scan of its own.
-- It joined the outbox with the partitions to number (partition = part
-- AND seq <= top), and on an outbox never analyzed (a burst into a fresh
-- table: PostgreSQL then guesses one ready row) the planner hashed every
-- ready row of the table and matched the partitions against them: each
-- call read the whole backlog (100,000 rows read to number 2,048, 0.13 s
-- a call; a drain of 100,000 rows over 10,000 keys ran at half the rate
-- it reaches once the table is analyzed). A LATERAL subquery per
-- partition, kept apart by OFFSET 0, is one range scan of
-- outbox_ready_by_partition each, whatever the statistics. Where
-- outbox_pending_by_partition is still there (until the key_seq trigger
-- is dropped with it) and the outbox has statistics, the join stays:
-- there the planner may cost a range of the pending index cheaper than
-- one of a sparse ready index, and walk the parked and held rows. Rules,
-- order and result are migration 17's (docs/outbox-table.md, "Who
-- numbers a key's rows").
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
        )
        -- The rows to park, with their reasons: usually none.
        SELECT (SELECT count(*) FROM numbered), z.ids, z.errors
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
        )
        -- The rows to park, with their reasons: usually none.
        SELECT (SELECT count(*) FROM numbered), z.ids, z.errors
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
