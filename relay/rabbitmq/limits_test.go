package rabbitmq

import (
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/ordo-relay/ordo/relay"
)

// TestHeaderFrameSize: the computed size of the content header matches
// what the broker reported for a frame it refused (frame_too_large,
// 184558 bytes with three 60 KB header values, measured on RabbitMQ
// 3.10), so the check refuses exactly what the broker would.
func TestHeaderFrameSize(t *testing.T) {
	m := &relay.Message{
		ID: uuid.New(), Partition: 3, Epoch: 1, CorrelationID: "k", KeySeq: 1, Exchange: "e", RoutingKey: "r",
		Type: "t", Payload: []byte(`{}`), OccurredAt: time.Unix(1, 0),
		Headers: map[string]any{"a": strings.Repeat("x", 60<<10), "b": strings.Repeat("x", 60<<10), "c": strings.Repeat("x", 60<<10)},
	}
	p := newPublisher(Config{})
	pub := p.publishing(m, 1)
	size, err := headerFrameSize(&pub)
	if err != nil {
		t.Fatal(err)
	}
	// The broker's figure was for the same message without wire.HeaderAttempt
	// (1 + 14 bytes of name, 9 of int64), a correlation id of 36 bytes.
	const brokerSaid = 184558
	if want := brokerSaid + 24 - 35; size != want {
		t.Fatalf("header frame of %d bytes, want %d", size, want)
	}
	if err := checkFrame(&pub, 131072); err == nil {
		t.Fatal("three 60 KB header values fit a 128 KiB frame")
	}
	small := p.publishing(&relay.Message{ID: uuid.New(), Type: "t", Payload: []byte(`{}`)}, 1)
	if err := checkFrame(&small, 4096); err != nil {
		t.Fatalf("a small message: %v", err)
	}
	if _, err := fieldSize(map[string]any{"nested": 1}); err == nil {
		t.Fatal("a Go map (not an amqp.Table) was taken for an AMQP value")
	}
}
