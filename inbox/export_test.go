package inbox

import (
	"context"
	"time"
)

// SetDeadLetterURL makes c publish its dead letters to the broker at url
// (a test proxy in front of it) instead of Config.AMQPURL. Call it before
// Run.
func SetDeadLetterURL(c *Consumer, url string) { c.dead.url = url }

// LocalConfig is DefaultConfig with short timings for tests.
func LocalConfig(name string) Config {
	c := DefaultConfig(name)
	c.LeaseTTL = 2 * time.Second
	c.RetryMin = 20 * time.Millisecond
	c.RetryMax = 500 * time.Millisecond
	c.RetryPoll = 50 * time.Millisecond
	c.GapWait = 2 * time.Second
	c.Heartbeat = 2 * time.Second
	return c
}

// SQLClaimShards is the claim statement: $1 consumer, $2 instance,
// $3 TTL (seconds), $4 shards.
const SQLClaimShards = sqlClaimShards

// HandleBatch runs s's group commit (handleBatch) on ms under f: their
// outcomes and per-message errors, in order, for the prefix it handled,
// all committed together; or the batch's error, nothing committed. It
// does not follow keys whose stored messages became next.
func HandleBatch(ctx context.Context, s *Store, f Fence, ms []*Message, h Handler) ([]Outcome, []error, error) {
	items := make([]batchItem, len(ms))
	for i, m := range ms {
		items[i].m = m
	}
	res, err := s.handleBatch(ctx, f, items, h)
	if err != nil {
		return nil, nil, err
	}
	outs, errs := make([]Outcome, len(res)), make([]error, len(res))
	for i, r := range res {
		outs[i], errs[i] = r.out, r.err
	}
	return outs, errs, nil
}

// SetQueue makes s handle its fast path's messages with q, as the Store
// of a Consumer from NewQueued does (pass q.Handler() for the rest).
func SetQueue(s *Store, q QueueHandler) { s.queue = q }
