-- Owner numbering walks the rows the relay reads. outbox_number_rows
-- scanned the pending rows of a partition that were unnumbered and not
-- parked, through outbox_pending_by_partition: beside many parked keys
-- that is every parked and held row of the partition (20,000 parked keys
-- with one held row each: 40,010 index entries and 771 buffers to number
-- 10 rows). An unnumbered row is never held (a hold matches the rows of a
-- key above the parked row's key_seq, which are numbered), so the scan
-- may skip held rows: with held_behind IS NULL it walks
-- outbox_ready_by_partition, the pending rows neither parked nor held,
-- and reads 10 entries for 10 rows. Nothing else changes.
CREATE OR REPLACE FUNCTION outbox_number_rows(node text, partitions int[], up_to bigint[]) RETURNS bigint
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
        WHERE x.key_seq IS NULL AND x.parked_at IS NULL AND x.held_behind IS NULL
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
