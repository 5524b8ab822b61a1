package admin

const (
	sqlListParked = `
SELECT o.id, o.partition, o.correlation_id, o.key_seq, o.exchange, o.routing_key, o.type,
       o.attempts, o.last_error, o.parked_at,
       (SELECT count(*) FROM outbox AS w
        WHERE w.correlation_id = o.correlation_id AND w.key_seq > o.key_seq AND w.processed_at IS NULL)
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

	// sqlPurge: a dead row may go once no later row of its key is pending
	// and a later row was published (present and not dead, or already
	// deleted): a future message's x-ordo-prev-key-seq then never needs to
	// step over it.
	sqlPurge = `
DELETE FROM outbox AS d
WHERE d.dead_at IS NOT NULL
  AND NOT EXISTS (SELECT 1 FROM outbox AS p
                  WHERE p.correlation_id = d.correlation_id AND p.key_seq > d.key_seq AND p.processed_at IS NULL)
  AND (EXISTS (SELECT 1 FROM outbox AS n
               WHERE n.correlation_id = d.correlation_id AND n.key_seq > d.key_seq
                 AND n.processed_at IS NOT NULL AND n.dead_at IS NULL)
       -- or a later row is gone: retention deleted it (it was published), or
       -- purge did (it was dead with a published row after it)
       OR (SELECT count(*) FROM outbox AS x
           WHERE x.correlation_id = d.correlation_id AND x.key_seq > d.key_seq)
          < (SELECT k.last_key_seq FROM outbox_keys AS k WHERE k.correlation_id = d.correlation_id) - d.key_seq)`

	sqlAudit = `
INSERT INTO ordo_operator_audit (operator, remote_addr, action, target, result)
VALUES ($1, $2, $3, $4, $5)`
)
