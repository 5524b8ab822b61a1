package inbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ordo-relay/ordo/internal/opaudit"
	"github.com/ordo-relay/ordo/wire"
)

// Stats are a Store's counts since it was created, plus the gauges a
// Consumer refreshes. Their metric names (docs/consumer.md) are given on
// each field.
type Stats struct {
	Handled      int64 // ordo_inbox_handled_total: handler transactions committed
	Duplicates   int64 // ordo_inbox_duplicates_total: dropped, the key was past them
	GapsStored   int64 // ordo_inbox_gaps_stored_total: stored to wait for a predecessor
	Retries      int64 // ordo_inbox_retries_total: failed or redelivered, stored for a retry
	DeadLettered int64 // ordo_inbox_dead_lettered_total
	Invalid      int64 // ordo_inbox_invalid_total: without correlation id or Ordo headers, or with data PostgreSQL cannot store, dead-lettered
	Fenced       int64 // ordo_inbox_fenced_total: writes refused because the lease moved
	Rewinds      int64 // ordo_inbox_key_seq_rewinds_total: a handled key_seq seen again under another message id (producer key_seq went back)
	StuckKeys    int   // ordo_inbox_stuck_keys: keys whose gap waited longer than GapWait (Consumer only)
	DeadKeys     int   // ordo_inbox_dead_keys: keys held behind a dead-lettered message (Consumer only)
	ShardsOwned  int   // ordo_inbox_shards_owned (Consumer only)
	LaneLimit    int   // ordo_inbox_lanes_limit: lanes of all shards allowed at work at once (Consumer with a pool only)
}

// Stats returns the Store's counters. Safe for concurrent use.
func (s *Store) Stats() Stats {
	return Stats{
		Handled:      s.stats.handled.Load(),
		Duplicates:   s.stats.duplicates.Load(),
		GapsStored:   s.stats.stored.Load(),
		Retries:      s.stats.retried.Load(),
		DeadLettered: s.stats.dead.Load(),
		Invalid:      s.stats.invalid.Load(),
		Fenced:       s.stats.fenced.Load(),
		Rewinds:      s.stats.rewinds.Load(),
	}
}

// ErrNothingToResolve is returned by Resolve, Retry and Skip when the key
// has no stuck gap, or no dead-lettered message, to act on.
var ErrNothingToResolve = errors.New("nothing to resolve for this key")

// ErrOutcomeUnknown is returned (wrapped) by Act when the connection
// failed while the action was committing: it may have taken effect, with
// its own audit row, or not. Look at the key before asking again.
var ErrOutcomeUnknown = opaudit.ErrOutcomeUnknown

// StuckKey is a key whose next stored message waits for a predecessor
// that has not arrived (keys held by a dead-lettered message are listed by
// Dead instead).
type StuckKey struct {
	Source   string    `json:"source"` // the key's source (x-ordo-source)
	Key      string    `json:"key"`
	Last     int64     `json:"last"`    // last handled key_seq
	Waiting  int64     `json:"waiting"` // key_seq of the first stored message
	Prev     int64     `json:"prev"`    // its x-ordo-prev-key-seq: Last+1..Prev are missing
	Since    time.Time `json:"since"`   // when it was stored
	Stored   int       `json:"stored"`  // stored messages of the key
	Consumer string    `json:"consumer"`
}

// DeadMessage is a dead-lettered message holding its key.
type DeadMessage struct {
	Source    string    `json:"source"` // the key's source (x-ordo-source)
	Key       string    `json:"key"`
	KeySeq    int64     `json:"keySeq"`
	MessageID string    `json:"messageId"`
	Type      string    `json:"type"`
	Attempts  int       `json:"attempts"`
	LastError string    `json:"lastError"`
	DeadAt    time.Time `json:"deadAt"`
	Waiting   int       `json:"waiting"` // stored messages of the key behind it
}

const sqlStuck = `
SELECT source, correlation_id, last_seq, key_seq, prev_seq, stored_at, stored FROM (
    SELECT DISTINCT ON (m.source, m.correlation_id) m.source, m.correlation_id, k.last_seq, m.key_seq, m.prev_seq, m.stored_at,
        (SELECT count(*) FROM ordo_inbox_messages w
         WHERE w.consumer = m.consumer AND w.source = m.source AND w.correlation_id = m.correlation_id)::int AS stored
    FROM ordo_inbox_messages m JOIN ordo_inbox_keys k USING (consumer, source, correlation_id)
    WHERE m.consumer = $1 AND m.dead_at IS NULL
      AND NOT EXISTS (SELECT 1 FROM ordo_inbox_messages d   -- held by a dead message: see Dead
                      WHERE d.consumer = m.consumer AND d.source = m.source AND d.correlation_id = m.correlation_id
                        AND d.dead_at IS NOT NULL)
    ORDER BY m.source, m.correlation_id, m.key_seq
) h
WHERE prev_seq > last_seq AND stored_at <= now() - make_interval(secs => $2)
ORDER BY stored_at`

// Stuck lists consumer's keys whose first stored message has waited
// longer than olderThan for a predecessor.
func Stuck(ctx context.Context, db DB, consumer string, olderThan time.Duration) ([]StuckKey, error) {
	rows, err := db.Query(ctx, sqlStuck, consumer, olderThan.Seconds())
	if err != nil {
		return nil, fmt.Errorf("list stuck keys: %w", err)
	}
	keys, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (StuckKey, error) {
		k := StuckKey{Consumer: consumer}
		return k, r.Scan(&k.Source, &k.Key, &k.Last, &k.Waiting, &k.Prev, &k.Since, &k.Stored)
	})
	if err != nil {
		return nil, fmt.Errorf("list stuck keys: %w", err)
	}
	return keys, nil
}

const sqlDeadList = `
SELECT m.source, m.correlation_id, m.key_seq, m.message_id, m.type, m.attempts, coalesce(m.last_error, ''), m.dead_at,
    (SELECT count(*) FROM ordo_inbox_messages w
     WHERE w.consumer = m.consumer AND w.source = m.source AND w.correlation_id = m.correlation_id
       AND w.key_seq > m.key_seq)::int
FROM ordo_inbox_messages m
WHERE m.consumer = $1 AND m.dead_at IS NOT NULL
ORDER BY m.dead_at`

// Dead lists consumer's dead-lettered messages, each holding its key.
func Dead(ctx context.Context, db DB, consumer string) ([]DeadMessage, error) {
	rows, err := db.Query(ctx, sqlDeadList, consumer)
	if err != nil {
		return nil, fmt.Errorf("list dead messages: %w", err)
	}
	ms, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (DeadMessage, error) {
		var d DeadMessage
		return d, r.Scan(&d.Source, &d.Key, &d.KeySeq, &d.MessageID, &d.Type, &d.Attempts, &d.LastError, &d.DeadAt, &d.Waiting)
	})
	if err != nil {
		return nil, fmt.Errorf("list dead messages: %w", err)
	}
	return ms, nil
}

// The operator actions' statements: $2 is the key, $3 its source.
const (
	// sqlResolve declares a stuck key's missing messages skipped: the key
	// moves to the first stored message's prev, which becomes due.
	sqlResolve = `
WITH k AS (
    SELECT last_seq FROM ordo_inbox_keys WHERE consumer = $1 AND source = $3 AND correlation_id = $2 FOR UPDATE
), h AS (
    SELECT key_seq, prev_seq FROM ordo_inbox_messages
    WHERE consumer = $1 AND source = $3 AND correlation_id = $2 AND dead_at IS NULL
      AND NOT EXISTS (SELECT 1 FROM ordo_inbox_messages
                      WHERE consumer = $1 AND source = $3 AND correlation_id = $2 AND dead_at IS NOT NULL)
    ORDER BY key_seq LIMIT 1
), adv AS (
    UPDATE ordo_inbox_keys SET last_seq = h.prev_seq, handled_at = now()
    FROM h, k WHERE consumer = $1 AND source = $3 AND correlation_id = $2 AND h.prev_seq > k.last_seq
    RETURNING h.key_seq
)
UPDATE ordo_inbox_messages m SET next_attempt_at = now()
FROM adv WHERE m.consumer = $1 AND m.source = $3 AND m.correlation_id = $2 AND m.key_seq = adv.key_seq
RETURNING m.key_seq`

	// sqlRetryDead gives a dead message MaxAttempts new attempts, now.
	sqlRetryDead = `
UPDATE ordo_inbox_messages SET dead_at = NULL, attempts = 0, next_attempt_at = now()
WHERE consumer = $1 AND source = $3 AND correlation_id = $2 AND dead_at IS NOT NULL
RETURNING key_seq`

	// sqlSkipLock locks the key's row for Skip.
	sqlSkipLock = `SELECT 1 FROM ordo_inbox_keys WHERE consumer = $1 AND source = $3 AND correlation_id = $2 FOR UPDATE`

	// sqlSkipDead drops a key's dead messages (one, or several held below
	// the low-water mark) as if handled and returns the highest key_seq
	// dropped, NULL if none.
	sqlSkipDead = `
WITH d AS (
    DELETE FROM ordo_inbox_messages
    WHERE consumer = $1 AND source = $3 AND correlation_id = $2 AND dead_at IS NOT NULL
    RETURNING key_seq
)
SELECT max(key_seq) FROM d`

	// sqlSkipAdvance moves the key past the skipped message ($4) and makes
	// the next stored message due.
	sqlSkipAdvance = `
WITH adv AS (
    UPDATE ordo_inbox_keys SET last_seq = greatest(last_seq, $4), handled_at = now()
    WHERE consumer = $1 AND source = $3 AND correlation_id = $2
)
UPDATE ordo_inbox_messages SET next_attempt_at = now()
WHERE consumer = $1 AND source = $3 AND correlation_id = $2 AND dead_at IS NULL
  AND key_seq = (SELECT min(key_seq) FROM ordo_inbox_messages
                 WHERE consumer = $1 AND source = $3 AND correlation_id = $2 AND key_seq > $4)`
)

// Resolve is the operator's answer to a stuck key: the missing messages
// (Last+1..Prev of StuckKey) are declared skipped, the key moves on to its
// first stored message, and a missing message that arrives later is a
// duplicate. The owning consumer handles the stored messages within
// RetryPoll. A key held by a dead-lettered message is not stuck: use
// Retry or Skip for it (Resolve returns ErrNothingToResolve). The key is
// source's (wire.DefaultSource for messages without x-ordo-source); an
// invalid source name returns an error wrapping wire.ErrInvalidSource.
func Resolve(ctx context.Context, db DB, consumer, source, key string) error {
	return operatorAction(ctx, db, "resolve", sqlResolve, consumer, source, key)
}

// Retry gives source's key's dead-lettered message (or messages) a new
// set of attempts.
func Retry(ctx context.Context, db DB, consumer, source, key string) error {
	return operatorAction(ctx, db, "retry", sqlRetryDead, consumer, source, key)
}

// Skip drops source's key's dead-lettered message (or messages: several
// may be held below the retention low-water mark) as if it had been
// handled; the key's later messages go on.
func Skip(ctx context.Context, db DB, consumer, source, key string) error {
	if err := wire.ValidateSource(source); err != nil {
		return fmt.Errorf("skip %s: %w", key, err)
	}
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, sqlSkipLock, consumer, key, source); err != nil {
			return fmt.Errorf("skip %s/%s: %w", source, key, err)
		}
		var seq *int64
		if err := tx.QueryRow(ctx, sqlSkipDead, consumer, key, source).Scan(&seq); err != nil {
			return fmt.Errorf("skip %s/%s: %w", source, key, err)
		}
		if seq == nil {
			return fmt.Errorf("skip %s/%s: %w", source, key, ErrNothingToResolve)
		}
		if _, err := tx.Exec(ctx, sqlSkipAdvance, consumer, key, source, seq); err != nil {
			return fmt.Errorf("skip %s/%s: %w", source, key, err)
		}
		return nil
	})
}

func operatorAction(ctx context.Context, db DB, what, sql, consumer, source, key string) error {
	if err := wire.ValidateSource(source); err != nil {
		return fmt.Errorf("%s %s: %w", what, key, err)
	}
	var seq int64
	err := db.QueryRow(ctx, sql, consumer, key, source).Scan(&seq)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("%s %s/%s: %w", what, source, key, ErrNothingToResolve)
	}
	if err != nil {
		return fmt.Errorf("%s %s/%s: %w", what, source, key, err)
	}
	return nil
}
