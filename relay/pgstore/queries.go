package pgstore

// sqlReadHeads: see Store.ReadHeads. Within a key only key_seq counts; seq
// orders different keys. Never "seq > cursor": a row whose transaction
// commits late would be skipped.
const sqlReadHeads = `
SELECT o.id, o.partition, o.correlation_id, o.key_seq, o.exchange, o.routing_key, o.type,
       o.payload, o.headers, o.occurred_at, o.attempts,
       EXISTS (SELECT 1 FROM outbox AS d
               WHERE d.correlation_id = o.correlation_id AND d.key_seq = o.key_seq - 1
                 AND d.dead_at IS NOT NULL) AS prev_dead
FROM outbox AS o
WHERE o.processed_at IS NULL
  AND o.partition = ANY($1::int[])
  AND o.parked_at IS NULL
  AND (o.next_attempt_at IS NULL OR o.next_attempt_at <= clock_timestamp())
  AND NOT (o.id = ANY(coalesce($2::uuid[], '{}')))
  AND (SELECT count(*) FROM (
         SELECT 1 FROM outbox AS b
         WHERE b.partition = o.partition AND b.correlation_id = o.correlation_id
           AND b.processed_at IS NULL AND b.key_seq < o.key_seq
         LIMIT $3) AS ahead) < $3
ORDER BY o.seq
LIMIT $4`

// sqlPrevKeySeq walks down from key_seq $2 - 1 over the key's dead rows
// and returns the first key_seq that is not dead (0 if none): the
// x-ordo-prev-key-seq of row $2. A row missing below was deleted by
// retention, which never deletes dead rows, so it was not dead.
const sqlPrevKeySeq = `
WITH RECURSIVE run(k) AS (
    SELECT $2::bigint - 1
    UNION ALL
    SELECT run.k - 1 FROM run
    WHERE run.k > 0 AND EXISTS (
        SELECT 1 FROM outbox WHERE correlation_id = $1 AND key_seq = run.k AND dead_at IS NOT NULL)
)
SELECT greatest(min(k), 0) FROM run`

// sqlHeld is the lease check shared by every relay write: the leases of
// node at the epochs given, locked FOR SHARE until the write commits, so
// no claim can slip between the check and the write.
const sqlHeld = `
m AS (SELECT * FROM unnest($2::uuid[], $3::int[], $4::bigint[]) AS m(id, partition, epoch)),
held AS (
    SELECT l.partition, l.epoch FROM ordo_leases AS l
    WHERE l.owner = $1 AND (l.partition, l.epoch) IN (SELECT DISTINCT partition, epoch FROM m)
    FOR SHARE)`

// sqlRefused records, once per partition and epoch, the rows a write
// skipped because the lease is no longer held at the published epoch.
func sqlRefused(what string) string {
	return `
refused AS (
    INSERT INTO ordo_lease_audit (node, partition, epoch, event, detail)
    SELECT $1, r.partition, r.epoch, 'refused-write', '` + what + ` of ' || r.n || ' row(s) with a stale epoch'
    FROM (SELECT partition, epoch, count(*) AS n FROM m
          WHERE (partition, epoch) NOT IN (SELECT partition, epoch FROM held)
          GROUP BY partition, epoch) AS r)`
}

// sqlMarkPublished marks confirmed rows processed, epoch-checked.
var sqlMarkPublished = `
WITH ` + sqlHeld + `,
marked AS (
    UPDATE outbox AS o SET processed_at = clock_timestamp()
    FROM m JOIN held AS h ON h.partition = m.partition AND h.epoch = m.epoch
    WHERE o.id = m.id AND o.partition = m.partition AND o.processed_at IS NULL
    RETURNING o.id),` + sqlRefused("mark") + `
SELECT id FROM marked`

// sqlRecordFailures counts one failed attempt per row, epoch-checked,
// sets when it may be tried again ($6, seconds from now), and parks it once
// it has failed $7 times.
var sqlRecordFailures = `
WITH ` + sqlHeld + `,
e AS (SELECT * FROM unnest($2::uuid[], $5::text[], $6::float8[]) AS e(id, err, delay)),
failed AS (
    UPDATE outbox AS o
    SET attempts = o.attempts + 1,
        last_error = left(e.err, 1000),
        next_attempt_at = clock_timestamp() + make_interval(secs => e.delay),
        parked_at = CASE WHEN o.attempts + 1 >= $7 THEN clock_timestamp() END
    FROM m JOIN held AS h ON h.partition = m.partition AND h.epoch = m.epoch
           JOIN e ON e.id = m.id
    WHERE o.id = m.id AND o.partition = m.partition AND o.processed_at IS NULL
    RETURNING o.id, o.parked_at IS NOT NULL AS parked),` + sqlRefused("failure record") + `
SELECT id FROM failed WHERE parked`

// sqlRetention deletes up to $3 processed, not dead, rows of partition $2
// processed more than $4 seconds ago, while node $1 holds the partition at
// epoch $5.
const sqlRetention = `
WITH held AS (
    SELECT 1 FROM ordo_leases WHERE partition = $2 AND owner = $1 AND epoch = $5 FOR SHARE
), doomed AS (
    SELECT o.id FROM outbox AS o
    WHERE o.partition = $2 AND o.processed_at < clock_timestamp() - make_interval(secs => $4) AND o.dead_at IS NULL AND EXISTS (SELECT 1 FROM held)
    ORDER BY o.processed_at
    LIMIT $3
    FOR UPDATE SKIP LOCKED
)
DELETE FROM outbox WHERE id IN (SELECT id FROM doomed)`

// NotifyChannel is the LISTEN/NOTIFY channel the outbox triggers signal,
// with the partition number as payload.
const NotifyChannel = "ordo_outbox"
