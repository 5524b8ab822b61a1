package nemesis

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ordo-relay/ordo/bench/internal/harness"
	"github.com/ordo-relay/ordo/internal/backoff"
	"github.com/ordo-relay/ordo/internal/ordercheck"
	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/wire"
)

const (
	// checkerPrefetch bounds the unacknowledged deliveries the broker
	// pushes to the checker's consumer.
	checkerPrefetch = 1000
	// ackEvery acknowledges (multiple) after this many deliveries...
	ackEvery = checkerPrefetch / 4
	// ackIdle ...or after this long without a delivery.
	ackIdle = 20 * time.Millisecond
)

// historian is the nemesis's checker consumer: it reads a durable queue
// (not exclusive, not auto-deleted: a broker restart keeps it and its
// binding, so nothing routed to it is lost or returned) bound to the
// exchange with "#", keeps every delivery in arrival order, and
// reconnects with backoff whenever its connection drops (broker restarts).
// It acknowledges a delivery only after recording it, so a drop makes the
// broker deliver again, flagged redelivered. Its methods are safe for
// concurrent use; run blocks until its context ends.
type historian struct {
	url, exchange, queue string

	mu        sync.Mutex
	log       []delivery
	byID      map[[2]string]time.Time // (source, message id) -> first arrival
	byKeyType map[[3]string]time.Time // (source, correlation id, type) -> first arrival
	connects  int
	lastErr   error
}

func newHistorian(amqpURL, exchange, queue string) *historian {
	return &historian{url: amqpURL, exchange: exchange, queue: queue,
		byID: map[[2]string]time.Time{}, byKeyType: map[[3]string]time.Time{}}
}

// delivery is one message as the checker's consumer received it: its
// source (x-ordo-source: wire.DefaultSource when absent; the header's
// value quoted when invalid, so that it matches no source of the run)
// and the rest as the test kit reads it.
type delivery struct {
	testkit.Delivery
	Source string
}

// deliveryFromAMQP converts an AMQP delivery, its source included.
func deliveryFromAMQP(m amqp.Delivery) delivery {
	src, err := wire.Source(m.Headers)
	if err != nil {
		src = fmt.Sprintf("%q", fmt.Sprint(m.Headers[wire.HeaderSource]))
	}
	return delivery{Delivery: ordercheck.DeliveryFromAMQP(m), Source: src}
}

// declare creates the durable queue and binds it, once, before anything is
// published: from then on it keeps whatever is routed to it.
func (h *historian) declare(ctx context.Context) error {
	return testkit.UseChannel(ctx, h.url, func(ch *amqp.Channel) error {
		if _, err := ch.QueueDeclare(h.queue, true, false, false, false, nil); err != nil {
			return fmt.Errorf("declare queue %s: %w", h.queue, err)
		}
		if err := ch.QueueBind(h.queue, "#", h.exchange, false, nil); err != nil {
			return fmt.Errorf("bind queue %s: %w", h.queue, err)
		}
		return nil
	})
}

// remove deletes the queue.
func (h *historian) remove(ctx context.Context) error {
	err := testkit.UseChannel(ctx, h.url, func(ch *amqp.Channel) error {
		_, err := ch.QueueDelete(h.queue, false, false, false)
		return err
	})
	var aerr *amqp.Error
	if errors.As(err, &aerr) && aerr.Code == amqp.NotFound {
		return nil
	}
	return err
}

// run consumes until ctx ends, reconnecting after every drop.
func (h *historian) run(ctx context.Context) {
	bo := backoff.New(100*time.Millisecond, time.Second)
	for ctx.Err() == nil {
		err := h.consumeOnce(ctx)
		h.mu.Lock()
		h.lastErr = err
		h.mu.Unlock()
		if ctx.Err() != nil {
			return
		}
		backoff.Sleep(ctx, bo.Next())
	}
}

// consumeOnce opens a connection and consumes until it drops or ctx ends.
func (h *historian) consumeOnce(ctx context.Context) error {
	conn, err := amqp.DialConfig(h.url, amqp.Config{
		Heartbeat:  5 * time.Second,
		Dial:       amqp.DefaultDial(5 * time.Second),
		Properties: amqp.Table{"connection_name": "ordo bench nemesis checker " + h.queue},
	})
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	if err := ch.Qos(checkerPrefetch, 0, false); err != nil {
		return fmt.Errorf("set prefetch: %w", err)
	}
	msgs, err := ch.Consume(h.queue, "", false, false, false, false, nil)
	if err != nil {
		return fmt.Errorf("consume from %s: %w", h.queue, err)
	}
	h.mu.Lock()
	h.connects++
	h.mu.Unlock()
	idle := time.NewTimer(ackIdle)
	defer idle.Stop()
	var unacked int
	var lastTag uint64
	ack := func() error {
		if unacked == 0 {
			return nil
		}
		unacked = 0
		return ch.Ack(lastTag, true)
	}
	for {
		select {
		case <-ctx.Done():
			return ack()
		case m, ok := <-msgs:
			if !ok {
				return errors.New("delivery channel closed")
			}
			h.record(deliveryFromAMQP(m))
			unacked++
			lastTag = m.DeliveryTag
			if unacked >= ackEvery {
				if err := ack(); err != nil {
					return fmt.Errorf("ack: %w", err)
				}
			}
			idle.Reset(ackIdle)
		case <-idle.C:
			if err := ack(); err != nil {
				return fmt.Errorf("ack: %w", err)
			}
			idle.Reset(ackIdle)
		}
	}
}

func (h *historian) record(d delivery) {
	d.Body = nil // the checker reads headers only; a long run keeps 100,000 deliveries
	h.mu.Lock()
	defer h.mu.Unlock()
	h.log = append(h.log, d)
	if _, ok := h.byID[[2]string{d.Source, d.MessageID}]; !ok {
		h.byID[[2]string{d.Source, d.MessageID}] = d.Received
	}
	kt := [3]string{d.Source, d.CorrelationID, d.Type}
	if _, ok := h.byKeyType[kt]; !ok {
		h.byKeyType[kt] = d.Received
	}
}

// arrival returns when p's message first arrived, and whether it has.
func (h *historian) arrival(p promise) (time.Time, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.arrivalLocked(p)
}

func (h *historian) arrivalLocked(p promise) (time.Time, bool) {
	if p.ID != "" {
		t, ok := h.byID[[2]string{p.Source, p.ID}]
		return t, ok
	}
	t, ok := h.byKeyType[[3]string{p.Source, p.Key, p.Type}]
	return t, ok
}

// waitArrived waits until every promise in ps has arrived and returns the
// latest first arrival among them. abort is checked on every poll.
func (h *historian) waitArrived(ctx context.Context, ps []promise, timeout time.Duration, abort func() error) (time.Time, error) {
	missing := append([]promise(nil), ps...)
	var latest time.Time
	err := harness.WaitUntil(ctx, timeout, 20*time.Millisecond, fmt.Sprintf("%d promised messages", len(ps)), func() (bool, error) {
		if err := abort(); err != nil {
			return false, err
		}
		h.mu.Lock()
		kept := missing[:0]
		for _, p := range missing {
			if t, ok := h.arrivalLocked(p); ok {
				if t.After(latest) {
					latest = t
				}
			} else {
				kept = append(kept, p)
			}
		}
		h.mu.Unlock()
		missing = kept
		return len(missing) == 0, nil
	})
	if err != nil {
		return latest, fmt.Errorf("%w (%d still missing)", err, len(missing))
	}
	return latest, nil
}

// history returns a copy of every delivery, in arrival order, and how many
// times the consumer connected.
func (h *historian) history() ([]delivery, int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]delivery(nil), h.log...), h.connects
}

// countSince returns how many deliveries that arrived at or after since
// match.
func (h *historian) countSince(since time.Time, match func(delivery) bool) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for i := len(h.log) - 1; i >= 0 && !h.log[i].Received.Before(since); i-- {
		if match(h.log[i]) {
			n++
		}
	}
	return n
}

// count returns how many deliveries have been recorded.
func (h *historian) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.log)
}
