-- ordo_table_number with a bound: it numbers the rows of at most
-- max_keys keys of partitions parts (the first in key order) and returns
-- how many keys it numbered besides the rows. A partition with more
-- unnumbered keys than the bound takes several calls, each committed on
-- its own: a read that runs out of time keeps what the calls before it
-- numbered, so one partition's very large intake gets numbered on a
-- loaded machine instead of starting over at every read. Otherwise as
-- the two-argument function of migration 1, which stays for nodes of an
-- earlier release.
CREATE FUNCTION ordo_table_number(node text, parts int[], max_keys int,
                                   OUT numbered bigint, OUT late bigint, OUT keys int)
LANGUAGE plpgsql SET enable_seqscan = off SET enable_bitmapscan = off AS $$
DECLARE
    held int[];
    k record;
    base bigint;
    newest timestamptz;
    top bigint;
    n bigint;
    nlate bigint;
BEGIN
    numbered := 0;
    late := 0;
    keys := 0;
    SELECT coalesce(array_agg(l.partition), '{}') INTO held FROM (
        SELECT partition FROM ordo_leases
        WHERE owner = node AND partition = ANY(parts)
        ORDER BY partition
        FOR SHARE) AS l;
    FOR k IN SELECT DISTINCT r.key, r.partition FROM ordo_table_rows AS r
             WHERE r.partition = ANY(held) AND r.key_seq IS NULL
             ORDER BY r.key LIMIT max_keys LOOP
        keys := keys + 1;
        INSERT INTO ordo_table_keys (key, partition, last_key_seq) VALUES (k.key, k.partition, 0)
        ON CONFLICT (key) DO NOTHING;
        SELECT c.last_key_seq, c.last_occurred_at INTO base, newest
        FROM ordo_table_keys AS c WHERE c.key = k.key FOR UPDATE;
        WITH s AS (
            SELECT x.id, row_number() OVER (ORDER BY x.occurred_at, x.id) AS rn FROM ordo_table_rows AS x
            WHERE x.partition = k.partition AND x.key = k.key AND x.key_seq IS NULL
        ), u AS (
            UPDATE ordo_table_rows AS o SET key_seq = base + s.rn,
                parked_at = CASE WHEN o.problem IS NOT NULL THEN clock_timestamp() END,
                last_error = o.problem
            FROM s
            WHERE o.id = s.id AND o.key_seq IS NULL
            RETURNING s.rn, o.occurred_at
        )
        SELECT coalesce(max(u.rn), 0), count(*), count(*) FILTER (WHERE u.occurred_at < newest), max(u.occurred_at)
        INTO top, n, nlate, newest FROM u;
        IF top > 0 THEN
            UPDATE ordo_table_keys SET last_key_seq = base + top,
                last_occurred_at = greatest(last_occurred_at, newest)
            WHERE key = k.key;
        END IF;
        numbered := numbered + n;
        late := late + nlate;
    END LOOP;
END
$$;
