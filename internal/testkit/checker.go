package testkit

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ordo-relay/ordo/wire"
)

// reportListCap caps Report.LostIDs and Report.Problems.
const reportListCap = 20

// checkerPrefetch bounds the unacknowledged deliveries a Checker's consumer
// holds.
const checkerPrefetch = 512

// Delivery is one message as a Checker received it, with Ordo's headers
// parsed by wire.Int. A header that is absent or not an integer leaves its
// field zero (and HasPrevKeySeq false for x-ordo-prev-key-seq).
type Delivery struct {
	MessageID     string
	CorrelationID string
	Type          string
	RoutingKey    string
	KeySeq        int64 // x-ordo-key-seq
	PrevKeySeq    int64 // x-ordo-prev-key-seq, when HasPrevKeySeq
	HasPrevKeySeq bool
	Partition     int   // x-ordo-partition
	Epoch         int64 // x-ordo-epoch
	Body          []byte
	Redelivered   bool
	Received      time.Time
}

// DeliveryFromAMQP converts an AMQP delivery, parsing Ordo's headers, and
// stamps it with the current time.
func DeliveryFromAMQP(d amqp.Delivery) Delivery {
	out := Delivery{
		MessageID:     d.MessageId,
		CorrelationID: d.CorrelationId,
		Type:          d.Type,
		RoutingKey:    d.RoutingKey,
		Body:          d.Body,
		Redelivered:   d.Redelivered,
		Received:      time.Now(),
	}
	out.KeySeq, _ = wire.Int(d.Headers, wire.HeaderKeySeq)
	prev, err := wire.Int(d.Headers, wire.HeaderPrevKeySeq)
	out.PrevKeySeq, out.HasPrevKeySeq = prev, err == nil
	p, _ := wire.Int(d.Headers, wire.HeaderPartition)
	out.Partition = int(p)
	out.Epoch, _ = wire.Int(d.Headers, wire.HeaderEpoch)
	return out
}

// Report summarises what a History (or a Checker) has seen. The bench
// writes it into its JSON results as is (bench/internal/result.Check).
type Report struct {
	Total        int      `json:"total"`                  // deliveries, redeliveries and duplicates included
	Distinct     int      `json:"distinct"`               // distinct message ids
	Duplicates   int      `json:"duplicates"`             // deliveries whose message id had been delivered before, not flagged redelivered: published again
	Redeliveries int      `json:"redeliveries,omitempty"` // deliveries whose message id had been delivered before, flagged redelivered by the broker
	Lost         int      `json:"lost"`                   // expected messages (History.Expect, ExpectEvent) never delivered
	Reorders     int      `json:"reorders"`               // first deliveries with a key_seq below the key's highest so far
	Gaps         int      `json:"gaps"`                   // first deliveries that skip a message of their key not skipped on purpose
	Keys         int      `json:"keys"`                   // distinct correlation ids
	LostIDs      []string `json:"lostIds,omitempty"`      // the first lost ids (key/type for an ExpectEvent), at most the History's cap, in Expect order
	Problems     []string `json:"problems,omitempty"`     // the first reorders and gaps, at most the History's cap, described
}

// String returns all counts on one line (redeliveries only when there are
// any).
func (r Report) String() string {
	s := fmt.Sprintf("total=%d distinct=%d duplicates=%d lost=%d reorders=%d gaps=%d keys=%d",
		r.Total, r.Distinct, r.Duplicates, r.Lost, r.Reorders, r.Gaps, r.Keys)
	if r.Redeliveries > 0 {
		s += fmt.Sprintf(" redeliveries=%d", r.Redeliveries)
	}
	return s
}

// Detail returns String followed by the lost ids and the problems, one per
// line, for failure messages.
func (r Report) Detail() string {
	var b strings.Builder
	b.WriteString(r.String())
	if len(r.LostIDs) > 0 {
		fmt.Fprintf(&b, "\nlost ids (first %d): %s", len(r.LostIDs), strings.Join(r.LostIDs, " "))
	}
	for _, p := range r.Problems {
		b.WriteString("\n  ")
		b.WriteString(p)
	}
	return b.String()
}

// OK reports whether nothing was lost, reordered or skipped. Duplicates are
// allowed: delivery is at least once.
func (r Report) OK() bool { return r.Lost == 0 && r.Reorders == 0 && r.Gaps == 0 }

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
	h          *History
	changed    chan struct{} // closed and replaced on every change
}

// NewRecorder returns a Checker fed only by Record, for checks in memory or
// of deliveries received some other way.
func NewRecorder() *Checker {
	return &Checker{h: NewHistory(reportListCap), changed: make(chan struct{})}
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
			c.Record(DeliveryFromAMQP(m))
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
