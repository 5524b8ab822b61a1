package relay

// sqlReadHeads: see Store.ReadHeads. Within a key only key_seq counts; seq
// orders different keys. Never "seq > cursor": a row whose transaction
// commits late would be skipped.
const sqlReadHeads = `
SELECT o.id, o.partition, o.correlation_id, o.key_seq, o.exchange, o.routing_key, o.type,
       o.payload, o.headers, o.occurred_at, o.attempts
FROM outbox AS o
WHERE o.processed_at IS NULL
  AND o.partition = ANY($1::int[])
  AND NOT (o.id = ANY(coalesce($2::uuid[], '{}')))
  AND (SELECT count(*) FROM (
         SELECT 1 FROM outbox AS b
         WHERE b.partition = o.partition AND b.correlation_id = o.correlation_id
           AND b.processed_at IS NULL AND b.key_seq < o.key_seq
         LIMIT $3) AS ahead) < $3
ORDER BY o.seq
LIMIT $4`

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

// sqlRecordFailures counts one failed attempt per row, epoch-checked.
var sqlRecordFailures = `
WITH ` + sqlHeld + `,
e AS (SELECT * FROM unnest($2::uuid[], $5::text[]) AS e(id, err)),
failed AS (
    UPDATE outbox AS o SET attempts = o.attempts + 1, last_error = left(e.err, 1000)
    FROM m JOIN held AS h ON h.partition = m.partition AND h.epoch = m.epoch
           JOIN e ON e.id = m.id
    WHERE o.id = m.id AND o.partition = m.partition AND o.processed_at IS NULL
    RETURNING o.id),` + sqlRefused("failure record") + `
SELECT count(*) FROM failed`

// NotifyChannel is the LISTEN/NOTIFY channel the outbox triggers signal,
// with the partition number as payload.
const NotifyChannel = "ordo_outbox"

// sqlPartitionStatus is one row per partition: its lease and its backlog.
const sqlPartitionStatus = `
SELECT l.partition, coalesce(l.owner, ''), l.epoch, nullif(l.expires_at, '-infinity'),
       coalesce(p.pending, 0), extract(epoch FROM clock_timestamp() - p.oldest)::float8
FROM ordo_leases AS l
LEFT JOIN (
    SELECT partition, count(*) AS pending, min(occurred_at) AS oldest
    FROM outbox WHERE processed_at IS NULL GROUP BY partition
) AS p ON p.partition = l.partition
ORDER BY l.partition`
