package rabbitmq

import (
	"testing"
	"time"

	"github.com/google/uuid"

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
	b.ReportAllocs()
	for b.Loop() {
		_ = publishing(m, 1)
	}
}
