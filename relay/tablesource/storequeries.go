package tablesource

import (
	"fmt"

	"github.com/ordo-relay/ordo/relay/internal/pgwrite"
)

// The Store's statements. Those that touch the user's table are built
// once per Layout from its quoted identifiers; every value is a
// parameter. Every relay write checks the leases as package pgstore's do:
// the node's lease rows at the epochs given, locked FOR SHARE in
// partition order until the write commits.

// storeSQL holds the Store's statements for one layout.
type storeSQL struct {
	read, peek, intake, mark, deleteDead string
}

func newStoreSQL(l Layout) storeSQL {
	col := func(name string) string { return "m." + quote(name) }
	return storeSQL{
		read:       readSQL(l, fmt.Sprintf("%s::text", col(l.Payload))),
		peek:       readSQL(l, "NULL::text"),
		intake:     intakeSQL(l),
		mark:       markSQL(l),
		deleteDead: deleteDeadSQL(l),
	}
}

// readSQL reads, for each partition $1[i], up to $3 rows of
// ordo_table_rows above seq $2[i] that may go (neither parked, dead nor
// held), in seq order: one range scan of ordo_table_rows_ready per
// partition. For each row, one probe of the key's row below it (key,
// key_seq - 1) and one primary-key probe of the user's row for what the
// message carries, with payload the expression given over m, the user's
// row (none for a row behind a parked one). A row whose user row is gone
// or already processed says so (the last column false): Store.ReadPending
// marks it dead. head is the key_seq of the parked row a row waits
// behind (its prev parked, or held behind it), 0 if none:
// Store.ReadPending holds such rows.
func readSQL(l Layout, payload string) string {
	col := func(name string) string { return "m." + quote(name) }
	return fmt.Sprintf(`
SELECT o.id, o.partition, o.seq, o.key, coalesce(o.key_seq, 0), o.occurred_at, o.attempts,
       greatest(extract(epoch FROM o.next_attempt_at - clock_timestamp()), 0)::float8,
       o.key_seq IS NULL, prev.key_seq IS NOT NULL AND prev.dead_at IS NULL, coalesce(prev.dead_at IS NOT NULL, false),
       coalesce(ph.head, 0),
       u.typ, u.rk, CASE WHEN ph.head IS NULL THEN u.payload END,
       u.id IS NOT NULL AND u.processed_at IS NULL
FROM unnest($1::int[], $2::bigint[]) AS c(partition, after)
CROSS JOIN LATERAL (
    SELECT * FROM ordo_table_rows AS x
    WHERE x.partition = c.partition AND x.parked_at IS NULL AND x.dead_at IS NULL AND x.held_behind IS NULL AND x.seq > c.after
    ORDER BY x.seq
    LIMIT $3
) AS o
LEFT JOIN LATERAL (
    SELECT d.key_seq, d.dead_at, d.parked_at, d.held_behind FROM ordo_table_rows AS d
    WHERE d.key = o.key AND d.key_seq = o.key_seq - 1
    LIMIT 1
) AS prev ON true
CROSS JOIN LATERAL (
    SELECT CASE WHEN prev.dead_at IS NULL THEN coalesce(prev.held_behind, CASE WHEN prev.parked_at IS NOT NULL THEN prev.key_seq END) END AS head
) AS ph
LEFT JOIN LATERAL (
    SELECT %s AS id, %s::text AS typ, %s::text AS rk, %s AS payload, %s AS processed_at
    FROM %s AS m WHERE %s = o.id
) AS u ON true`,
		col(l.ID), col(l.Type), col(l.RoutingKey), payload, col(l.ProcessedAt),
		l.QuotedTable(), col(l.ID))
}

// intakeSQL takes a page of the user's pending rows into ordo_table_rows
// ($1 ids, $2 partitions, $3 keys, $4 occurred-at, $5 problems, in read
// order), idempotently, numbered (ordo_table_take_in, migration 8), and
// returns how many it took in and how many of those are late rows; when
// it took any in, it notifies channel $6 with each payload of $7 (the
// page's partitions, listen.go) at its commit.
//
// Rows already taken in are left out first, by one probe of
// ordo_table_rows each: a fast pass reads again every row of its look-back
// that is taken in and not yet marked, and those are neither locked nor
// passed on. Each other row of the page is found in the user's table by
// one primary-key probe (LIMIT 1: with the pending filter beside the id,
// the planner walked the partial index of every pending row once per page
// and matched the page against it, 341 ms a page of 500 on 20,000 pending
// rows) and locked FOR SHARE: a row whose mark is under way (taken in,
// numbered and published since this statement's snapshot) is waited for
// and then read as the mark left it, processed, so it is never taken in
// again and published twice. A page with nothing left to take in calls
// no function and returns no row.
func intakeSQL(l Layout) string {
	col := func(name string) string { return "m." + quote(name) }
	return fmt.Sprintf(`
WITH fresh AS MATERIALIZED (
    SELECT u.id, u.partition, u.key, u.occurred_at, u.problem, u.ord
    FROM unnest($1::uuid[], $2::int[], $3::text[], $4::timestamptz[], $5::text[])
         WITH ORDINALITY AS u(id, partition, key, occurred_at, problem, ord)
    WHERE NOT EXISTS (SELECT 1 FROM ordo_table_rows AS r WHERE r.id = u.id)
), live AS (
    SELECT f.id, f.partition, f.key, f.occurred_at, f.problem, f.ord
    FROM fresh AS f
    CROSS JOIN LATERAL (
        SELECT %s AS processed_at FROM %s AS m WHERE %s = f.id
        LIMIT 1
        FOR SHARE OF m) AS m
    WHERE m.processed_at IS NULL
), page AS (
    SELECT coalesce(array_agg(id ORDER BY ord), '{}') AS ids, coalesce(array_agg(partition ORDER BY ord), '{}') AS parts,
           coalesce(array_agg(key ORDER BY ord), '{}') AS keys, coalesce(array_agg(occurred_at ORDER BY ord), '{}') AS ats,
           coalesce(array_agg(problem ORDER BY ord), '{}') AS problems
    FROM live
)
SELECT t.taken, t.late, (SELECT count(pg_notify($6, c)) FROM unnest($7::text[]) AS c WHERE t.taken > 0)
FROM page CROSS JOIN LATERAL ordo_table_take_in(page.ids, page.parts, page.keys, page.ats, page.problems) AS t
WHERE cardinality(page.ids) > 0`,
		col(l.ProcessedAt), l.QuotedTable(), col(l.ID))
}

// sqlIntakePlan confines the planner, for the intake's transaction, to
// one primary-key probe of the user's table per row of the page.
const sqlIntakePlan = `SELECT set_config('enable_seqscan', 'off', true), set_config('enable_bitmapscan', 'off', true),
       set_config('enable_hashjoin', 'off', true), set_config('enable_mergejoin', 'off', true)`

// sqlHeld is the lease check of every write (pgwrite.HeldCTE).
const sqlHeld = pgwrite.HeldCTE

// markSQL deletes the confirmed rows from ordo_table_rows and sets the
// user's processed-at on them, in one statement, while the node holds
// each row's partition at its epoch, and returns the ids it marked. A
// user row already processed (by someone else) is left as it is.
func markSQL(l Layout) string {
	return fmt.Sprintf(`
WITH `+sqlHeld+`,
done AS (
    DELETE FROM ordo_table_rows AS o
    USING m JOIN held AS h ON h.partition = m.partition AND h.epoch = m.epoch
    WHERE o.id = m.id AND o.partition + 0 = m.partition AND o.dead_at IS NULL
    RETURNING o.id),
marked AS (
    UPDATE %s AS t SET %s = clock_timestamp()
    FROM done WHERE t.%s = done.id AND t.%s IS NULL)
SELECT id FROM done`, l.QuotedTable(), quote(l.ProcessedAt), quote(l.ID), quote(l.ProcessedAt))
}

// sqlMarkGone marks dead the numbered rows $2 (in partitions $3) whose
// user row was processed or deleted by someone else, while node $1
// holds their partitions: their number stays, and the next row's prev
// steps over it.
const sqlMarkGone = `
WITH held AS (
    SELECT l.partition FROM ordo_leases AS l
    WHERE l.owner = $1 AND l.partition = ANY($3::int[])
    ORDER BY l.partition
    FOR SHARE)
UPDATE ordo_table_rows AS o SET dead_at = clock_timestamp(), last_error = 'processed or deleted outside Ordo'
FROM unnest($2::uuid[], $3::int[]) AS g(id, partition)
WHERE o.id = g.id AND o.partition + 0 = g.partition AND g.partition IN (SELECT partition FROM held)
  AND o.dead_at IS NULL AND o.key_seq IS NOT NULL`

// sqlRecordFailures counts one failed attempt per row while the node
// holds its partition at the epoch given, sets when it may be tried
// again ($6, seconds from now), and parks it once it has failed $7
// times. It returns the ids it parked.
const sqlRecordFailures = `
WITH ` + sqlHeld + `,
e AS (SELECT * FROM unnest($2::uuid[], $5::text[], $6::float8[]) AS e(id, err, delay)),
failed AS (
    UPDATE ordo_table_rows AS o
    SET attempts = o.attempts + 1,
        last_error = left(e.err, 1000),
        next_attempt_at = clock_timestamp() + make_interval(secs => e.delay),
        parked_at = CASE WHEN o.attempts + 1 >= $7 THEN clock_timestamp() END
    FROM m JOIN held AS h ON h.partition = m.partition AND h.epoch = m.epoch
           JOIN e ON e.id = m.id
    WHERE o.id = m.id AND o.partition + 0 = m.partition AND o.dead_at IS NULL
    RETURNING o.id, o.parked_at IS NOT NULL AS parked)
SELECT id FROM failed WHERE parked`

// sqlNumber numbers the unnumbered rows of at most $3 keys of partitions
// $2 while node $1 holds them, and says how many keys it numbered
// (ordo_table_number, this package's migration 7).
const sqlNumber = `SELECT numbered, late, keys FROM ordo_table_number($1, $2::int[], $3::int)`

// sqlPrevKeySeq walks down from key_seq $2 - 1 over the key's dead rows
// and returns the first key_seq that is not dead (0 if none). A number
// missing below was published and marked: not dead.
const sqlPrevKeySeq = `
WITH RECURSIVE run(k) AS (
    SELECT $2::bigint - 1
    UNION ALL
    SELECT run.k - 1 FROM run
    WHERE run.k > 0 AND EXISTS (
        SELECT 1 FROM ordo_table_rows WHERE key = $1 AND key_seq = run.k AND dead_at IS NOT NULL)
)
SELECT greatest(min(k), 0) FROM run`

// sqlIntakeHolder says whether node $1 holds partition 0, whose holder
// runs the intake.
const sqlIntakeHolder = `SELECT EXISTS (SELECT 1 FROM ordo_leases WHERE partition = 0 AND owner = $1 AND expires_at > clock_timestamp())`

// deleteDeadSQL deletes up to $3 rows of partition $2 dead for more than
// $4 seconds that no walk over dead rows can reach any more, while node
// $1 holds the partition at epoch $5. A dead row's number is walked over
// by the prev of the key's next row (sqlPrevKeySeq) only while that row
// is still here: once the number above it is gone (its row published,
// marked and forgotten, or itself a dead row deleted so), every row of
// the key still to go is above a published one and its walk stops there.
// The key's top number is kept, for the row the key will get next. A
// chain of dead rows goes from its top, one row per run. A dead row
// whose user row is still pending (skipped in ordo_table_rows alone) is
// kept: deleted, it would let the intake take the user's row in again
// and publish it.
func deleteDeadSQL(l Layout) string {
	return fmt.Sprintf(`
WITH held AS (
    SELECT 1 FROM ordo_leases WHERE partition = $2 AND owner = $1 AND epoch = $5 FOR SHARE
), doomed AS (
    SELECT d.id FROM ordo_table_rows AS d
    JOIN ordo_table_keys AS c ON c.key = d.key
    WHERE d.partition = $2 AND d.dead_at IS NOT NULL AND d.dead_at < clock_timestamp() - make_interval(secs => $4)
      AND EXISTS (SELECT 1 FROM held)
      AND c.last_key_seq > d.key_seq
      AND NOT EXISTS (SELECT 1 FROM ordo_table_rows AS x WHERE x.key = d.key AND x.key_seq = d.key_seq + 1)
      AND NOT EXISTS (SELECT 1 FROM %s AS m WHERE m.%s = d.id AND m.%s IS NULL)
    LIMIT $3
)
DELETE FROM ordo_table_rows AS o USING doomed WHERE o.id = doomed.id`, l.QuotedTable(), quote(l.ID), quote(l.ProcessedAt))
}

// sqlHoldBehindParked holds, while node $1 holds their partitions, the
// pending rows of each key $3[i] (partition $2[i]) above its parked row
// at key_seq $4[i], if that row is still parked: they leave the read
// (ordo_table_rows_ready) until the row is retried, skipped or deleted
// (ordo_table_release_held). The leases are locked FOR SHARE in
// partition order, as every relay write locks them; the parked row FOR
// SHARE SKIP LOCKED, so that an operator's retry under way is not waited
// for (its trigger releases what was held before it). Each key costs a
// probe of its parked row and a range scan of its rows above it, both
// on the unique (key, key_seq) index: the filters on the rows' state
// stay outside the scan (OFFSET 0), or a partial index whose predicate
// they match looks cheapest to the planner.
const sqlHoldBehindParked = `
WITH held AS (
    SELECT l.partition FROM ordo_leases AS l
    WHERE l.owner = $1 AND l.partition = ANY($2::int[])
    ORDER BY l.partition
    FOR SHARE),
heads AS (
    SELECT h.key, h.key_seq
    FROM unnest($2::int[], $3::text[], $4::bigint[]) AS k(partition, key, head)
    CROSS JOIN LATERAL (
        SELECT x.key, x.key_seq, x.partition, x.parked_at, x.dead_at FROM ordo_table_rows AS x
        WHERE x.key = k.key AND x.key_seq = k.head
        LIMIT 1
        FOR SHARE SKIP LOCKED) AS h
    WHERE k.partition = ANY (ARRAY(SELECT partition FROM held))
      AND h.partition = k.partition AND h.parked_at IS NOT NULL AND h.dead_at IS NULL),
behind AS (
    SELECT f.id, heads.key_seq AS head FROM heads
    CROSS JOIN LATERAL (
        SELECT x.id, x.parked_at, x.dead_at, x.held_behind FROM ordo_table_rows AS x
        WHERE x.key = heads.key AND x.key_seq > heads.key_seq
        ORDER BY x.key_seq
        OFFSET 0) AS f
    WHERE f.parked_at IS NULL AND f.dead_at IS NULL AND f.held_behind IS NULL)
UPDATE ordo_table_rows AS o SET held_behind = behind.head
FROM behind
WHERE o.id = behind.id
RETURNING o.id`

// sqlHoldPlan confines the planner, for the hold's own transaction, to
// the index probes and range scans sqlHoldBehindParked is written for.
const sqlHoldPlan = `SELECT set_config('enable_seqscan', 'off', true), set_config('enable_bitmapscan', 'off', true),
       set_config('enable_hashjoin', 'off', true), set_config('enable_mergejoin', 'off', true)`
