package testkit

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ordo-relay/ordo/partition"
	"github.com/ordo-relay/ordo/wire"
)

// OrdoPublisher publishes messages shaped as an Ordo relay publishes them
// (correlation id, message id, x-ordo-key-seq, x-ordo-prev-key-seq,
// x-ordo-partition, a timestamp fixed at the first publish of each id)
// straight to an exchange with publisher confirms, for consumer tests that
// need exact control of order and duplicates. Safe for concurrent use.
type OrdoPublisher struct {
	tb         testing.TB
	exchange   string
	partitions int

	mu       sync.Mutex
	ch       *amqp.Channel
	confirms chan amqp.Confirmation
	stamps   map[string]time.Time
}

// NewOrdoPublisher connects to AMQPURL; the connection is closed when tb
// ends. Partitions is P, used to compute x-ordo-partition.
func NewOrdoPublisher(tb testing.TB, exchange string, partitions int) *OrdoPublisher {
	tb.Helper()
	RequireRabbitMQ(tb)
	conn, err := amqp.Dial(AMQPURL())
	if err != nil {
		tb.Fatalf("connect to RabbitMQ: %v", err)
	}
	tb.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		tb.Fatalf("open channel: %v", err)
	}
	if err := ch.Confirm(false); err != nil {
		tb.Fatalf("confirm mode: %v", err)
	}
	return &OrdoPublisher{tb: tb, exchange: exchange, partitions: partitions, ch: ch,
		confirms: ch.NotifyPublish(make(chan amqp.Confirmation, 1)), stamps: map[string]time.Time{}}
}

// Publish sends key's message seq (prev seq-1) of type typ with body
// (routing key "order.placed") and waits for its confirm. Its message id
// is "<key>-<seq>", so publishing it again is a republish.
func (p *OrdoPublisher) Publish(key string, seq int64, typ string, body []byte) {
	p.tb.Helper()
	p.PublishRaw(key, fmt.Sprintf("%s-%d", key, seq), typ, amqp.Table{
		wire.HeaderKeySeq:     seq,
		wire.HeaderPrevKeySeq: seq - 1,
		wire.HeaderPartition:  int32(partition.Of(key, p.partitions)),
	}, body)
}

// PublishRaw sends a message with exactly the headers h.
func (p *OrdoPublisher) PublishRaw(key, id, typ string, h amqp.Table, body []byte) {
	p.tb.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	stamp, ok := p.stamps[id]
	if !ok {
		stamp = time.Now() // like occurred_at: fixed at the first publish
		p.stamps[id] = stamp
	}
	err := p.ch.PublishWithContext(context.Background(), p.exchange, "order.placed", false, false, amqp.Publishing{
		Headers: h, CorrelationId: key, MessageId: id, Type: typ, Timestamp: stamp, DeliveryMode: amqp.Persistent,
		ContentType: "application/json", Body: body,
	})
	if err != nil {
		p.tb.Fatalf("publish %s: %v", id, err)
	}
	select {
	case c := <-p.confirms:
		if !c.Ack {
			p.tb.Fatalf("publish %s: nacked", id)
		}
	case <-time.After(30 * time.Second):
		p.tb.Fatalf("publish %s: no confirm within 30s", id)
	}
}
