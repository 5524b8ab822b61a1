-- ordo_table_take_in takes a page of the user's pending rows into
-- ordo_table_rows already numbered, so that a row is written once there,
-- not inserted and then updated (an UPDATE of the indexed key_seq is
-- never HOT: a second heap tuple and its index entries per row). The
-- arrays are the page in read order ("OccurredAt", then "Id"): ids,
-- partitions, keys, occurred-at, problems. It returns how many rows it
-- took in, and how many of those it numbered after a row of their key
-- with a later occurred-at (late rows, docs/adopt.md).
--
-- The planner is confined to index probes, one per row, whatever the
-- statistics (a table never analyzed would otherwise be hashed whole).
-- The page's key counters are created at 0 if missing and locked in key
-- order first: an intake numbering the same keys at once (a lease in
-- hand-off) waits here, and the next statement, with a snapshot of its
-- own, sees what that one took in and skips it. Each row of a key gets
-- the key's next number in page order, a problem row parked at once as
-- the owner's numbering parks it. A row of a key that still has an
-- unnumbered row (taken in by an intake of an earlier release) is taken
-- in unnumbered, behind it: the partition's owner numbers both, in order.
--
-- A row inserted meanwhile by an intake of an earlier release, which
-- locks no counter, would leave its number unused, a gap in the key: the
-- function then raises serialization_failure, the transaction rolls
-- back, and the next pass skips that row.
CREATE FUNCTION ordo_table_take_in(ids uuid[], parts int[], keys text[], ats timestamptz[], problems text[],
                                   OUT taken bigint, OUT late bigint)
LANGUAGE plpgsql
SET enable_seqscan = off SET enable_bitmapscan = off SET enable_hashjoin = off SET enable_mergejoin = off AS $$
DECLARE
    wanted bigint;
    counters jsonb; -- key -> [last_key_seq, last_occurred_at]
BEGIN
    INSERT INTO ordo_table_keys (key, partition, last_key_seq)
    SELECT DISTINCT ON (u.key) u.key, u.partition, 0
    FROM unnest(keys, parts) AS u(key, partition)
    ORDER BY u.key
    ON CONFLICT (key) DO NOTHING;
    -- FOR UPDATE returns each counter as its last holder committed it.
    SELECT jsonb_object_agg(l.key, jsonb_build_array(l.last_key_seq, l.last_occurred_at))
    INTO counters
    FROM (SELECT c.key, c.last_key_seq, c.last_occurred_at FROM ordo_table_keys AS c
          WHERE c.key = ANY(keys) ORDER BY c.key FOR UPDATE) AS l;

    WITH page AS (
        SELECT u.id, u.partition, u.key, u.occurred_at, u.problem, u.ord
        FROM unnest(ids, parts, keys, ats, problems) WITH ORDINALITY AS u(id, partition, key, occurred_at, problem, ord)
        WHERE NOT EXISTS (SELECT 1 FROM ordo_table_rows AS r WHERE r.id = u.id)
    ), n AS (
        SELECT p.*, (counters -> p.key ->> 0)::bigint + row_number() OVER (PARTITION BY p.key ORDER BY p.ord) AS key_seq,
               (counters -> p.key ->> 1)::timestamptz AS newest,
               EXISTS (SELECT 1 FROM ordo_table_rows AS r
                       WHERE r.partition = p.partition AND r.key = p.key AND r.key_seq IS NULL) AS behind
        FROM page AS p
    ), ins AS (
        INSERT INTO ordo_table_rows (id, partition, key, occurred_at, problem, key_seq, parked_at, last_error)
        SELECT n.id, n.partition, n.key, n.occurred_at, n.problem,
               CASE WHEN NOT n.behind THEN n.key_seq END,
               CASE WHEN NOT n.behind AND n.problem IS NOT NULL THEN clock_timestamp() END,
               CASE WHEN NOT n.behind THEN n.problem END
        FROM n ORDER BY n.ord
        ON CONFLICT (id) DO NOTHING
        RETURNING id, key, key_seq, occurred_at
    ), moved AS (
        UPDATE ordo_table_keys AS c SET last_key_seq = m.top,
            last_occurred_at = greatest(c.last_occurred_at, m.newest)
        FROM (SELECT i.key, max(i.key_seq) AS top, max(i.occurred_at) AS newest
              FROM ins AS i WHERE i.key_seq IS NOT NULL GROUP BY i.key) AS m
        WHERE c.key = m.key
    )
    SELECT (SELECT count(*) FROM n), (SELECT count(*) FROM ins),
           (SELECT count(*) FROM n WHERE NOT n.behind AND n.occurred_at < n.newest)
    INTO wanted, taken, late;
    IF taken < wanted THEN
        RAISE EXCEPTION 'ordo_table_take_in: % of % rows were taken in meanwhile by another intake; take the page in again',
            wanted - taken, wanted USING ERRCODE = 'serialization_failure';
    END IF;
END
$$;
