-- Ordo's bookkeeping for a table it relays but did not create
-- (docs/adopt.md): nothing is added to the user's table. A source is one
-- database, so one adopted table per database; its partitions are the
-- database's ordo_leases.
--
-- ordo_table_rows holds one narrow row per pending user row the intake
-- took in (no payload: it stays in the user's table and is read by
-- primary key when published). seq is the order of intake, the relay's
-- cursor in a partition. key_seq is NULL until the partition's owner
-- numbers the row. problem, set by the intake, is why the row cannot be
-- published as it is: the owner parks such a row when it numbers it. A
-- row is deleted once published and marked; a row whose user row was
-- marked or deleted by someone else after it was numbered is kept dead
-- (dead_at), so that the next row's prev steps over its number.
CREATE TABLE ordo_table_rows (
    id              uuid        PRIMARY KEY,
    seq             bigint      GENERATED ALWAYS AS IDENTITY,
    partition       int         NOT NULL CHECK (partition >= 0),
    key             text        NOT NULL,
    occurred_at     timestamptz NOT NULL,
    key_seq         bigint,
    problem         text,
    attempts        int         NOT NULL DEFAULT 0,
    last_error      text,
    next_attempt_at timestamptz,
    parked_at       timestamptz,
    dead_at         timestamptz
);

-- The key's rows by number: the probe for the row below a head, and the
-- walk down over dead rows.
CREATE UNIQUE INDEX ordo_table_rows_key_seq ON ordo_table_rows (key, key_seq);
-- Key heads: a partition's rows that may go, in intake order.
CREATE INDEX ordo_table_rows_ready ON ordo_table_rows (partition, seq)
    WHERE parked_at IS NULL AND dead_at IS NULL;
-- Numbering: a partition's unnumbered rows, by key.
CREATE INDEX ordo_table_rows_unnumbered ON ordo_table_rows (partition, key, occurred_at, id)
    WHERE key_seq IS NULL;

-- Each key's counter, so that key_seq and prev survive the rows, and the
-- highest occurred-at numbered so far (late rows are counted against it).
CREATE TABLE ordo_table_keys (
    key              text        PRIMARY KEY,
    partition        int         NOT NULL,
    last_key_seq     bigint      NOT NULL,
    last_occurred_at timestamptz NOT NULL DEFAULT '-infinity'
);

-- ordo_table_number numbers the unnumbered rows of partitions parts
-- while node holds them, and returns how many it numbered and how many
-- of those were late (an occurred-at below the highest already numbered
-- for their key). The lease rows are locked FOR SHARE in partition order
-- (as every relay write locks them) until the numbers commit: no other
-- node can claim a partition, and so number its rows, meanwhile.
-- Counters are locked in key order. A key's rows numbered together get
-- their numbers in occurred-at order, ties broken by id; the counter
-- moves once. A row with a problem is numbered and parked at once, with
-- the problem as its error: it holds its key, as any parked row does,
-- until an operator acts.
CREATE FUNCTION ordo_table_number(node text, parts int[], OUT numbered bigint, OUT late bigint)
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
    SELECT coalesce(array_agg(l.partition), '{}') INTO held FROM (
        SELECT partition FROM ordo_leases
        WHERE owner = node AND partition = ANY(parts)
        ORDER BY partition
        FOR SHARE) AS l;
    FOR k IN SELECT DISTINCT r.key, r.partition FROM ordo_table_rows AS r
             WHERE r.partition = ANY(held) AND r.key_seq IS NULL
             ORDER BY r.key LOOP
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
