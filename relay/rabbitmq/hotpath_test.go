package rabbitmq

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/relay"
)

// BenchmarkPublishing builds the AMQP message of one publish.
func BenchmarkPublishing(b *testing.B) {
	m := &relay.Message{
		ID: uuid.New(), Partition: 7, Epoch: 3, CorrelationID: "0195f3a2-7c1e-7b7a-9d4e-3f2a1b0c9d8e",
		KeySeq: 12, PrevKeySeq: 11, Exchange: "bookstore.ordering", RoutingKey: "order.placed",
		Type: "bookstore.order-placed.v1", Payload: make([]byte, 300), OccurredAt: time.Now(),
		Headers: map[string]any{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
	}
	p := newPublisher(Config{})
	b.ReportAllocs()
	for b.Loop() {
		_ = p.publishing(m, 1)
	}
}

// BenchmarkPublishConfirmed publishes to RabbitMQ (directly, no proxy)
// and waits for the confirms, in rounds of 100 publishes and a Flush, as
// the relay's dispatch rounds do: the node's whole cost of a publish, the
// client library's frames and the reading of the confirms included. One
// op is one message. The messages are as a node sends a drain's rows: a
// lease deadline far off (corked), a source, no headers of their own, 300
// bytes of payload, routed to a queue that keeps its newest 1,000.
func BenchmarkPublishConfirmed(b *testing.B) {
	testkit.RequireRabbitMQ(b)
	ex := testkit.NewExchange(b)
	queue := testkit.UniqueName(b, "q")
	testkit.WithChannel(b, func(ch *amqp.Channel) error {
		args := amqp.Table{"x-max-length": int32(1000), "x-overflow": "drop-head"}
		if _, err := ch.QueueDeclare(queue, false, true, false, false, args); err != nil {
			return err
		}
		return ch.QueueBind(queue, "bound", ex, false, nil)
	})
	b.Cleanup(func() {
		testkit.WithChannel(b, func(ch *amqp.Channel) error { _, err := ch.QueueDelete(queue, false, false, false); return err })
	})
	pub, err := New(Config{URL: testkit.AMQPURL(), Window: 512})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- pub.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			b.Errorf("Run: %v", err)
		}
	}()

	const round = 100
	var mu sync.Mutex
	settled, failed := 0, 0
	cond := sync.NewCond(&mu)
	settle := func(res relay.Result) { // one for all: the relay's own closure is not the publisher's cost
		mu.Lock()
		settled++
		if res.Outcome != relay.Confirmed {
			failed++
		}
		mu.Unlock()
		cond.Broadcast()
	}
	msgs := make([]relay.Message, round)
	deadline := time.Now().Add(time.Hour)
	for i := range msgs {
		id := uuid.Must(uuid.NewV7())
		msgs[i] = relay.Message{ID: id, Partition: i % 64, Epoch: 3, CorrelationID: id.String(), KeySeq: 5, PrevKeySeq: 4,
			Exchange: ex, RoutingKey: "bound", Type: "ordo.bench.event.v1", Payload: make([]byte, 300),
			OccurredAt: time.Now(), Source: "default", Deadline: deadline}
	}
	publishRound := func(n int) {
		mu.Lock()
		want := settled + n
		mu.Unlock()
		for i := range n {
			for {
				err := pub.Publish(ctx, &msgs[i], settle)
				if err == nil {
					break
				}
				if !errors.Is(err, relay.ErrNotConnected) {
					b.Fatal(err)
				}
				time.Sleep(5 * time.Millisecond)
			}
		}
		pub.Flush()
		mu.Lock()
		for settled < want {
			cond.Wait()
		}
		mu.Unlock()
	}
	publishRound(1) // connected, and the exchange check cached
	b.ReportAllocs()
	b.ResetTimer()
	for left := b.N; left > 0; left -= round {
		publishRound(min(left, round))
	}
	b.StopTimer()
	if failed > 0 {
		b.Fatalf("%d publishes not confirmed", failed)
	}
}
