-- The owner's numbering walks each partition from a mark, not from its
-- first ready row. Its walk went through every ready row of the
-- partition up to the read's highest unnumbered row, the rows it had
-- numbered before included, each probed in the journal: beside a
-- read-ahead of thousands of rows a key (a drain of 40,000 rows over ten
-- keys), 17,000 rows walked a call to number 1,005, 94 % of the call.
--
-- A row may commit after rows inserted after it, so the walk cannot
-- simply go on from the highest seq it numbered: a row below that,
-- committed late, would be numbered after its key's later rows. The
-- mark (outbox_walk_marks.walked_to) is a seq at or below which every
-- row had committed (or rolled back) when a walk began, so that the walk
-- saw every such row. It is found from the writers of the outbox: a
-- transaction takes its RowExclusiveLock on the outbox before its INSERT
-- draws a seq, so one that holds no such lock when the sequence's value
-- is L can only draw seqs above L. A call that numbered more than 16
-- rows a partition, or had more than 65,536 seqs to walk in one,
-- samples after its walk the
-- sequence's value, then the transactions that hold such a lock
-- (pg_locks), and keeps both in each of its partitions' marks: a writer
-- the partition's previous sample did not see began writing after it,
-- so draws above that sample's value; one it saw keeps its bound; one of
-- the first sample, or a prepared transaction, has none. The lowest of
-- these and the sample's value is the sample's bound, and the next walk
-- of the partition, which begins after the sample, moves the mark up to
-- it (and no further than the read's highest row). A walk that starts
-- from an old mark walks the ready rows above it, the rows every walk
-- walked before: at steady rates calls take no sample and write no mark.
--
-- A row made pending again under the mark (a refused row retried, or
-- moved to another partition) is recorded by a trigger in
-- outbox_walk_resets, committed with the change, and the next walk of its
-- partition starts below it. A sequence set back below a mark's sample
-- voids the mark, and a read that finds a row at or below its
-- partition's mark unnumbered walks that partition from its first row,
-- as a walk does at least once a minute per partition. Rules, order and
-- result are otherwise migration 23's (docs/outbox-table.md, "Where the
-- walk starts").
CREATE TABLE outbox_walk_marks (
    partition int         PRIMARY KEY,
    walked_to bigint      NOT NULL,
    seen      bigint,
    writers   jsonb,
    bound     bigint,
    full_at   timestamptz NOT NULL
);

CREATE TABLE outbox_walk_resets (
    partition int    NOT NULL,
    seq       bigint NOT NULL
);
CREATE INDEX outbox_walk_resets_partition ON outbox_walk_resets (partition);

CREATE FUNCTION outbox_walk_reset() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO outbox_walk_resets (partition, seq) VALUES (NEW.partition, NEW.seq);
    RETURN NULL;
END
$$;

CREATE TRIGGER outbox_walk_reset AFTER UPDATE OF parked_at, partition, key_seq ON outbox
    FOR EACH ROW
    WHEN (NEW.key_seq IS NULL AND NEW.parked_at IS NULL AND NEW.processed_at IS NULL AND NEW.held_behind IS NULL
          AND (OLD.parked_at IS NOT NULL OR OLD.partition IS DISTINCT FROM NEW.partition OR OLD.key_seq IS NOT NULL))
    EXECUTE FUNCTION outbox_walk_reset();

-- Where each partition's walk starts, and the bound of its last sample
-- where one may be used (safe), for outbox_journal_rows. Its statements
-- and outbox_walk_mark's run on generic plans: custom ones, planned
-- again in every call, doubled the cost of a call that numbers one row.
CREATE FUNCTION outbox_walk_starts(held int[], partitions int[], up_to bigint[], sample_seq bigint, safe boolean,
    OUT parts int[], OUT tops bigint[], OUT los bigint[], OUT bounds bigint[], OUT long_walk boolean)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan SET enable_seqscan = off AS $$
BEGIN
    WITH gone AS (
        DELETE FROM outbox_walk_resets AS x WHERE x.partition = ANY(held) RETURNING x.partition, x.seq
    ), g AS (
        SELECT gone.partition, min(gone.seq) - 1 AS lo FROM gone GROUP BY gone.partition
    )
    SELECT array_agg(u.part ORDER BY u.part), array_agg(u.top ORDER BY u.part),
           array_agg(CASE WHEN mk.partition IS NULL OR mk.full_at < now() - interval '1 minute' OR u.top <= mk.walked_to
                               OR mk.seen > sample_seq THEN 0
                          ELSE greatest(least(mk.walked_to, coalesce(g.lo, mk.walked_to)), 0) END ORDER BY u.part),
           array_agg(CASE WHEN safe AND NOT mk.seen > sample_seq THEN mk.bound END ORDER BY u.part)
    INTO parts, tops, los, bounds
    FROM (SELECT v.part, max(coalesce(v.top, 9223372036854775807)) AS top
          FROM unnest(partitions, up_to) AS v(part, top)
          WHERE v.part = ANY(held) GROUP BY v.part) AS u
    LEFT JOIN outbox_walk_marks AS mk ON mk.partition = u.part
    LEFT JOIN g ON g.partition = u.part;
    long_walk := EXISTS (SELECT 1 FROM unnest(tops, los) AS t(top, lo) WHERE t.top - t.lo > 65536);
END
$$;

-- The marks of a numbering call's partitions, after its walk (see
-- outbox_journal_rows).
CREATE FUNCTION outbox_walk_mark(parts int[], tops bigint[], los bigint[], bounds bigint[],
    sampled boolean, sample_seq bigint, sample_writers jsonb) RETURNS void
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan SET enable_seqscan = off AS $$
BEGIN
    INSERT INTO outbox_walk_marks AS mk (partition, walked_to, seen, writers, bound, full_at)
    SELECT t.part, t.mark,
           CASE WHEN sampled THEN sample_seq ELSE o.seen END,
           CASE WHEN sampled THEN nw.writers ELSE o.writers END,
           CASE WHEN sampled THEN least(sample_seq, nw.low) ELSE o.bound END,
           CASE WHEN t.lo = 0 THEN now() ELSE o.full_at END
    FROM (SELECT u.part, u.lo, CASE WHEN u.bound IS NULL THEN u.lo ELSE greatest(u.lo, least(u.top, u.bound)) END AS mark
          FROM unnest(parts, tops, los, bounds) AS u(part, top, lo, bound)) AS t
    LEFT JOIN outbox_walk_marks AS o ON o.partition = t.part
    CROSS JOIN LATERAL (
        SELECT coalesce(jsonb_object_agg(x.vxid, x.low), '{}') AS writers, min(x.low) AS low FROM (
            SELECT w.key AS vxid,
                   CASE WHEN w.value::boolean OR o.seen > sample_seq THEN 0
                        ELSE coalesce((o.writers ->> w.key)::bigint, o.seen, 0) END AS low
            FROM jsonb_each(coalesce(sample_writers, '{}')) AS w) AS x) AS nw
    WHERE sampled OR o.partition IS NULL OR t.mark <> o.walked_to OR (t.lo = 0 AND o.full_at < now() - interval '1 minute')
    ON CONFLICT (partition) DO UPDATE
        SET walked_to = EXCLUDED.walked_to, seen = EXCLUDED.seen, writers = EXCLUDED.writers,
            bound = EXCLUDED.bound, full_at = EXCLUDED.full_at;
END
$$;

CREATE OR REPLACE FUNCTION outbox_journal_rows(node text, partitions int[], up_to bigint[]) RETURNS bigint
LANGUAGE plpgsql SET enable_seqscan = off AS $$
DECLARE
    held int[];
    total bigint;
    park uuid[];
    errors text[];
    parked bigint;
    by_range boolean;
    walk_parts int[];
    walk_tops bigint[];
    walk_los bigint[];
    mark_bounds bigint[];
    sample_seq bigint;
    sample_writers jsonb;
    sampled boolean := false;
    safe boolean;
    long_walk boolean;
    seq_of regclass := pg_get_serial_sequence('outbox', 'seq')::regclass;
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
    -- A partition's mark moves only under READ COMMITTED, where this
    -- call's walk sees what committed before it began, and with an
    -- identity that caches no values (a backend could insert a seq it
    -- drew before a sample).
    safe := current_setting('transaction_isolation') = 'read committed'
        AND (SELECT s.seqcache FROM pg_sequence AS s
             WHERE s.seqrelid = seq_of) = 1;
    sample_seq := coalesce(pg_sequence_last_value(seq_of), 0);
    -- Where each partition's walk starts: above its mark, or below the
    -- lowest row made pending again since (taken from outbox_walk_resets
    -- in a statement of its own, before the walk's: a reset committed
    -- after it stays for the next call), or from the first row if the
    -- partition has no mark, or its last walk from there is a minute old,
    -- or the read found a row at or below the mark unnumbered (a row made
    -- pending again by hand), or the sequence was set back below the
    -- mark's last sample (which voids the sample's bound too).
    SELECT w.parts, w.tops, w.los, w.bounds, w.long_walk INTO walk_parts, walk_tops, walk_los, mark_bounds, long_walk
    FROM outbox_walk_starts(held, partitions, up_to, sample_seq, safe) AS w;
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
            SELECT u.part, u.top, u.lo FROM unnest(walk_parts, walk_tops, walk_los) AS u(part, top, lo)
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
                  AND y.held_behind IS NULL AND y.key_seq IS NULL AND y.seq > b.lo AND y.seq <= b.top
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
            SELECT u.part, u.top, u.lo FROM unnest(walk_parts, walk_tops, walk_los) AS u(part, top, lo)
        ), c AS (
            SELECT x.id, x.correlation_id AS key, x.partition AS part, x.seq,
                   CASE WHEN octet_length(x.correlation_id) NOT BETWEEN 1 AND 255 THEN 'correlation_id must be 1 to 255 bytes'
                        WHEN octet_length(x.exchange) > 255 THEN 'exchange is longer than 255 bytes'
                        WHEN octet_length(x.routing_key) > 255 THEN 'routing_key is longer than 255 bytes'
                        WHEN octet_length(x.type) > 255 THEN 'type is longer than 255 bytes'
                        WHEN jsonb_typeof(x.headers) <> 'object' THEN 'headers must be a JSON object' END AS refused
            FROM b JOIN outbox AS x ON x.partition = b.part AND x.processed_at IS NULL AND x.seq > b.lo AND x.seq <= b.top
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
    -- A sample of the outbox's writers, for the walks after this one,
    -- when this call numbered more than 16 rows a partition or had more
    -- than 65,536 seqs to walk in one: the sequence's value, then the transactions that hold
    -- a lock on the outbox that lets them insert (one that takes such a
    -- lock after the sample draws seqs above that value). Each writer's
    -- bound: kept from the partition's previous sample, or that sample's
    -- value for a writer it did not see; none (0) for a prepared
    -- transaction or without a previous sample. A walk that begins after
    -- the sample sees every row at or below the lowest of the sample's
    -- value and its writers' bounds (the mark's bound).
    IF safe AND (total > 16 * cardinality(walk_parts) OR long_walk) THEN
        sample_seq := coalesce(pg_sequence_last_value(seq_of), 0);
        SELECT coalesce(jsonb_object_agg(w.vxid, w.prepared), '{}') INTO sample_writers FROM (
            SELECT l.virtualtransaction AS vxid, bool_or(l.pid IS NULL) AS prepared FROM pg_locks AS l
            WHERE l.locktype = 'relation' AND l.relation = 'outbox'::regclass
              AND l.database = (SELECT d.oid FROM pg_database AS d WHERE d.datname = current_database())
              AND l.mode IN ('RowExclusiveLock', 'ShareRowExclusiveLock', 'ExclusiveLock', 'AccessExclusiveLock')
              AND l.pid IS DISTINCT FROM pg_backend_pid()
            GROUP BY l.virtualtransaction) AS w;
        sampled := true;
    END IF;
    -- The marks: this walk began after the partition's last sample, so
    -- it saw every row at or below that sample's bound and its own top.
    -- Written when a mark moves or a sample is taken, and when the
    -- partition was walked from its first row because the last such walk
    -- was a minute old.
    PERFORM outbox_walk_mark(walk_parts, walk_tops, walk_los, mark_bounds, sampled, sample_seq, sample_writers);
    RETURN total;
END
$$;
