package inbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ordo-relay/ordo/wire"
)

// deadTimeout bounds one dead-letter publish, every wait in it included:
// the turn, the dial, the channel, the confirm.
const deadTimeout = 10 * time.Second

// deadLetters publishes dead letters, with publisher confirms, on an AMQP
// connection of its own: a broker alarm that blocks publishing, or a
// confirm that never comes, does not reach the consumers' connection (and
// their acks), and nothing else waits on it. Every call that waits for the
// broker has a deadline; when it passes, the connection is closed, which
// ends the wait, and the next publish dials again. Safe for concurrent
// use: publishes take turns (one confirm channel), and a caller waiting
// for its turn gives up at its own deadline.
type deadLetters struct {
	cfg  Config
	topo Topology
	url  string        // the broker; tests may point it through a proxy
	turn chan struct{} // one token: the right to use the fields below

	conn     *amqp.Connection
	ch       *amqp.Channel
	confirms chan amqp.Confirmation
	returns  chan amqp.Return
	closed   bool
}

var _ DeadLetterer = (*deadLetters)(nil)

func newDeadLetters(cfg Config, topo Topology) *deadLetters {
	return &deadLetters{cfg: cfg, topo: topo, url: cfg.AMQPURL, turn: make(chan struct{}, 1)}
}

// DeadLetter implements DeadLetterer: it publishes m to the dead-letter
// queue with the reason and attempts as headers and waits for the confirm,
// at most until ctx's deadline or deadTimeout.
func (d *deadLetters) DeadLetter(ctx context.Context, m *Message, reason string, attempts int) error {
	h := amqp.Table{}
	for k, v := range m.Headers {
		h[k] = v
	}
	h[HeaderDeadReason] = truncate(reason, 1000)
	h[HeaderDeadAttempts] = int32(attempts)
	h[HeaderDeadConsumer] = d.cfg.Name
	if err := h.Validate(); err != nil {
		// Headers read back from JSON may hold types AMQP cannot carry.
		h = amqp.Table{HeaderDeadReason: truncate(reason, 1000), HeaderDeadAttempts: int32(attempts), HeaderDeadConsumer: d.cfg.Name,
			wire.HeaderKeySeq: m.KeySeq, wire.HeaderPrevKeySeq: m.PrevKeySeq, wire.HeaderPartition: int32(m.Partition),
			wire.HeaderSource: m.Source}
	}
	return d.publish(ctx, amqp.Publishing{
		Headers: h, ContentType: "application/json", DeliveryMode: amqp.Persistent,
		CorrelationId: m.CorrelationID, MessageId: m.ID, Type: m.Type, Timestamp: m.Timestamp, Body: m.Body,
	})
}

// raw dead-letters a delivery the inbox cannot parse.
func (d *deadLetters) raw(ctx context.Context, dl *amqp.Delivery, reason string) error {
	h := amqp.Table{}
	for k, v := range dl.Headers {
		h[k] = v
	}
	h[HeaderDeadReason] = truncate(reason, 1000)
	h[HeaderDeadConsumer] = d.cfg.Name
	return d.publish(ctx, amqp.Publishing{
		Headers: h, ContentType: dl.ContentType, DeliveryMode: amqp.Persistent,
		CorrelationId: dl.CorrelationId, MessageId: dl.MessageId, Type: dl.Type, Timestamp: dl.Timestamp, Body: dl.Body,
	})
}

func (d *deadLetters) publish(ctx context.Context, p amqp.Publishing) error {
	ctx, cancel := context.WithTimeout(ctx, deadTimeout)
	defer cancel()
	select {
	case d.turn <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("publish dead letter: waiting for the dead-letter channel: %w", ctx.Err())
	}
	defer func() { <-d.turn }()
	if d.closed {
		return fmt.Errorf("publish dead letter: %w", errClosed)
	}
	if d.conn == nil || d.conn.IsClosed() {
		conn, err := d.dial(ctx)
		if err != nil {
			return err
		}
		d.conn, d.ch = conn, nil
	}
	err := closeAtDeadline(ctx, d.conn, func() error { return d.publishConfirmed(ctx, p) })
	if d.conn.IsClosed() {
		d.conn, d.ch = nil, nil
	}
	return err
}

// dial connects for the dead letters, within ctx's deadline.
func (d *deadLetters) dial(ctx context.Context) (*amqp.Connection, error) {
	dl, _ := ctx.Deadline()
	name := "ordo inbox " + d.cfg.Name + " " + d.cfg.Instance + " dead letters"
	conn, err := amqp.DialConfig(d.url, d.cfg.amqpConfig(name, min(time.Until(dl), amqpDialTimeout)))
	if err != nil {
		return nil, fmt.Errorf("publish dead letter: connect to RabbitMQ: %w", err)
	}
	return conn, nil
}

// publishConfirmed publishes p on the confirm channel (opening it first if
// needed) and waits for the broker's confirm. Its waits end when ctx's
// deadline closes the connection (closeAtDeadline). A nacked or returned
// publish closes the channel: the next one opens a fresh one.
func (d *deadLetters) publishConfirmed(ctx context.Context, p amqp.Publishing) error {
	if d.ch == nil || d.ch.IsClosed() {
		ch, err := d.conn.Channel()
		if err != nil {
			return fmt.Errorf("open dead-letter channel: %w", err)
		}
		if err := ch.Confirm(false); err != nil {
			_ = ch.Close()
			return fmt.Errorf("open dead-letter channel: %w", err)
		}
		d.ch = ch
		d.confirms = ch.NotifyPublish(make(chan amqp.Confirmation, 1))
		d.returns = ch.NotifyReturn(make(chan amqp.Return, 1))
	}
	if err := d.ch.PublishWithContext(ctx, "", d.topo.DeadQueue(), true, false, p); err != nil {
		d.dropChannel()
		return fmt.Errorf("publish dead letter: %w", err)
	}
	var c amqp.Confirmation
	var ok bool
	select {
	case c, ok = <-d.confirms:
	case <-ctx.Done():
		return fmt.Errorf("publish dead letter: no confirm: %w", ctx.Err())
	}
	// A basic.return (the dead-letter queue is missing) is dispatched
	// before its ack, on the same reader: it is here by now if it came.
	select {
	case r := <-d.returns:
		d.dropChannel()
		return fmt.Errorf("publish dead letter: returned by the broker: %d %s", r.ReplyCode, r.ReplyText)
	default:
	}
	switch {
	case !ok:
		d.ch = nil
		return errors.New("publish dead letter: channel closed before the confirm")
	case !c.Ack:
		d.dropChannel()
		return errors.New("publish dead letter: nacked by the broker")
	}
	return nil
}

// dropChannel closes the confirm channel (its close waits for the broker:
// closeAtDeadline bounds it) so that a failed publish does not leak it.
func (d *deadLetters) dropChannel() {
	_ = d.ch.Close()
	d.ch = nil
}

// close closes the connection; publishes after it fail. A publish in
// progress ends first (within deadTimeout).
func (d *deadLetters) close() {
	d.turn <- struct{}{}
	defer func() { <-d.turn }()
	d.closed = true
	if d.conn != nil {
		_ = d.conn.CloseDeadline(time.Now().Add(time.Second))
		d.conn, d.ch = nil, nil
	}
}

// closeAtDeadline runs f, and closes conn if ctx ends first: every AMQP
// call of f waiting for the broker then returns. It waits for the close
// before it returns, so no goroutine outlives it.
func closeAtDeadline(ctx context.Context, conn *amqp.Connection, f func() error) error {
	closed := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(closed)
		_ = conn.CloseDeadline(time.Now())
	})
	err := f()
	if !stop() {
		<-closed
	}
	return err
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}
