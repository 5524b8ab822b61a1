package inbox

import (
	"context"
	"fmt"
	"time"

	"github.com/ordo-relay/ordo/internal/outage"
)

// retentionChunk bounds the keys one retention statement deletes.
const retentionChunk = 1000

// sqlRetain deletes up to $3 keys idle for longer than $2 seconds that hold
// no stored message and whose last message had a timestamp, and raises the
// low-water mark past the newest timestamp deleted: an unknown key's
// message older than the mark is a redelivery of a deleted key. The mark
// is one second above that timestamp because AMQP timestamps have whole
// seconds.
const sqlRetain = `
WITH victims AS (
    SELECT source, correlation_id FROM ordo_inbox_keys k
    WHERE consumer = $1 AND handled_at < now() - make_interval(secs => $2)
      AND last_occurred_at IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM ordo_inbox_messages m
                      WHERE m.consumer = k.consumer AND m.source = k.source AND m.correlation_id = k.correlation_id)
    ORDER BY handled_at
    LIMIT $3
    FOR UPDATE SKIP LOCKED
), del AS (
    DELETE FROM ordo_inbox_keys k USING victims v
    WHERE k.consumer = $1 AND k.source = v.source AND k.correlation_id = v.correlation_id
    RETURNING k.last_occurred_at
), mark AS (
    INSERT INTO ordo_inbox_retention AS r (consumer, low_water, deleted)
    SELECT $1, max(last_occurred_at) + interval '1 second', count(*) FROM del HAVING count(*) > 0
    ON CONFLICT (consumer) DO UPDATE
    SET low_water = greatest(r.low_water, excluded.low_water), deleted = r.deleted + excluded.deleted, updated_at = now()
)
SELECT count(*) FROM del`

// Retain deletes consumer's keys idle for longer than age (the redelivery
// bound: no message is redelivered, or first delivered, later than age
// after a later message of its key was handled), keeping a low-water mark
// so that a redelivery of a deleted key's message is dropped, not handled
// as a new key's first message. Keys with stored messages are kept. It
// returns how many keys it deleted. Safe to run from several instances.
func Retain(ctx context.Context, db DB, consumer string, age time.Duration) (int, error) {
	total := 0
	for {
		var n int
		if err := db.QueryRow(ctx, sqlRetain, consumer, age.Seconds(), retentionChunk).Scan(&n); err != nil {
			return total, fmt.Errorf("retention: %w", err)
		}
		total += n
		if n < retentionChunk {
			return total, nil
		}
	}
}

func (c *Consumer) retain(ctx context.Context) {
	down := outage.New(c.cfg.Logger, "inbox retention database")
	t := time.NewTicker(c.cfg.RetentionInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n, err := Retain(ctx, c.db, c.cfg.Name, c.cfg.RetentionAge)
		if err != nil {
			if ctx.Err() == nil {
				down.Fail(err)
			}
			continue
		}
		down.OK()
		if n > 0 {
			c.cfg.Logger.Info("inbox: retention deleted idle keys", "keys", n)
		}
	}
}
