package inbox

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/trace"

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
			case <-time.After(c.timing.TTL):
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
// a manual ack of each delivery (never multiple) after the commit of its
// transaction. Its deliveries are handled in up to Lanes lanes (see
// lanes): keys at once, each key serial and in delivery order, a lane's
// queued deliveries in one transaction (deliverBatch). It returns when
// ctx is cancelled or with the error that ended it, in both cases only
// after every lane has finished the batch in hand; closing the channel
// then requeues the deliveries not acknowledged.
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
	// Every lane has stopped and been waited for before this returns, so
	// before the channel closes and before the worker counts as stopped
	// (its lease is released only after that).
	ls := newLanes(c.cfg.Lanes, c.gate, c.cfg.BatchSize, func(ds []*amqp.Delivery) error { return c.deliverBatch(ctx, fence, ds) })
	poll := time.NewTicker(c.cfg.RetryPoll)
	defer poll.Stop()
	for {
		select {
		case <-ctx.Done():
			_ = ls.stop()
			return nil
		case <-ls.failed():
			return ls.stop()
		case d, ok := <-deliveries:
			if !ok {
				if err := ls.stop(); err != nil {
					return err
				}
				return errors.New("channel closed by the broker")
			}
			ls.add(deliveryLaneKey(&d), &d)
		case <-poll.C:
			if !c.leaseValid(l.Shard, l.Epoch) {
				_ = ls.stop()
				return errLeaseExpired
			}
			c.queueRetries(ctx, fence, ls)
		}
	}
}

// queueRetries adds a retry job to the lane of each key with a stored
// message due, so that it runs serially with the key's deliveries. A
// database error keeps the session (and the deliveries in hand): the next
// poll tries again. A fenced write ends the session (its lane's error).
func (c *Consumer) queueRetries(ctx context.Context, f Fence, ls *lanes) {
	hctx, cancel := c.handleContext(ctx)
	due, err := c.store.due(hctx, f.Shard, dueBatch)
	cancel()
	if err != nil {
		c.dbDown.Fail(err)
		return
	}
	for _, m := range due {
		ls.addRetry(laneKey(m.Source, m.CorrelationID), func() error {
			hctx, cancel := c.handleContext(ctx)
			defer cancel()
			err := c.store.retryKey(hctx, f, m, c.h)
			if err != nil && !errors.Is(err, ErrFenced) {
				c.dbDown.Fail(err)
				return nil
			}
			return err
		})
	}
}

// deliver handles one delivery and acknowledges it once its outcome is
// committed. An error leaves it unacknowledged: the channel is closed and
// the broker redelivers it.
func (c *Consumer) deliver(ctx context.Context, f Fence, d *amqp.Delivery) error {
	if !c.leaseValid(f.Shard, f.Epoch) {
		return errLeaseExpired
	}
	m, err := FromDelivery(d)
	sctx, span := c.startDelivery(ctx, f, d, m)
	if err != nil {
		endDelivery(span, 0, err)
		return c.invalidDelivery(ctx, f, d, err)
	}
	return c.deliverInPlace(sctx, f, d, m, span)
}

// deliverInPlace is deliver after d was parsed into m (and its span
// started): one transaction for m alone.
func (c *Consumer) deliverInPlace(ctx context.Context, f Fence, d *amqp.Delivery, m *Message, span trace.Span) error {
	out, err := c.handleInPlace(ctx, f, m)
	endDelivery(span, out, err)
	if errors.Is(err, ErrInvalidMessage) {
		return c.invalidDelivery(ctx, f, d, err)
	}
	if err != nil {
		return err
	}
	return ack(d)
}

// deliverBatch handles a lane's batch of deliveries: keys of the shard,
// each key's in delivery order. One delivery is handled as deliver does.
// More are handled with group commit (Store.handleBatch): a transaction
// for as many as BatchTime allows, then another for the rest; each
// transaction's deliveries are acknowledged after its commit, one by one
// (a multiple ack would also acknowledge the other lanes' deliveries in
// between, committed or not), and then the keys whose stored messages
// became next are followed. An invalid delivery is dead-lettered and
// acknowledged at once. When a batch fails for another reason than a
// moved lease (the database, a deadlock between handlers' locks), its
// deliveries are handled again one transaction each, retried in place:
// one delivery's trouble is then its own.
func (c *Consumer) deliverBatch(ctx context.Context, f Fence, ds []*amqp.Delivery) error {
	if len(ds) == 1 {
		return c.deliver(ctx, f, ds[0])
	}
	if !c.leaseValid(f.Shard, f.Epoch) {
		return errLeaseExpired
	}
	type pending struct {
		d    *amqp.Delivery
		span trace.Span
		ctx  context.Context // its span's
	}
	var ps []pending
	var items []batchItem
	for _, d := range ds {
		m, err := FromDelivery(d)
		sctx, span := c.startDelivery(ctx, f, d, m)
		if err != nil {
			endDelivery(span, 0, err)
			if err := c.invalidDelivery(ctx, f, d, err); err != nil {
				return err
			}
			continue
		}
		ps = append(ps, pending{d: d, span: span, ctx: sctx})
		items = append(items, batchItem{m: m})
	}
	for len(items) > 0 {
		if err := c.stopping(ctx, f); err != nil {
			// The rest stay unacknowledged: the broker redelivers them,
			// in order, to the shard's next owner.
			for _, p := range ps {
				endDelivery(p.span, 0, err)
			}
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		hctx, cancel := c.handleContext(ctx)
		for i := range items {
			items[i].ctx = nil
			if ps[i].span != nil {
				items[i].ctx = trace.ContextWithSpan(hctx, ps[i].span)
			}
		}
		res, err := c.store.handleBatch(hctx, f, items, c.h)
		cancel()
		if errors.Is(err, ErrFenced) {
			for _, p := range ps {
				endDelivery(p.span, 0, err)
			}
			return err
		}
		if err != nil {
			c.cfg.Logger.Debug("inbox: batch failed; its messages are handled one at a time", "shard", f.Shard, "messages", len(items), "err", err)
			for i, p := range ps {
				err := c.stopping(ctx, f)
				if err == nil {
					err = c.deliverInPlace(p.ctx, f, p.d, items[i].m, p.span)
				} else {
					endDelivery(p.span, 0, err)
				}
				if err != nil {
					for _, q := range ps[i+1:] {
						endDelivery(q.span, 0, err)
					}
					if ctx.Err() != nil {
						return nil
					}
					return err
				}
			}
			return nil
		}
		c.dbDown.OK()
		for i, r := range res {
			endDelivery(ps[i].span, r.out, r.err)
			if r.err != nil {
				if err := c.invalidDelivery(ctx, f, ps[i].d, r.err); err != nil {
					return err
				}
				continue
			}
			if err := ack(ps[i].d); err != nil {
				return err
			}
		}
		if err := c.follow(ctx, f, items[:len(res)], res); err != nil {
			return err
		}
		ps, items = ps[len(res):], items[len(res):]
	}
	return nil
}

// stopping returns ctx's error when the worker is told to stop, or
// errLeaseExpired when the lease's local deadline passed: checked
// between a batch's transactions, so that a stopping worker finishes the
// transaction in hand, not the whole batch (slow handlers give a
// transaction each, and a handoff waits for the worker).
func (c *Consumer) stopping(ctx context.Context, f Fence) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if !c.leaseValid(f.Shard, f.Epoch) {
		return errLeaseExpired
	}
	return nil
}

// follow handles, after a batch committed, the stored messages that
// became next in the keys of its messages with more set, each key once.
// A database error is logged: the messages stay stored and the retry
// poll takes them. A moved lease ends the session.
func (c *Consumer) follow(ctx context.Context, f Fence, items []batchItem, res []batchResult) error {
	var done map[string]bool
	for i, r := range res {
		if !r.more || r.err != nil {
			continue
		}
		m := items[i].m
		k := laneKey(m.Source, m.CorrelationID)
		if done[k] {
			continue
		}
		if done == nil {
			done = map[string]bool{}
		}
		done[k] = true
		hctx, cancel := c.handleContext(ctx)
		err := c.store.follow(hctx, f, m.Source, m.CorrelationID, c.h)
		cancel()
		if errors.Is(err, ErrFenced) {
			return err
		}
		if err != nil {
			c.cfg.Logger.Warn("inbox: handle stored messages", "source", m.Source, "key", m.CorrelationID, "err", err)
		}
	}
	return nil
}

// invalidDelivery dead-letters d as it came, counts it and acknowledges
// it: the inbox cannot store it (why), so retrying cannot help.
func (c *Consumer) invalidDelivery(ctx context.Context, f Fence, d *amqp.Delivery, why error) error {
	hctx, cancel := c.handleContext(ctx)
	defer cancel()
	if err := c.dead.raw(hctx, d, why.Error()); err != nil {
		return err
	}
	c.invalid.Add(1)
	c.cfg.Logger.Warn("inbox: invalid message dead-lettered", "shard", f.Shard, "err", why)
	return ack(d)
}

// handleInPlace hands m to the Store, retrying with backoff while the
// database fails and the lease holds: the delivery stays in hand, so a
// database outage does not make the broker redeliver it (a redelivery
// counts as an attempt). A message PostgreSQL refuses (ErrInvalidMessage)
// is not retried: it is its own fault, not the database's.
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
		if errors.Is(err, ErrFenced) || errors.Is(err, ErrInvalidMessage) || ctx.Err() != nil {
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
	return context.WithTimeout(context.WithoutCancel(ctx), c.timing.TTL)
}

func ack(d *amqp.Delivery) error {
	if err := d.Ack(false); err != nil {
		return fmt.Errorf("ack: %w", err)
	}
	return nil
}
