package inbox

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ordo-relay/ordo/wire"
)

// broker holds the instance's one AMQP connection (redialled on demand)
// and the confirm channel dead letters are published on. Safe for
// concurrent use.
type broker struct {
	cfg  Config
	topo Topology

	mu       sync.Mutex
	conn     *amqp.Connection
	declared bool // topology declared on conn
	dlq      *amqp.Channel
	confirms chan amqp.Confirmation
	closed   bool
	// downSince is when dialling first failed in the current outage; zero
	// while connected.
	downSince time.Time
}

var _ DeadLetterer = (*broker)(nil)

func newBroker(cfg Config, topo Topology) *broker { return &broker{cfg: cfg, topo: topo} }

// errClosed is returned by connection after close.
var errClosed = errors.New("inbox broker connection closed")

// connection returns the open connection, dialling (and declaring the
// topology) if there is none.
func (b *broker) connection() (*amqp.Connection, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, errClosed
	}
	if b.conn != nil && !b.conn.IsClosed() {
		return b.conn, nil
	}
	conn, err := b.dial()
	if err != nil {
		if b.downSince.IsZero() {
			b.downSince = time.Now()
		}
		return nil, err
	}
	b.conn, b.dlq, b.downSince = conn, nil, time.Time{}
	return conn, nil
}

// reachable reports false once the broker has been unreachable for longer
// than d: the instance then gives its shards to instances that reach it.
func (b *broker) reachable(d time.Duration) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.downSince.IsZero() || time.Since(b.downSince) <= d
}

// dial connects and declares the topology.
func (b *broker) dial() (*amqp.Connection, error) {
	conn, err := amqp.DialConfig(b.cfg.AMQPURL, amqp.Config{
		Heartbeat:  b.cfg.Heartbeat,
		Dial:       amqp.DefaultDial(5 * time.Second),
		Properties: amqp.Table{"connection_name": "ordo inbox " + b.cfg.Name + " " + b.cfg.Instance},
	})
	if err != nil {
		return nil, fmt.Errorf("connect to RabbitMQ: %w", err)
	}
	ch, err := conn.Channel()
	if err == nil {
		err = b.topo.Declare(ch)
		_ = ch.Close()
	}
	if err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("declare topology: %w", err)
	}
	return conn, nil
}

func (b *broker) close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	if b.conn != nil {
		_ = b.conn.Close()
	}
}

// DeadLetter implements DeadLetterer: it publishes m to the dead-letter
// queue with the reason and attempts as headers and waits for the confirm.
func (b *broker) DeadLetter(ctx context.Context, m *Message, reason string, attempts int) error {
	h := amqp.Table{}
	for k, v := range m.Headers {
		h[k] = v
	}
	h[HeaderDeadReason] = truncate(reason, 1000)
	h[HeaderDeadAttempts] = int32(attempts)
	h[HeaderDeadConsumer] = b.cfg.Name
	if err := h.Validate(); err != nil {
		// Headers read back from JSON may hold types AMQP cannot carry.
		h = amqp.Table{HeaderDeadReason: truncate(reason, 1000), HeaderDeadAttempts: int32(attempts), HeaderDeadConsumer: b.cfg.Name,
			wire.HeaderKeySeq: m.KeySeq, wire.HeaderPrevKeySeq: m.PrevKeySeq, wire.HeaderPartition: int32(m.Partition)}
	}
	return b.publishDead(ctx, amqp.Publishing{
		Headers: h, ContentType: "application/json", DeliveryMode: amqp.Persistent,
		CorrelationId: m.CorrelationID, MessageId: m.ID, Type: m.Type, Timestamp: m.Timestamp, Body: m.Body,
	})
}

// deadLetterRaw dead-letters a delivery the inbox cannot parse.
func (b *broker) deadLetterRaw(ctx context.Context, d *amqp.Delivery, reason string) error {
	h := amqp.Table{}
	for k, v := range d.Headers {
		h[k] = v
	}
	h[HeaderDeadReason] = truncate(reason, 1000)
	h[HeaderDeadConsumer] = b.cfg.Name
	return b.publishDead(ctx, amqp.Publishing{
		Headers: h, ContentType: d.ContentType, DeliveryMode: amqp.Persistent,
		CorrelationId: d.CorrelationId, MessageId: d.MessageId, Type: d.Type, Timestamp: d.Timestamp, Body: d.Body,
	})
}

func (b *broker) publishDead(ctx context.Context, p amqp.Publishing) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.conn == nil || b.conn.IsClosed() {
		return errors.New("publish dead letter: not connected")
	}
	if b.dlq == nil || b.dlq.IsClosed() {
		ch, err := b.conn.Channel()
		if err != nil {
			return fmt.Errorf("open dead-letter channel: %w", err)
		}
		if err := ch.Confirm(false); err != nil {
			_ = ch.Close()
			return fmt.Errorf("open dead-letter channel: %w", err)
		}
		b.dlq, b.confirms = ch, ch.NotifyPublish(make(chan amqp.Confirmation, 1))
	}
	if err := b.dlq.PublishWithContext(ctx, "", b.topo.DeadQueue(), true, false, p); err != nil {
		return fmt.Errorf("publish dead letter: %w", err)
	}
	t := time.NewTimer(10 * time.Second)
	defer t.Stop()
	select {
	case c, ok := <-b.confirms:
		if !ok || !c.Ack {
			b.dlq = nil
			return errors.New("publish dead letter: not confirmed")
		}
		return nil
	case <-t.C:
		_ = b.dlq.Close()
		b.dlq = nil
		return errors.New("publish dead letter: no confirm within 10s")
	}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}
