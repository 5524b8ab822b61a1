package inbox

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ordo-relay/ordo/internal/outage"
)

// dueBatch bounds the stored messages one retry poll attempts.
const dueBatch = 64

// runShard consumes shard l.Shard until ctx is cancelled (the lease was
// lost or handed off, or the consumer stops), reconnecting with capped
// backoff after broker or database errors.
func (c *Consumer) runShard(ctx context.Context, l shardLease) {
	down := outage.New(c.cfg.Logger.With("shard", l.Shard), "inbox shard "+strconv.Itoa(l.Shard))
	backoff := c.cfg.RetryMin
	for {
		start := time.Now()
		err := c.consumeShard(ctx, l)
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, ErrFenced) {
			// The lease is gone: the supervisor cancels this worker at its
			// next renewal. Write nothing under it meanwhile.
			c.cfg.Logger.Warn("inbox: worker paused: lease moved", "shard", l.Shard, "err", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(c.cfg.LeaseTTL):
			}
			continue
		}
		down.Fail(err)
		if time.Since(start) > 10*time.Second {
			backoff = c.cfg.RetryMin
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 5*time.Second)
	}
}

// consumeShard runs one consumer session on shard's queue: exclusive, so
// the broker refuses a second instance while this one is attached, with
// manual acks after each commit. It returns when ctx is cancelled (closing
// the channel, which requeues the prefetched deliveries), or with the
// error that ended it.
func (c *Consumer) consumeShard(ctx context.Context, l shardLease) error {
	conn, err := c.amqp.connection()
	if err != nil {
		return err
	}
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	defer func() { _ = ch.Close() }()
	if err := ch.Qos(c.cfg.Prefetch, 0, false); err != nil {
		return fmt.Errorf("set prefetch: %w", err)
	}
	tag := c.cfg.Instance + "/" + strconv.Itoa(l.Shard)
	deliveries, err := ch.Consume(c.topo.ShardQueue(l.Shard), tag, false, true, false, false, nil)
	if err != nil {
		return fmt.Errorf("consume %s: %w", c.topo.ShardQueue(l.Shard), err)
	}
	fence := l.fence(c.cfg.Instance)
	poll := time.NewTicker(c.cfg.RetryPoll)
	defer poll.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case d, ok := <-deliveries:
			if !ok {
				return errors.New("channel closed by the broker")
			}
			if err := c.deliver(ctx, fence, &d); err != nil {
				return err
			}
		case <-poll.C:
			if !c.leaseValid(l.Shard, l.Epoch) {
				return errLeaseExpired
			}
			hctx, cancel := c.handleContext(ctx)
			_, err := c.store.RetryDue(hctx, fence, l.Shard, dueBatch, c.h)
			cancel()
			if errors.Is(err, ErrFenced) {
				return err
			}
			if err != nil {
				// Keep the session (and the deliveries in hand): the next
				// poll tries again.
				c.dbDown.Fail(err)
			}
		}
	}
}

// deliver handles one delivery and acknowledges it once its outcome is
// committed. An error leaves it unacknowledged: the channel is closed and
// the broker redelivers it.
func (c *Consumer) deliver(ctx context.Context, f Fence, d *amqp.Delivery) error {
	if !c.leaseValid(f.Shard, f.Epoch) {
		return errLeaseExpired
	}
	hctx, cancel := c.handleContext(ctx)
	defer cancel()
	m, err := FromDelivery(d)
	ctx, span := c.startDelivery(ctx, f, d, m)
	if err != nil {
		endDelivery(span, 0, err)
		if err := c.dead.raw(hctx, d, err.Error()); err != nil {
			return err
		}
		c.invalid.Add(1)
		c.cfg.Logger.Warn("inbox: invalid message dead-lettered", "shard", f.Shard, "err", err)
		return ack(d)
	}
	out, err := c.handleInPlace(ctx, f, m)
	endDelivery(span, out, err)
	if err != nil {
		return err
	}
	return ack(d)
}

// handleInPlace hands m to the Store, retrying with backoff while the
// database fails and the lease holds: the delivery stays in hand, so a
// database outage does not make the broker redeliver it (a redelivery
// counts as an attempt).
func (c *Consumer) handleInPlace(ctx context.Context, f Fence, m *Message) (Outcome, error) {
	backoff := c.cfg.RetryMin
	for {
		hctx, cancel := c.handleContext(ctx)
		out, err := c.store.Handle(hctx, f, m, c.h)
		cancel()
		if err == nil {
			c.dbDown.OK()
			return out, nil
		}
		if errors.Is(err, ErrFenced) || ctx.Err() != nil {
			return 0, err
		}
		c.dbDown.Fail(err)
		select {
		case <-ctx.Done():
			return 0, err
		case <-time.After(backoff):
		}
		if !c.leaseValid(f.Shard, f.Epoch) {
			return 0, errLeaseExpired
		}
		backoff = min(backoff*2, 2*time.Second)
	}
}

// handleContext bounds one message's handling by the lease TTL. It is not
// cancelled with ctx: a stopping worker finishes the message in hand.
func (c *Consumer) handleContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), c.cfg.LeaseTTL)
}

func ack(d *amqp.Delivery) error {
	if err := d.Ack(false); err != nil {
		return fmt.Errorf("ack: %w", err)
	}
	return nil
}
