package inbox

// Every SQL statement of the package. $1 is always the consumer name; a
// key is (source, correlation id), the source always the last parameter.
//
// The fence: a write made under a shard lease checks, in the same
// statement, that the lease row still names this owner at this epoch, and
// locks it FOR KEY SHARE until commit, so a new owner's claim (which locks
// the row FOR UPDATE, SKIP LOCKED, before it bumps the epoch) waits for
// the commit or makes the write fail. FOR KEY SHARE, not FOR SHARE: a
// renewal (an update of expires_at alone) does not wait for the commits
// in flight, nor do the writes that follow wait behind it. Every change
// of a lease's owner or epoch (sqlClaimShards) must lock the row FOR
// UPDATE first; a plain UPDATE of non-key columns would not wait. Epoch 0
// turns the check off (a Store used without leases).

const (
	// sqlDecide locks the key's row, creating it at last_seq $6 (0, or in
	// Bootstrap mode the message's prev) for a new key, and returns its
	// last handled key_seq (NULL only when another transaction created the
	// row meanwhile: lock it with sqlLockKey) and message id, whether the
	// message is already stored, whether a stored message of the key
	// precedes it (a retry, a dead message or a gap: the message must wait
	// behind it), whether the key has never handled a message (a new row,
	// or one only held or moved by an operator), and the retention
	// low-water mark. It also bounds how long this transaction may sit
	// idle, so a paused process cannot hold the key's lock past its lease.
	// One round trip for all of it. $2 key, $3 key_seq, $4 idle timeout
	// (ms, text), $5 source, $6 a new key's last_seq.
	sqlDecide = `
WITH new AS (
    INSERT INTO ordo_inbox_keys (consumer, source, correlation_id, last_seq) VALUES ($1, $5, $2, $6)
    ON CONFLICT DO NOTHING RETURNING last_seq
)
SELECT set_config('idle_in_transaction_session_timeout', $4, true),
       coalesce(k.last_seq, (SELECT last_seq FROM new)), coalesce(k.last_message_id, ''),
       EXISTS (SELECT 1 FROM ordo_inbox_messages WHERE consumer = $1 AND source = $5 AND correlation_id = $2 AND key_seq = $3),
       EXISTS (SELECT 1 FROM ordo_inbox_messages WHERE consumer = $1 AND source = $5 AND correlation_id = $2 AND key_seq < $3),
       k.last_message_id IS NULL,
       (SELECT low_water FROM ordo_inbox_retention WHERE consumer = $1)
FROM (SELECT 1) AS one
LEFT JOIN LATERAL (
    SELECT last_seq, last_message_id FROM ordo_inbox_keys
    WHERE consumer = $1 AND source = $5 AND correlation_id = $2 FOR UPDATE
) AS k ON true`

	// sqlNewKey creates a key's row at last_seq $3 (0, or in Bootstrap
	// mode the first message's prev); RETURNING is empty if another
	// transaction created it first. $2 key, $4 source. (sqlDecide does
	// the same; this is for the rare race it leaves to sqlLockKey.)
	sqlNewKey = `
INSERT INTO ordo_inbox_keys (consumer, source, correlation_id, last_seq) VALUES ($1, $4, $2, $3)
ON CONFLICT DO NOTHING RETURNING last_seq`

	// sqlLockKey locks an existing key row. $2 key, $3 source.
	sqlLockKey = `SELECT last_seq FROM ordo_inbox_keys WHERE consumer = $1 AND source = $3 AND correlation_id = $2 FOR UPDATE`

	// sqlAdvance records a handled message, fenced, and deletes the key's
	// stored messages it passes. It returns the rows updated (0: fenced)
	// and whether a stored message of the key is left after it (only then
	// is there anything to follow). $2 key, $3 key_seq, $4 message id,
	// $5 occurred_at, $6 shard, $7 owner, $8 epoch, $9 source.
	sqlAdvance = `
WITH fence AS (
    SELECT 1 FROM ordo_inbox_leases
    WHERE consumer = $1 AND shard = $6 AND owner = $7 AND epoch = $8 AND $8 > 0
    FOR KEY SHARE
), upd AS (
    UPDATE ordo_inbox_keys
    SET last_seq = $3, last_message_id = $4, last_occurred_at = $5, handled_at = now()
    WHERE consumer = $1 AND source = $9 AND correlation_id = $2 AND ($8 = 0 OR EXISTS (SELECT 1 FROM fence))
    RETURNING 1
), del AS (
    DELETE FROM ordo_inbox_messages
    WHERE consumer = $1 AND source = $9 AND correlation_id = $2 AND key_seq <= $3 AND EXISTS (SELECT 1 FROM upd)
)
SELECT (SELECT count(*) FROM upd),
       EXISTS (SELECT 1 FROM ordo_inbox_messages WHERE consumer = $1 AND source = $9 AND correlation_id = $2 AND key_seq > $3)`

	// sqlStore stores a message, fenced; an existing row is kept as it is.
	// It also creates the key's row at last_seq $20 if there is none, in
	// the same statement: a message stored after its handler transaction
	// rolled back (and the key row created in it with it) must not be left
	// without a key row, or every query that joins the key would miss it.
	// $2.. the message, $16 seconds until due (NULL: a gap, due when its
	// predecessor is handled), $17 shard, $18 owner, $19 epoch (the lease),
	// $20 a new key's last_seq, $21 NULL or the reason the message is
	// stored dead (held for an operator), $22 source.
	//
	// A gap whose predecessor is handled already is due now, not never:
	// the key's row is read FOR SHARE, so an operator's Skip or Resolve
	// (which lock it FOR UPDATE, move last_seq and make the next stored
	// message due) either commits first, and this statement reads the
	// moved last_seq, or waits for this store and then sees the message.
	// Without it a message stored while a Skip ran was left due never.
	sqlStore = `
WITH fence AS (
    SELECT 1 FROM ordo_inbox_leases
    WHERE consumer = $1 AND shard = $17 AND owner = $18 AND epoch = $19 AND $19 > 0
    FOR KEY SHARE
), cur AS (
    SELECT last_seq FROM ordo_inbox_keys
    WHERE consumer = $1 AND source = $22 AND correlation_id = $2 AND $16::float8 IS NULL
    FOR SHARE
), key AS (
    INSERT INTO ordo_inbox_keys (consumer, source, correlation_id, last_seq)
    SELECT $1, $22, $2, $20 WHERE $19 = 0 OR EXISTS (SELECT 1 FROM fence)
    ON CONFLICT DO NOTHING
), ins AS (
    INSERT INTO ordo_inbox_messages (consumer, source, correlation_id, key_seq, prev_seq, partition, shard,
        message_id, type, exchange, routing_key, occurred_at, headers, body, attempts, last_error, next_attempt_at, dead_at)
    SELECT $1, $22, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, coalesce($21::text, $15::text),
        CASE WHEN $16::float8 IS NOT NULL THEN now() + make_interval(secs => $16::float8)
             WHEN (SELECT last_seq FROM cur) >= $4 THEN now()
             ELSE 'infinity'::timestamptz END,
        CASE WHEN $21::text IS NULL THEN NULL ELSE now() END
    WHERE $19 = 0 OR EXISTS (SELECT 1 FROM fence)
    ON CONFLICT DO NOTHING
    RETURNING 1
)
SELECT ($19 = 0 OR EXISTS (SELECT 1 FROM fence)), EXISTS (SELECT 1 FROM ins)`

	// sqlStartAttempt counts an attempt of a stored message before its
	// handler runs, in its own transaction, so a crash inside the handler
	// still counts. $2 key, $3 key_seq, $4 shard, $5 owner, $6 epoch,
	// $7 source.
	sqlStartAttempt = `
WITH fence AS (
    SELECT 1 FROM ordo_inbox_leases
    WHERE consumer = $1 AND shard = $4 AND owner = $5 AND epoch = $6 AND $6 > 0
    FOR KEY SHARE
)
UPDATE ordo_inbox_messages SET attempts = attempts + 1
WHERE consumer = $1 AND source = $7 AND correlation_id = $2 AND key_seq = $3 AND dead_at IS NULL
  AND ($6 = 0 OR EXISTS (SELECT 1 FROM fence))
RETURNING attempts`

	// sqlFailed records a failed attempt and when to try again. $2 key,
	// $3 key_seq, $4 error, $5 backoff (seconds), $6 shard, $7 owner, $8 epoch,
	// $9 source.
	sqlFailed = `
WITH fence AS (
    SELECT 1 FROM ordo_inbox_leases
    WHERE consumer = $1 AND shard = $6 AND owner = $7 AND epoch = $8 AND $8 > 0
    FOR KEY SHARE
)
UPDATE ordo_inbox_messages
SET last_error = $4, next_attempt_at = now() + make_interval(secs => $5)
WHERE consumer = $1 AND source = $9 AND correlation_id = $2 AND key_seq = $3 AND ($8 = 0 OR EXISTS (SELECT 1 FROM fence))`

	// sqlDead marks a stored message dead-lettered: its key waits for an
	// operator. $2 key, $3 key_seq, $4 reason, $5 shard, $6 owner, $7 epoch,
	// $8 source.
	sqlDead = `
WITH fence AS (
    SELECT 1 FROM ordo_inbox_leases
    WHERE consumer = $1 AND shard = $5 AND owner = $6 AND epoch = $7 AND $7 > 0
    FOR KEY SHARE
)
UPDATE ordo_inbox_messages
SET dead_at = now(), last_error = $4, next_attempt_at = 'infinity'
WHERE consumer = $1 AND source = $8 AND correlation_id = $2 AND key_seq = $3 AND dead_at IS NULL
  AND ($7 = 0 OR EXISTS (SELECT 1 FROM fence))`

	// storedCols is the column list scanStored reads.
	storedCols = `m.source, m.correlation_id, m.key_seq, m.prev_seq, m.partition, m.message_id, m.type, m.exchange,
    m.routing_key, m.occurred_at, m.headers, m.body, m.attempts, coalesce(m.last_error, ''), m.next_attempt_at,
    m.next_attempt_at <= now(), k.last_seq, m.dead_at IS NOT NULL,
    NOT EXISTS (SELECT 1 FROM ordo_inbox_messages b
                WHERE b.consumer = m.consumer AND b.source = m.source AND b.correlation_id = m.correlation_id
                  AND b.key_seq < m.key_seq)`

	// sqlKeyHead returns a key's lowest stored message, dead-lettered or
	// not, with the key's last handled key_seq. $2 key, $3 source.
	sqlKeyHead = `
SELECT ` + storedCols + `
FROM ordo_inbox_messages m JOIN ordo_inbox_keys k USING (consumer, source, correlation_id)
WHERE m.consumer = $1 AND m.source = $3 AND m.correlation_id = $2
ORDER BY m.key_seq LIMIT 1`

	// sqlDue returns a shard's stored messages whose retry is due. The
	// partial index on (consumer, shard, next_attempt_at) makes this a
	// range scan over due rows only: gaps wait at 'infinity'. $2 shard,
	// $3 limit.
	sqlDue = `
SELECT ` + storedCols + `
FROM ordo_inbox_messages m JOIN ordo_inbox_keys k USING (consumer, source, correlation_id)
WHERE m.consumer = $1 AND m.shard = $2 AND m.dead_at IS NULL AND m.next_attempt_at <= now()
ORDER BY m.next_attempt_at LIMIT $3`

	// sqlWaitAgain puts a due stored message back to waiting for its
	// predecessor ('infinity'), fenced: one that is not its key's next (an
	// operator's Skip makes the following message due whether or not it is
	// next), so that it does not stay in the due range, taking the place of
	// real retries. Handling its predecessor makes it next (follow). $2 key,
	// $3 key_seq, $4 shard, $5 owner, $6 epoch, $7 source.
	sqlWaitAgain = `
WITH fence AS (
    SELECT 1 FROM ordo_inbox_leases
    WHERE consumer = $1 AND shard = $4 AND owner = $5 AND epoch = $6 AND $6 > 0
    FOR KEY SHARE
)
UPDATE ordo_inbox_messages SET next_attempt_at = 'infinity'
WHERE consumer = $1 AND source = $7 AND correlation_id = $2 AND key_seq = $3 AND dead_at IS NULL
  AND ($6 = 0 OR EXISTS (SELECT 1 FROM fence))`

	// sqlDeleteStored drops a stored message found to be a duplicate. $2
	// key, $3 key_seq, $4 source.
	sqlDeleteStored = `DELETE FROM ordo_inbox_messages WHERE consumer = $1 AND source = $4 AND correlation_id = $2 AND key_seq = $3`

	// sqlSavepoint opens a message's savepoint in a batch's transaction
	// (group commit): each message of a batch runs after one, so that its
	// failure rolls back to it (sqlRollbackToSavepoint) and undoes only its
	// own writes. Savepoints are not released: a release costs a statement
	// and frees nothing the commit does not free; the batch bound
	// (maxBatchSize) keeps the subtransactions within the 64 PostgreSQL
	// tracks per transaction without overflow.
	sqlSavepoint = `SAVEPOINT m`

	// sqlRollbackToSavepoint undoes the writes of the batch's latest
	// message, its handler's included, and leaves the transaction usable
	// after an error.
	sqlRollbackToSavepoint = `ROLLBACK TO SAVEPOINT m`
)

// The statements of a batch's fast path (handleBatch): a batch whose
// messages are all their keys' next (or duplicates) is decided in one
// statement and advanced in one, whatever its size. Their arrays are read
// through sub-selects, so that the planner estimates their length the
// same in a plan for the values given (a custom plan) as in the plan
// cached for any (the generic one): a custom plan that knew a short
// batch's length looked cheaper, and PostgreSQL then planned the
// statement afresh at every execution, about a millisecond each.
const (
	// sqlDecideBatch is sqlDecide for a batch's messages $2..$5 (keys,
	// key_seqs, sources, new keys' last_seq), in order: it creates the
	// rows of keys it has not seen (the first message of a key giving
	// its last_seq), locks every key's row in the batch's order, and
	// returns, per message (by its ordinal), what sqlDecide returns. $6
	// is the idle timeout (ms, text).
	sqlDecideBatch = `
WITH c AS (
    SELECT * FROM unnest((SELECT $2::text[]), (SELECT $3::bigint[]), (SELECT $4::text[]), (SELECT $5::bigint[]))
        WITH ORDINALITY AS c(key, key_seq, source, base, i)
), new AS (
    INSERT INTO ordo_inbox_keys (consumer, source, correlation_id, last_seq)
    SELECT DISTINCT ON (c.source, c.key) $1, c.source, c.key, c.base FROM c ORDER BY c.source, c.key, c.i
    ON CONFLICT DO NOTHING RETURNING source, correlation_id, last_seq
)
SELECT (SELECT set_config('idle_in_transaction_session_timeout', $6, true)),
       c.i, coalesce(k.last_seq, n.last_seq), coalesce(k.last_message_id, ''),
       EXISTS (SELECT 1 FROM ordo_inbox_messages WHERE consumer = $1 AND source = c.source AND correlation_id = c.key AND key_seq = c.key_seq),
       EXISTS (SELECT 1 FROM ordo_inbox_messages WHERE consumer = $1 AND source = c.source AND correlation_id = c.key AND key_seq < c.key_seq),
       k.last_message_id IS NULL,
       (SELECT low_water FROM ordo_inbox_retention WHERE consumer = $1)
FROM c
LEFT JOIN new AS n ON n.source = c.source AND n.correlation_id = c.key
LEFT JOIN LATERAL (
    SELECT last_seq, last_message_id FROM ordo_inbox_keys
    WHERE consumer = $1 AND source = c.source AND correlation_id = c.key FOR UPDATE
) AS k ON true
ORDER BY c.i`

	// sqlAdvanceBatch is sqlAdvance for the keys $2 of a batch, each once
	// (its last message handled: key_seq $3, id $4, occurred_at $5,
	// source $9), fenced by the shard lease ($6 shard, $7 owner, $8
	// epoch): ordo_inbox_advance_keys (migration 4). It returns whether
	// the fence held, the key rows updated and, per key in order, whether
	// a stored message is left after it. A batch on the fast path has no
	// stored message at or below a key_seq it handles (the decision saw
	// none: a stored copy makes a duplicate, an earlier message a gap), so
	// unlike sqlAdvance it deletes none.
	sqlAdvanceBatch = `SELECT held, advanced, more FROM ordo_inbox_advance_keys($1, $6, $7, $8, $9, $2, $3, $4, $5)`
)
