-- A producer's INSERT writes no entry into the (correlation_id, key_seq)
-- index once the key_seq trigger is dropped (docs/outbox-table.md, "Who
-- numbers a key's rows"): the unique index covers numbered rows only
-- (WHERE key_seq IS NOT NULL), the owner's numbering adds the entry, and
-- an unnumbered row cost an entry of (correlation_id, NULL), about 85 B
-- of WAL and one more index insert per row. Uniqueness is the same: NULLs
-- were never unique. Every query that finds a row by key and key_seq
-- compares key_seq with a strict operator (=, >), which implies key_seq
-- IS NOT NULL, and so still plans on it (relay/pgstore's
-- TestPlansFollowTheWork, admin's queries).
--
-- The index is built first, under a name of its own, while reads go on
-- (CREATE INDEX blocks only writes); the old constraint is then dropped
-- and the index takes its name. Producers wait for the build: about 5 s
-- per million rows in the table on a loaded 2-core machine, and the
-- migration's statement timeout (2 min) bounds it. An operator who wants
-- no wait, or has a larger table, builds the index beforehand without
-- blocking anyone, and the migration then only renames it:
--   CREATE UNIQUE INDEX CONCURRENTLY outbox_key_seq_numbered
--       ON outbox (correlation_id, key_seq) WHERE key_seq IS NOT NULL;
-- A build of that kind that failed leaves an invalid index: it is
-- dropped and built again here.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_index WHERE indexrelid = to_regclass('outbox_key_seq_numbered') AND NOT indisvalid) THEN
        DROP INDEX outbox_key_seq_numbered;
    END IF;
END
$$;
CREATE UNIQUE INDEX IF NOT EXISTS outbox_key_seq_numbered ON outbox (correlation_id, key_seq) WHERE key_seq IS NOT NULL;
ALTER TABLE outbox DROP CONSTRAINT outbox_key_seq_key;
ALTER INDEX outbox_key_seq_numbered RENAME TO outbox_key_seq_key;

-- The owner can no longer find a key's unnumbered rows by key. It finds
-- them by partition: outbox_number_rows numbers every unnumbered,
-- unparked pending row of each partition partitions[i] whose seq is at
-- most up_to[i] (NULL: no bound), while node holds the partition, and
-- returns how many rows it numbered or parked. The relay gives, for each
-- partition it read, the highest seq its read returned without key_seq:
-- the scan (outbox_pending_by_partition) covers the pending rows up to
-- there, which is what the read itself walked plus the rows below its
-- cursor that are still pending (in flight, backing off, or waiting
-- behind a parked row of their key), never the backlog above the read.
--
-- Rows below the cursor are scanned on purpose: a row that committed
-- after the relay's cursor passed its seq is numbered before any later
-- row of its key, so a producer that serialises its aggregate still gets
-- commit order. The rest is as outbox_number_keys of migration 13: the
-- lease rows locked FOR SHARE in partition order until the numbers
-- commit, counters locked in key order, each key's rows numbered in seq
-- order and its counter moved once, rows the trigger would have refused
-- parked unnumbered with the reason.
CREATE FUNCTION outbox_number_rows(node text, partitions int[], up_to bigint[]) RETURNS bigint
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
        WHERE owner = node AND partition = ANY(partitions)
        ORDER BY partition
        FOR SHARE) AS l;
    FOR k IN
        SELECT x.correlation_id AS key, x.partition AS part, array_agg(x.id ORDER BY x.seq) AS ids,
               bool_or(octet_length(x.correlation_id) NOT BETWEEN 1 AND 255 OR octet_length(x.exchange) > 255
                       OR octet_length(x.routing_key) > 255 OR octet_length(x.type) > 255
                       OR jsonb_typeof(x.headers) <> 'object') AS refused
        FROM (SELECT u.part, max(coalesce(u.top, 9223372036854775807)) AS top
              FROM unnest(partitions, up_to) AS u(part, top)
              WHERE u.part = ANY(held) GROUP BY u.part) AS b
        JOIN outbox AS x ON x.partition = b.part AND x.processed_at IS NULL AND x.seq <= b.top
        WHERE x.key_seq IS NULL AND x.parked_at IS NULL
        GROUP BY x.correlation_id, x.partition
        ORDER BY x.correlation_id, x.partition
    LOOP
        IF k.refused THEN
            -- Rows the trigger would have refused: parked, unnumbered.
            UPDATE outbox AS o SET parked_at = clock_timestamp(), last_error = 'outbox: row refused: ' || CASE
                    WHEN octet_length(o.correlation_id) NOT BETWEEN 1 AND 255 THEN 'correlation_id must be 1 to 255 bytes'
                    WHEN octet_length(o.exchange) > 255 THEN 'exchange is longer than 255 bytes'
                    WHEN octet_length(o.routing_key) > 255 THEN 'routing_key is longer than 255 bytes'
                    WHEN octet_length(o.type) > 255 THEN 'type is longer than 255 bytes'
                    ELSE 'headers must be a JSON object' END || ' (docs/outbox-table.md)'
            WHERE o.id = ANY(k.ids) AND o.key_seq IS NULL AND o.processed_at IS NULL AND o.parked_at IS NULL
              AND (octet_length(o.correlation_id) NOT BETWEEN 1 AND 255 OR octet_length(o.exchange) > 255
                   OR octet_length(o.routing_key) > 255 OR octet_length(o.type) > 255
                   OR jsonb_typeof(o.headers) <> 'object');
            GET DIAGNOSTICS n = ROW_COUNT;
            total := total + n;
        END IF;

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
            WHERE o.id = ANY(k.ids) AND o.key_seq IS NULL AND o.processed_at IS NULL AND o.parked_at IS NULL;
            GET DIAGNOSTICS n = ROW_COUNT;
            total := total + n;
            CONTINUE;
        END IF;

        WITH s AS (
            SELECT x.id, row_number() OVER (ORDER BY x.seq) AS rn FROM outbox AS x
            WHERE x.id = ANY(k.ids) AND x.key_seq IS NULL AND x.processed_at IS NULL AND x.parked_at IS NULL
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

-- outbox_number_keys, which relays of migration 13 call with the keys
-- their read returned unnumbered, numbers every unnumbered row of those
-- keys' partitions, without a bound: a rolling upgrade from migration 13
-- with the trigger already dropped keeps working, at the cost of a scan
-- of those partitions' pending rows per call until every node runs this
-- release.
CREATE OR REPLACE FUNCTION outbox_number_keys(node text, key_partitions int[], keys text[]) RETURNS bigint
LANGUAGE sql AS $$
    SELECT outbox_number_rows(node, array_agg(DISTINCT p), NULL::bigint[]) FROM unnest(key_partitions) AS p
$$;
