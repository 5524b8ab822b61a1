package admin

import "github.com/ordo-relay/ordo/outbox"

// statements are the SQL a Store runs: the outbox's (outboxStatements) or
// an adopted table's (tableStatements).
type statements struct {
	listParked    string // $1 limit
	retry, skip   string // $1 id; RETURNING partition
	retryKey      string // $1 key; RETURNING partition
	retryMatching string // sqlRetryMatching's parameters
	exists        string // $1 id: whether the row exists at all
	// exchange is what the rows are published to when they do not say
	// (an adopted table's rows go to the node's -table-exchange).
	exchange string
	// table: the rows are an adopted table's. Purge and the gap actions
	// are the outbox's alone.
	table bool
	// channel is where a retry wakes the relays of the rows' partitions.
	channel string
}

var outboxStatements = statements{
	listParked: sqlListParked, retry: sqlRetry, retryKey: sqlRetryKey, skip: sqlSkip,
	retryMatching: sqlRetryMatching, exists: `SELECT EXISTS (SELECT 1 FROM outbox WHERE id = $1)`,
	channel: outbox.NotifyChannel,
}

const (
	sqlListParked = `
SELECT o.id, o.partition, o.correlation_id, coalesce(o.key_seq, 0), o.exchange, o.routing_key, o.type,
       o.attempts, o.last_error, o.parked_at,
       (SELECT count(*) FROM outbox AS w
        WHERE w.correlation_id = o.correlation_id AND w.key_seq > o.key_seq AND w.processed_at IS NULL)
       + (SELECT count(*) FROM outbox_numbers AS j JOIN outbox AS w ON w.id = j.id
          WHERE j.correlation_id = o.correlation_id AND j.key_seq > o.key_seq
            AND w.key_seq IS NULL AND w.processed_at IS NULL)
FROM outbox AS o
WHERE o.parked_at IS NOT NULL AND o.processed_at IS NULL
ORDER BY o.parked_at
LIMIT $1`

	sqlRetry = `
UPDATE outbox SET parked_at = NULL, next_attempt_at = NULL, attempts = 0
WHERE id = $1 AND parked_at IS NOT NULL AND processed_at IS NULL
RETURNING partition`

	sqlRetryKey = `
UPDATE outbox SET parked_at = NULL, next_attempt_at = NULL, attempts = 0
WHERE correlation_id = $1 AND parked_at IS NOT NULL AND processed_at IS NULL
RETURNING partition`

	sqlSkip = `
UPDATE outbox SET dead_at = clock_timestamp(), processed_at = clock_timestamp(), parked_at = NULL, next_attempt_at = NULL
WHERE id = $1 AND parked_at IS NOT NULL AND processed_at IS NULL
RETURNING partition`

	// sqlPurge: a dead row (skipped: processed, with dead_at; a pending
	// row's dead_at is a producer's, never a reason to delete) may go
	// once no later row of its key is pending and a later row was
	// published (present and not dead, or already deleted): a future
	// message's x-ordo-prev-key-seq then never needs to step over it.
	// A later row's key_seq may be in the owner's journal (outbox_numbers)
	// rather than in the row, pending or published: both count.
	sqlPurge = `
DELETE FROM outbox AS d
WHERE d.dead_at IS NOT NULL AND d.processed_at IS NOT NULL
  AND NOT EXISTS (SELECT 1 FROM outbox AS p
                  WHERE p.correlation_id = d.correlation_id AND p.key_seq > d.key_seq AND p.processed_at IS NULL)
  AND NOT EXISTS (SELECT 1 FROM outbox_numbers AS j JOIN outbox AS p ON p.id = j.id
                  WHERE j.correlation_id = d.correlation_id AND j.key_seq > d.key_seq AND p.processed_at IS NULL)
  AND (EXISTS (SELECT 1 FROM outbox AS n
               WHERE n.correlation_id = d.correlation_id AND n.key_seq > d.key_seq
                 AND n.processed_at IS NOT NULL AND n.dead_at IS NULL)
       OR EXISTS (SELECT 1 FROM outbox_numbers AS j JOIN outbox AS n ON n.id = j.id
                  WHERE j.correlation_id = d.correlation_id AND j.key_seq > d.key_seq
                    AND n.processed_at IS NOT NULL AND n.dead_at IS NULL)
       -- or a later row is gone: retention deleted it (it was published), or
       -- purge did (it was dead with a published row after it)
       OR (SELECT count(*) FROM outbox AS x
           WHERE x.correlation_id = d.correlation_id AND x.key_seq > d.key_seq)
          < (SELECT k.last_key_seq FROM outbox_keys AS k WHERE k.correlation_id = d.correlation_id) - d.key_seq)`

	// sqlGapBounds gives, for the keys worth checking, the range (lo, last]
	// in which a key_seq without a row is a gap: nothing the relay,
	// retention or purge does can have removed it. lo is the key's highest
	// published row still present (retention deletes a key's published
	// rows oldest first, and purge a dead row only below a published one,
	// so nothing above it was deleted by them); else, with pending rows,
	// the one below its lowest pending row (rows above a pending one are
	// never processed, so never deleted); else last (nothing can be told).
	// A row's key_seq may be in the owner's journal (outbox_numbers)
	// rather than in the row, pending or published (the mark leaves a
	// published row's number there): both count. An entry
	// counts only while its row is there: one whose row was deleted by
	// hand (or by an earlier release's retention) names a number no row
	// holds, a gap like any row deleted by hand. Each journal bound is
	// the first entry in key order whose row is there: an index probe
	// and a primary-key lookup or a few, not an aggregate over the key's
	// entries (the journal keeps a number for every retained row).
	// The keys worth checking: those with pending rows (keys $1 if not
	// null), and those whose counter is ahead of their highest row (the
	// next row would step over the missing ones).
	sqlGapBounds = `
WITH candidates AS (
    SELECT DISTINCT o.correlation_id FROM outbox AS o
    WHERE o.processed_at IS NULL AND ($1::text IS NULL OR o.correlation_id = $1)
    UNION
    SELECT k.correlation_id FROM outbox_keys AS k
    WHERE ($1::text IS NULL OR k.correlation_id = $1)
      AND k.last_key_seq > coalesce(greatest(
              (SELECT max(o.key_seq) FROM outbox AS o WHERE o.correlation_id = k.correlation_id),
              (SELECT n.key_seq FROM outbox_numbers AS n
               WHERE n.correlation_id = k.correlation_id AND EXISTS (SELECT 1 FROM outbox AS o WHERE o.id = n.id)
               ORDER BY n.key_seq DESC LIMIT 1)), k.last_key_seq)
)
SELECT k.correlation_id, k.last_key_seq,
       coalesce(greatest((SELECT max(o.key_seq) FROM outbox AS o
                          WHERE o.correlation_id = k.correlation_id AND o.processed_at IS NOT NULL AND o.dead_at IS NULL),
                         (SELECT n.key_seq FROM outbox_numbers AS n
                          WHERE n.correlation_id = k.correlation_id
                            AND EXISTS (SELECT 1 FROM outbox AS o WHERE o.id = n.id AND o.processed_at IS NOT NULL AND o.dead_at IS NULL)
                          ORDER BY n.key_seq DESC LIMIT 1)),
                least((SELECT min(o.key_seq) FROM outbox AS o
                       WHERE o.correlation_id = k.correlation_id AND o.key_seq IS NOT NULL AND o.processed_at IS NULL),
                      (SELECT n.key_seq FROM outbox_numbers AS n
                       WHERE n.correlation_id = k.correlation_id AND EXISTS (SELECT 1 FROM outbox AS o WHERE o.id = n.id)
                       ORDER BY n.key_seq LIMIT 1)) - 1,
                k.last_key_seq) AS lo
FROM outbox_keys AS k JOIN candidates USING (correlation_id)`

	// sqlListGaps lists up to $2 key_seqs without a row inside the bounds
	// of sqlGapBounds (keys $1 if not null), with the partition of the key
	// and the first row after each gap, which will name it as its
	// x-ordo-prev-key-seq.
	sqlListGaps = `
WITH bounds AS (` + sqlGapBounds + `)
SELECT b.correlation_id, s.key_seq,
       coalesce(k.partition, (SELECT o.partition FROM outbox AS o WHERE o.correlation_id = b.correlation_id LIMIT 1)),
       least((SELECT min(o.key_seq) FROM outbox AS o WHERE o.correlation_id = b.correlation_id AND o.key_seq > s.key_seq),
             (SELECT n.key_seq FROM outbox_numbers AS n
              WHERE n.correlation_id = b.correlation_id AND n.key_seq > s.key_seq AND EXISTS (SELECT 1 FROM outbox AS o WHERE o.id = n.id)
              ORDER BY n.key_seq LIMIT 1))
FROM bounds AS b
JOIN outbox_keys AS k USING (correlation_id)
CROSS JOIN LATERAL generate_series(b.lo + 1, b.last_key_seq) AS s(key_seq)
WHERE NOT EXISTS (SELECT 1 FROM outbox AS o WHERE o.correlation_id = b.correlation_id AND o.key_seq = s.key_seq)
  AND NOT EXISTS (SELECT 1 FROM outbox_numbers AS n JOIN outbox AS o ON o.id = n.id
                  WHERE n.correlation_id = b.correlation_id AND n.key_seq = s.key_seq)
ORDER BY b.correlation_id, s.key_seq
LIMIT $2`

	// sqlLockKey locks key $1's counter row: no producer of the key can
	// insert until the transaction ends.
	sqlLockKey = `SELECT last_key_seq FROM outbox_keys WHERE correlation_id = $1 FOR UPDATE`

	// sqlInsertPlaceholder inserts a dead row for key $2 in partition $3.
	// The key_seq trigger, where installed, gives it the key's next
	// key_seq; sqlPlaceKeySeq moves it into the gap.
	sqlInsertPlaceholder = `
INSERT INTO outbox (id, partition, correlation_id, exchange, routing_key, type, payload,
                    processed_at, dead_at, last_error)
VALUES ($1, $3, $2, '', '', $5, '{}', clock_timestamp(), clock_timestamp(), $4)`

	// sqlPlaceKeySeq moves placeholder $1 to key_seq $3, deletes a journal
	// entry of that number whose row is gone, and gives key $2's
	// counter back the step the insert took, if it took one: without the
	// key_seq trigger (the partition owner numbers rows) the placeholder
	// arrives unnumbered, and a step given back would hand a number a row
	// already holds to the key's next row. The statement's snapshot shows
	// the placeholder as inserted.
	sqlPlaceKeySeq = `
WITH inserted AS (
    SELECT key_seq IS NOT NULL AS numbered FROM outbox WHERE id = $1
), moved AS (
    UPDATE outbox SET key_seq = $3 WHERE id = $1 RETURNING 1
), orphaned AS (
    DELETE FROM outbox_numbers AS n
    WHERE n.correlation_id = $2 AND n.key_seq = $3 AND NOT EXISTS (SELECT 1 FROM outbox AS o WHERE o.id = n.id)
)
UPDATE outbox_keys SET last_key_seq = last_key_seq - 1
WHERE correlation_id = $2 AND EXISTS (SELECT 1 FROM moved) AND (SELECT numbered FROM inserted)`

	sqlAudit = `
INSERT INTO ordo_operator_audit (operator, remote_addr, action, target, result)
VALUES ($1, $2, $3, $4, $5)`
)
