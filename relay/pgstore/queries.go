package pgstore

import "github.com/ordo-relay/ordo/relay/internal/pgwrite"

// sqlReadPending: see Store.ReadPending. A backing-off row's wait is
// returned as seconds left by the database's clock, so the node's clock
// need not agree with it. One index range scan per partition on
// outbox_ready_by_partition (partition, seq): pending rows neither parked
// nor held behind a parked row, so a parked key costs the read nothing
// once its rows are held (sqlHoldBehindParked). For each row one equality
// probe of the unique (correlation_id, key_seq) index for the row below
// it: the only sensible plans, generic or custom, with or without
// statistics, and a cost that follows the rows returned. The probe's
// LIMIT 1 keeps it a subquery run per row: without it PostgreSQL may turn
// it into a join, and with statistics of a hot key (one correlation_id)
// it hashed the key's whole backlog on every read (77 msg/s draining one
// key of 20,000 rows after ANALYZE).
//
// The probe also says whether the row below is parked or held, and
// behind which parked row (its key_seq; 0: none): such a row comes
// without its payload and headers (NULL), as it cannot go before an
// operator acts, and Store.ReadPending holds it. A payload of megabytes,
// detoasted and sent by every read of its partition while its key stays
// parked, once made every read of the node outlast the read timeout.
// A row's key_seq is the row's own (numbered by the producers' trigger,
// or written there by a failure record or a hold) or its number in the
// journal (outbox_numbers, package outbox's): one primary-key probe, for
// rows without key_seq only. The row below is probed in the unique
// (correlation_id, key_seq) index and, if it is not there, in the
// journal's. A row numbered nowhere comes with key_seq 0 and its
// unnumbered column true: Store.ReadPending numbers it and reads again.
var sqlReadPending = readPendingSQL("CASE WHEN prev.head IS NULL THEN o.payload END", "CASE WHEN prev.head IS NULL THEN o.headers END")

// sqlPeekPending: see Store.PeekPending. sqlReadPending without any
// payload or headers: the relay peeks at a row too slow to read, whose
// payload it must not fetch (docs/design.md, "A slow row is read alone").
var sqlPeekPending = readPendingSQL("NULL::jsonb", "NULL::jsonb")

// readPendingSQL is the pending-rows read with payload and headers as the
// expressions given (over o, the row, and prev, the row below).
func readPendingSQL(payload, headers string) string {
	return `
SELECT o.id, o.partition, o.seq, o.correlation_id, coalesce(ks.key_seq, 0), o.exchange, o.routing_key, o.type,
       ` + payload + `, ` + headers + `, o.occurred_at, o.attempts,
       greatest(extract(epoch FROM o.next_attempt_at - clock_timestamp()), 0)::float8,
       coalesce(prev.pending, false), coalesce(prev.dead, false),
       ks.key_seq IS NULL, coalesce(prev.head, 0)
FROM unnest($1::int[], $2::bigint[]) AS c(partition, after)
CROSS JOIN LATERAL (
    SELECT * FROM outbox AS x
    WHERE x.partition = c.partition AND x.processed_at IS NULL AND x.parked_at IS NULL AND x.held_behind IS NULL
      AND x.seq > c.after
    ORDER BY x.seq
    LIMIT $3
) AS o
LEFT JOIN LATERAL (
    SELECT n.key_seq FROM outbox_numbers AS n WHERE n.id = o.id AND o.key_seq IS NULL
    LIMIT 1
) AS j ON true
CROSS JOIN LATERAL (SELECT coalesce(o.key_seq, j.key_seq) AS key_seq) AS ks
LEFT JOIN LATERAL (
    (SELECT d.processed_at IS NULL AS pending, d.dead_at IS NOT NULL AND d.processed_at IS NOT NULL AS dead,
            CASE WHEN d.processed_at IS NULL THEN coalesce(d.held_behind, CASE WHEN d.parked_at IS NOT NULL THEN d.key_seq END) END AS head
     FROM outbox AS d
     WHERE d.correlation_id = o.correlation_id AND d.key_seq = ks.key_seq - 1
     LIMIT 1)
    UNION ALL
    (SELECT d.processed_at IS NULL, false, NULL::bigint
     FROM outbox_numbers AS pn JOIN outbox AS d ON d.id = pn.id
     WHERE pn.correlation_id = o.correlation_id AND pn.key_seq = ks.key_seq - 1
     LIMIT 1)
    LIMIT 1
) AS prev ON true`
}

// sqlHoldBehindParked holds out of the read (held_behind) the pending rows
// of keys $3 (each in partition $2[i]) above their parked row, key_seq
// $4[i], while node $1 holds the partition and that row is still parked
// and pending, and returns the ids it held. The parked rows are locked
// FOR SHARE until the holds commit, so an operator's retry or skip of
// one, whose trigger releases the rows held behind it
// (outbox_release_held, package outbox's), waits for them and then sees
// them; one being changed right now (locked) is skipped, not waited for:
// its rows are read again and held by a later read, if it is still
// parked. The leases are locked FOR SHARE in partition order, as every
// relay write locks them. Each key costs an index probe of its parked
// row and an index range scan of its rows above it, both on the unique
// (correlation_id, key_seq) index: the filters on the rows' state stay
// outside those scans (a LIMIT, an OFFSET 0), or a partial index whose
// predicate they match looks cheapest to the planner. On a table
// without statistics it walked outbox_ready_by_partition whole for each
// key (100 s for 2,000 keys), and with statistics taken before any row
// was parked, outbox_parked (360 s for 20,000 keys).
var sqlHoldBehindParked = `
WITH held AS (
    SELECT l.partition FROM ordo_leases AS l
    WHERE l.owner = $1 AND l.partition = ANY($2::int[])
    ORDER BY l.partition
    FOR SHARE),
heads AS (
    SELECT h.correlation_id, h.key_seq
    FROM unnest($2::int[], $3::text[], $4::bigint[]) AS k(partition, key, head)
    CROSS JOIN LATERAL (
        SELECT x.correlation_id, x.key_seq, x.partition, x.parked_at, x.processed_at FROM outbox AS x
        WHERE x.correlation_id = k.key AND x.key_seq = k.head
        LIMIT 1
        FOR SHARE SKIP LOCKED) AS h
    WHERE k.partition = ANY (ARRAY(SELECT partition FROM held))
      AND h.partition = k.partition AND h.parked_at IS NOT NULL AND h.processed_at IS NULL),
behind AS (
    SELECT f.id, f.key_seq, heads.key_seq AS head FROM heads
    CROSS JOIN LATERAL (
        SELECT x.id, x.key_seq, x.processed_at, x.parked_at, x.held_behind FROM outbox AS x
        WHERE x.correlation_id = heads.correlation_id AND x.key_seq > heads.key_seq
        ORDER BY x.key_seq
        OFFSET 0) AS f
    WHERE f.processed_at IS NULL AND f.parked_at IS NULL AND f.held_behind IS NULL
    UNION ALL` + journaledAbove("heads", "") + `),
hold AS (
    UPDATE outbox AS o SET held_behind = behind.head, key_seq = behind.key_seq
    FROM behind
    WHERE o.id = behind.id
    RETURNING o.id),
unjournaled AS (
    DELETE FROM outbox_numbers AS n USING hold WHERE n.id = hold.id)
SELECT id FROM hold`

// journaledAbove is the branch of a hold's behind set (sqlHoldBehindParked,
// sqlRecordFailures) for the rows numbered in the owner's journal: for
// each row h of from (a parked head: correlation_id, key_seq) that cond
// (a prefix of the WHERE over h) admits, the pending rows of its key
// above it, neither parked nor held, as (id, key_seq, the head's
// key_seq). The outbox row is read by id behind OFFSET 0, so that no
// partial index whose predicate the state filters match drives the scan.
func journaledAbove(from, cond string) string {
	return `
    SELECT f.id, f.key_seq, h.key_seq FROM ` + from + ` AS h
    JOIN outbox_numbers AS n ON n.correlation_id = h.correlation_id AND n.key_seq > h.key_seq
    CROSS JOIN LATERAL (
        SELECT x.id, n.key_seq, x.processed_at, x.parked_at, x.held_behind FROM outbox AS x
        WHERE x.id = n.id
        OFFSET 0) AS f
    WHERE ` + cond + `f.processed_at IS NULL AND f.parked_at IS NULL AND f.held_behind IS NULL`
}

// sqlHoldPlan confines the planner, for the hold's own transaction, to
// the plan sqlHoldBehindParked is written for: for each key an index
// probe of its parked row and an index range scan of its rows above it
// (the unique (correlation_id, key_seq) index). On a table without
// statistics PostgreSQL may otherwise choose hash joins over sequential
// scans of the outbox when it expects many keys.
const sqlHoldPlan = `SELECT set_config('enable_seqscan', 'off', true), set_config('enable_bitmapscan', 'off', true),
       set_config('enable_hashjoin', 'off', true), set_config('enable_mergejoin', 'off', true), set_config('jit', 'off', true)`

// sqlJournalRows numbers the unnumbered pending rows of each partition
// $2[i] up to seq $3[i] while node $1 holds that partition, in the
// journal: outbox_journal_rows, package outbox's (docs/outbox-table.md,
// "Who numbers a key's rows").
const sqlJournalRows = `SELECT outbox_journal_rows($1, $2::int[], $3::bigint[])`

// sqlRegister records that node numbers rows (ordo_numbering_nodes), so
// that the producers' key_seq trigger may be dropped once every node
// holding a lease is listed, and that it is of release 3: it reads no
// index over every pending row (release 2), so that
// outbox_pending_by_partition may be dropped once every such node is, and
// its mark clears a dead_at it did not write (release 3), so that
// outbox_dead_is_processed may be.
const sqlRegister = `INSERT INTO ordo_numbering_nodes AS n (node, release) VALUES ($1, 3)
ON CONFLICT (node) DO UPDATE SET release = 3 WHERE n.release < 3`

// sqlPrevKeySeq walks down from key_seq $2 - 1 over the key's dead rows
// and returns the first key_seq that is not dead (0 if none): the
// x-ordo-prev-key-seq of row $2. A row missing below was deleted by
// retention, which never deletes dead rows, so it was not dead. Dead is
// skipped by an operator: processed with dead_at (a dead_at on a pending
// row is a producer's, which the mark clears).
const sqlPrevKeySeq = `
WITH RECURSIVE run(k) AS (
    SELECT $2::bigint - 1
    UNION ALL
    SELECT run.k - 1 FROM run
    WHERE run.k > 0 AND EXISTS (
        SELECT 1 FROM outbox WHERE correlation_id = $1 AND key_seq = run.k AND dead_at IS NOT NULL AND processed_at IS NOT NULL)
)
SELECT greatest(min(k), 0) FROM run`

// sqlHeld is the lease check shared by every relay write
// (pgwrite.HeldCTE).
const sqlHeld = pgwrite.HeldCTE

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

// Every write finds its rows by id, and compares the partition as
// "o.partition + 0": an expression no index can serve, so the primary key
// is the only index that finds a row. Compared plainly, the planner, which
// on a table without statistics expects one row per partition, probed
// (partition, seq) and filtered every pending row of the partition for
// each row marked: 750 buffers per row at 100,000 pending rows
// (TestPlansFollowTheWork).

// sqlMarkPublished marks confirmed rows processed, epoch-checked. It
// clears dead_at, which only an operator's skip writes on a row it
// processes: a value on a pending row is a producer's (nothing refuses
// it once outbox_dead_is_processed is dropped), and left there it would
// make the published row look skipped.
//
// It leaves a journaled row's key_seq in the journal: written into the
// row, the number filled a null column in the row's middle and moved
// every byte after it, payload included, so the new row version's WAL
// record carried most of the row (PostgreSQL logs only what differs
// from the old version's leading and trailing bytes): 551 B of heap WAL
// a row against 123 for processed_at alone, and about 430 B a message
// over the whole relay with the journal's delete. The entry goes with
// its row (sqlRetention).
var sqlMarkPublished = `
WITH ` + sqlHeld + `,
marked AS (
    UPDATE outbox AS o SET processed_at = clock_timestamp(), dead_at = NULL
    FROM m JOIN held AS h ON h.partition = m.partition AND h.epoch = m.epoch
    WHERE o.id = m.id AND o.partition + 0 = m.partition AND o.processed_at IS NULL
    RETURNING o.id),` + sqlRefused("mark") + `
SELECT id FROM marked`

// sqlRecordFailures counts one failed attempt per row, epoch-checked,
// sets when it may be tried again ($6, seconds from now), and parks it once
// it has failed $7 times, holding the pending rows of its key above it
// out of the read in the same statement (see sqlHoldBehindParked): from
// its commit no read returns them, whatever happens to the rows between
// (a row deleted by hand below one of them once let it look free to go).
var sqlRecordFailures = `
WITH ` + sqlHeld + `,
e AS (SELECT * FROM unnest($2::uuid[], $5::text[], $6::float8[]) AS e(id, err, delay)),
failed AS (
    UPDATE outbox AS o
    SET attempts = o.attempts + 1,
        last_error = left(e.err, 1000),
        next_attempt_at = clock_timestamp() + make_interval(secs => e.delay),
        parked_at = CASE WHEN o.attempts + 1 >= $7 THEN clock_timestamp() END,
        key_seq = coalesce(o.key_seq, n.key_seq)
    FROM m JOIN held AS h ON h.partition = m.partition AND h.epoch = m.epoch
           JOIN e ON e.id = m.id
           LEFT JOIN outbox_numbers AS n ON n.id = m.id
    WHERE o.id = m.id AND o.partition + 0 = m.partition AND o.processed_at IS NULL
    RETURNING o.id, o.parked_at IS NOT NULL AS parked, o.correlation_id, o.key_seq),
behind AS (
    SELECT x.id, x.key_seq, p.key_seq AS head FROM failed AS p
    CROSS JOIN LATERAL (
        SELECT f.id, f.key_seq, f.processed_at, f.parked_at, f.held_behind FROM outbox AS f
        WHERE f.correlation_id = p.correlation_id AND f.key_seq > p.key_seq
        ORDER BY f.key_seq
        OFFSET 0) AS x
    WHERE p.parked AND x.processed_at IS NULL AND x.parked_at IS NULL AND x.held_behind IS NULL
    UNION ALL` + journaledAbove("failed", "h.parked AND ") + `),
held_behind AS (
    UPDATE outbox AS o SET held_behind = behind.head, key_seq = behind.key_seq
    FROM behind
    WHERE o.id = behind.id
    RETURNING o.id),
unjournaled AS (
    DELETE FROM outbox_numbers AS n
    WHERE n.id IN (SELECT id FROM failed UNION ALL SELECT id FROM held_behind)),` + sqlRefused("failure record") + `
SELECT id FROM failed WHERE parked`

// sqlRetention deletes up to $3 processed, not dead, rows of partition $2
// processed more than $4 seconds ago, while node $1 holds the partition at
// epoch $5, and the journal entries of those the owner numbered
// (sqlMarkPublished leaves them), and returns how many rows it deleted.
const sqlRetention = `
WITH held AS (
    SELECT 1 FROM ordo_leases WHERE partition = $2 AND owner = $1 AND epoch = $5 FOR SHARE
), doomed AS (
    SELECT o.id FROM outbox AS o
    WHERE o.partition = $2 AND o.processed_at < clock_timestamp() - make_interval(secs => $4) AND o.dead_at IS NULL AND EXISTS (SELECT 1 FROM held)
    ORDER BY o.processed_at
    LIMIT $3
    FOR UPDATE SKIP LOCKED
), gone AS (
    DELETE FROM outbox WHERE id = ANY(ARRAY(SELECT id FROM doomed))
    RETURNING id
), unjournaled AS (
    DELETE FROM outbox_numbers AS n WHERE n.id = ANY(ARRAY(SELECT id FROM gone))
)
SELECT count(*) FROM gone`
