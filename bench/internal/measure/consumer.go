package measure

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ordo-relay/ordo/bench/internal/harness"
	"github.com/ordo-relay/ordo/bench/internal/result"
	"github.com/ordo-relay/ordo/internal/ordercheck"
	"github.com/ordo-relay/ordo/internal/testkit"
)

const (
	// consumerPrefetch bounds the unacknowledged deliveries the broker
	// sends the consumer.
	consumerPrefetch = 1000
	// ackEvery acknowledges (multiple) after this many deliveries...
	ackEvery = consumerPrefetch / 4
	// ackIdle ...or after this long without a delivery.
	ackIdle = 20 * time.Millisecond
)

// Consumer reads the rig's queue (bound to the exchange with "#", connected
// straight to the broker), feeds every delivery to a testkit recorder for
// the loss and order check, and keeps each message's first receive time.
// It acknowledges in batches with multiple=true. Its methods are safe for
// concurrent use; close stops it and waits for its goroutine.
type Consumer struct {
	Rec    *testkit.Checker
	conn   *amqp.Connection
	queue  string
	done   chan struct{} // closed when the delivery loop has returned
	closed chan *amqp.Error

	mu       sync.Mutex
	Recv     map[string]time.Time         // message id -> first receive time
	Epochs   map[int]map[int64]EpochFirst // partition -> x-ordo-epoch -> its first delivery
	first    time.Time                    // first delivery
	last     time.Time                    // last delivery of a new message id
	ackErr   error
	stopped  bool        // the delivery loop has returned
	closeErr *amqp.Error // why the connection closed, once known
}

// startConsumer connects and consumes from queue, bound to exchange. A
// durable queue is not exclusive (RabbitMQ then persists persistent
// messages before it confirms them); close deletes it either way.
func startConsumer(ctx context.Context, amqpURL, exchange, queue string, durable bool) (*Consumer, error) {
	d := 10 * time.Second
	if dl, ok := ctx.Deadline(); ok {
		d = min(d, time.Until(dl))
	}
	conn, err := amqp.DialConfig(amqpURL, amqp.Config{
		Heartbeat:  10 * time.Second,
		Dial:       amqp.DefaultDial(d),
		Properties: amqp.Table{"connection_name": "ordo bench consumer " + queue},
	})
	if err != nil {
		return nil, fmt.Errorf("consumer: connect to RabbitMQ: %w", err)
	}
	c := &Consumer{
		Rec:    testkit.NewRecorder(),
		conn:   conn,
		queue:  queue,
		done:   make(chan struct{}),
		closed: conn.NotifyClose(make(chan *amqp.Error, 1)),
		Recv:   map[string]time.Time{},
		Epochs: map[int]map[int64]EpochFirst{},
	}
	msgs, ch, err := c.subscribe(exchange, durable)
	if err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("consumer: %w", err)
	}
	go c.loop(ch, msgs)
	return c, nil
}

// subscribe declares the queue (exclusive: it goes with the connection),
// binds it and starts consuming.
func (c *Consumer) subscribe(exchange string, durable bool) (<-chan amqp.Delivery, *amqp.Channel, error) {
	ch, err := c.conn.Channel()
	if err != nil {
		return nil, nil, fmt.Errorf("open channel: %w", err)
	}
	if err := ch.Qos(consumerPrefetch, 0, false); err != nil {
		return nil, nil, fmt.Errorf("set prefetch: %w", err)
	}
	if _, err := ch.QueueDeclare(c.queue, durable, false, !durable, false, nil); err != nil {
		return nil, nil, fmt.Errorf("declare queue %s: %w", c.queue, err)
	}
	if err := ch.QueueBind(c.queue, "#", exchange, false, nil); err != nil {
		return nil, nil, fmt.Errorf("bind queue %s to %s: %w", c.queue, exchange, err)
	}
	msgs, err := ch.Consume(c.queue, c.queue, false, true, false, false, nil)
	if err != nil {
		return nil, nil, fmt.Errorf("consume from %s: %w", c.queue, err)
	}
	return msgs, ch, nil
}

// loop records deliveries until the channel closes.
func (c *Consumer) loop(ch *amqp.Channel, msgs <-chan amqp.Delivery) {
	defer close(c.done)
	idle := time.NewTimer(ackIdle)
	defer idle.Stop()
	var unacked int
	var lastTag uint64
	ack := func() {
		if unacked == 0 {
			return
		}
		if err := ch.Ack(lastTag, true); err != nil {
			c.mu.Lock()
			c.ackErr = err
			c.mu.Unlock()
		}
		unacked = 0
	}
	for {
		select {
		case m, ok := <-msgs:
			if !ok {
				c.mu.Lock()
				c.stopped = true
				c.mu.Unlock()
				return
			}
			c.Record(ordercheck.DeliveryFromAMQP(m))
			unacked++
			lastTag = m.DeliveryTag
			if unacked >= ackEvery {
				ack()
			}
			idle.Reset(ackIdle)
		case <-idle.C:
			ack()
			idle.Reset(ackIdle)
		}
	}
}

func (c *Consumer) Record(d testkit.Delivery) {
	c.Rec.Record(d)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.first.IsZero() {
		c.first = d.Received
	}
	pe := c.Epochs[d.Partition]
	if pe == nil {
		pe = map[int64]EpochFirst{}
		c.Epochs[d.Partition] = pe
	}
	if _, seen := pe[d.Epoch]; !seen {
		pe[d.Epoch] = EpochFirst{At: d.Received, ID: d.MessageID}
	}
	if _, seen := c.Recv[d.MessageID]; !seen {
		c.Recv[d.MessageID] = d.Received
		c.last = d.Received
	}
}

// Distinct returns how many distinct message ids have arrived, and the
// receive times of the first delivery and of the last new id.
func (c *Consumer) Distinct() (n int, first, last time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.Recv), c.first, c.last
}

// EpochFirst is the first delivery of one partition at one epoch.
type EpochFirst struct {
	At time.Time
	ID string // its message id
}

// FirstAbove returns the first delivery from partition p with an
// x-ordo-epoch above epoch, and false when none has arrived yet.
func (c *Consumer) FirstAbove(p int, epoch int64) (EpochFirst, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var first EpochFirst
	for e, f := range c.Epochs[p] {
		if e > epoch && (first.At.IsZero() || f.At.Before(first.At)) {
			first = f
		}
	}
	return first, !first.At.IsZero()
}

// ReceiveTimes returns a copy of every message's first receive time.
func (c *Consumer) ReceiveTimes() map[string]time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := make(map[string]time.Time, len(c.Recv))
	for k, v := range c.Recv {
		m[k] = v
	}
	return m
}

// Failed returns an error once the consumer has stopped receiving (its
// connection or channel closed) or an acknowledgement failed; nil while it
// is healthy.
func (c *Consumer) Failed() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		select {
		case err := <-c.closed:
			c.closeErr = err
		default:
		}
		return fmt.Errorf("consumer stopped receiving (connection: %v)", c.closeErr)
	}
	if c.ackErr != nil {
		return fmt.Errorf("consumer ack: %w", c.ackErr)
	}
	return nil
}

// WaitDistinct waits until at least n distinct messages have arrived.
// abort is checked on every poll (a node that died, say).
func (c *Consumer) WaitDistinct(ctx context.Context, n int, timeout time.Duration, abort func() error) error {
	return harness.WaitUntil(ctx, timeout, 10*time.Millisecond, fmt.Sprintf("%d distinct deliveries", n), func() (bool, error) {
		if err := c.Failed(); err != nil {
			return false, err
		}
		if abort != nil {
			if err := abort(); err != nil {
				return false, err
			}
		}
		got, _, _ := c.Distinct()
		return got >= n, nil
	})
}

// WaitAll waits until every id in ids has arrived.
func (c *Consumer) WaitAll(ctx context.Context, ids []string, timeout time.Duration, abort func() error) error {
	missing := append([]string(nil), ids...)
	return harness.WaitUntil(ctx, timeout, 20*time.Millisecond, fmt.Sprintf("%d messages", len(ids)), func() (bool, error) {
		if err := c.Failed(); err != nil {
			return false, err
		}
		if abort != nil {
			if err := abort(); err != nil {
				return false, err
			}
		}
		c.mu.Lock()
		kept := missing[:0]
		for _, id := range missing {
			if _, ok := c.Recv[id]; !ok {
				kept = append(kept, id)
			}
		}
		c.mu.Unlock()
		missing = kept
		return len(missing) == 0, nil
	})
}

// Report returns the checker's counts, with expected the ids that had to
// arrive.
func (c *Consumer) Report(expected []string) result.Check {
	c.Rec.Expect(expected...)
	return c.Rec.Report()
}

// Close deletes the queue, closes the connection and waits for the
// delivery loop. It is idempotent.
func (c *Consumer) Close() error {
	var err error
	if !c.conn.IsClosed() {
		if ch, cerr := c.conn.Channel(); cerr == nil {
			if _, derr := ch.QueueDelete(c.queue, false, false, false); derr != nil {
				var aerr *amqp.Error
				if !errors.As(derr, &aerr) || aerr.Code != amqp.NotFound {
					err = fmt.Errorf("delete queue %s: %w", c.queue, derr)
				}
			}
		}
		_ = c.conn.Close()
	}
	<-c.done
	return err
}
