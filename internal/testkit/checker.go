package testkit

import (
	"context"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ordo-relay/ordo/internal/ordercheck"
)

// reportListCap caps Report.LostIDs and Report.Problems.
const reportListCap = 20

// checkerPrefetch bounds the unacknowledged deliveries a Checker's consumer
// holds.
const checkerPrefetch = 512

// Delivery is one message as the order checker takes it
// (ordercheck.Delivery), as a Checker records it.
type Delivery = ordercheck.Delivery

// Report is what the order checker has seen (ordercheck.Report), as a
// Checker reports it.
type Report = ordercheck.Report

// Checker records deliveries and checks them for loss and per-key order
// with a History (see there for the rules), which does not know the skips:
// x-ordo-prev-key-seq is taken at its word as long as it agrees with what
// arrived. Messages without Ordo headers are checked as key_seq 0 and will
// be reported as gaps. A Checker is safe for concurrent use. One made by
// NewChecker consumes from RabbitMQ until its test ends; one made by
// NewRecorder is fed with Record and owns no goroutines.
type Checker struct {
	queue   string
	connErr chan *amqp.Error // the consumer connection's close notification

	mu         sync.Mutex
	deliveries []Delivery
	h          *ordercheck.History
	changed    chan struct{} // closed and replaced on every change
}

// NewRecorder returns a Checker fed only by Record, for checks in memory or
// of deliveries received some other way.
func NewRecorder() *Checker {
	return &Checker{h: ordercheck.NewHistory(reportListCap), changed: make(chan struct{})}
}

// NewChecker connects to amqpURL and records every message routed to
// exchange with one of bindingKeys ("#", everything, when none is given).
// The exchange must exist: the caller owns it. The Checker declares its own
// non-durable, auto-delete queue (named after the test, see Queue), binds it,
// and consumes with manual acknowledgement, acknowledging each delivery after
// recording it. It fails tb when any of that fails. When tb ends, the
// consumer is stopped, its goroutine waited for and the connection closed,
// which deletes the queue.
func NewChecker(tb testing.TB, amqpURL, exchange string, bindingKeys ...string) *Checker {
	tb.Helper()
	if len(bindingKeys) == 0 {
		bindingKeys = []string{"#"}
	}
	c := NewRecorder()
	c.queue = UniqueName(tb, "chk")

	conn, err := amqp.DialConfig(amqpURL, amqp.Config{
		Heartbeat:  10 * time.Second,
		Properties: amqp.Table{"connection_name": "testkit checker " + c.queue},
	})
	if err != nil {
		tb.Fatalf("checker: connect to RabbitMQ: %v", err)
	}
	fail := func(format string, args ...any) {
		tb.Helper()
		_ = conn.Close()
		tb.Fatalf(format, args...)
	}
	c.connErr = conn.NotifyClose(make(chan *amqp.Error, 1))
	ch, err := conn.Channel()
	if err != nil {
		fail("checker: open channel: %v", err)
	}
	if err := ch.Qos(checkerPrefetch, 0, false); err != nil {
		fail("checker: set prefetch: %v", err)
	}
	if _, err := ch.QueueDeclare(c.queue, false, true, false, false, nil); err != nil {
		fail("checker: declare queue %s: %v", c.queue, err)
	}
	for _, k := range bindingKeys {
		if err := ch.QueueBind(c.queue, k, exchange, false, nil); err != nil {
			fail("checker: bind queue %s to exchange %q with key %q: %v", c.queue, exchange, k, err)
		}
	}
	msgs, err := ch.ConsumeWithContext(context.Background(), c.queue, c.queue, false, false, false, false, nil)
	if err != nil {
		fail("checker: consume from %s: %v", c.queue, err)
	}

	done := make(chan struct{})
	go func() {
		defer close(done)
		for m := range msgs {
			c.Record(ordercheck.DeliveryFromAMQP(m))
			// An ack fails only when the channel is closing; the message is
			// then redelivered to nobody, as the queue goes with it.
			_ = m.Ack(false)
		}
	}()
	tb.Cleanup(func() {
		// Closing the connection closes msgs, which ends the consumer.
		_ = conn.Close()
		<-done
	})
	return c
}

// Queue returns the name of the queue the Checker consumes from, or "" for
// one made by NewRecorder.
func (c *Checker) Queue() string { return c.queue }

// Expect declares message ids that must be delivered; those never delivered
// are counted as Lost. Declaring an id again has no effect.
func (c *Checker) Expect(ids ...string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.h.Expect(ids...)
	c.notifyLocked()
}

// Record adds one delivery and checks it against the key's earlier ones.
func (c *Checker) Record(d Delivery) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.deliveries = append(c.deliveries, d)
	c.h.Add(d)
	c.notifyLocked()
}

// notifyLocked wakes everyone waiting for a change.
func (c *Checker) notifyLocked() {
	close(c.changed)
	c.changed = make(chan struct{})
}

// Report returns what the Checker has seen so far.
func (c *Checker) Report() Report {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.h.Report()
}

// Deliveries returns a copy of every delivery recorded, in arrival order.
func (c *Checker) Deliveries() []Delivery {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]Delivery(nil), c.deliveries...)
}

// WaitDistinct waits until at least n distinct messages have been delivered,
// logs how long that took and returns the report. It fails tb with the
// report when timeout passes first.
func (c *Checker) WaitDistinct(tb testing.TB, n int, timeout time.Duration) Report {
	tb.Helper()
	start := time.Now()
	r := c.WaitFor(tb, timeout, func(r Report) bool { return r.Distinct >= n })
	tb.Logf("checker: %d distinct messages after %v: %v", n, time.Since(start).Round(time.Millisecond), r)
	return r
}

// WaitFor waits until cond holds for the current report and returns that
// report. cond is evaluated after every change, under no lock. WaitFor fails
// tb with the report when timeout passes first, or when the Checker's
// connection to RabbitMQ has closed and cond still does not hold.
func (c *Checker) WaitFor(tb testing.TB, timeout time.Duration, cond func(Report) bool) Report {
	tb.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		c.mu.Lock()
		r := c.h.Report()
		changed := c.changed
		c.mu.Unlock()
		if cond(r) {
			return r
		}
		select {
		case <-changed:
		case err, ok := <-c.connErr: // nil channel for a recorder: never ready
			if !ok || err != nil {
				// Check the final state once more before failing.
				if r := c.Report(); cond(r) {
					return r
				}
				tb.Fatalf("checker: connection to RabbitMQ closed (%v) while waiting: %s", err, c.Report().Detail())
			}
		case <-deadline.C:
			tb.Fatalf("checker: condition not met after %v: %s", timeout, c.Report().Detail())
		}
	}
}

// DeliveryFromAMQP converts an AMQP delivery as a Checker's consumer does
// (ordercheck.DeliveryFromAMQP), for a test that records deliveries it
// consumed itself.
func DeliveryFromAMQP(d amqp.Delivery) Delivery { return ordercheck.DeliveryFromAMQP(d) }
