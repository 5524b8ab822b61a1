package inbox

import (
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ordo-relay/ordo/wire"
)

// Headers the inbox adds to a message it dead-letters.
const (
	HeaderDeadReason   = "x-ordo-inbox-reason"
	HeaderDeadAttempts = "x-ordo-inbox-attempts"
	HeaderDeadConsumer = "x-ordo-inbox-consumer"
)

// ErrInvalidMessage is returned (wrapped) by FromDelivery when a delivery
// lacks a correlation id, or usable ordering headers (wire.ParseOrder:
// x-ordo-key-seq, x-ordo-prev-key-seq, x-ordo-partition), or carries an
// x-ordo-source that is not a source name (wire.Source). The consumer
// dead-letters such a message and counts it.
var ErrInvalidMessage = errors.New("not an Ordo message")

// Message is one delivery as the inbox sees it: the ordering fields parsed
// from the AMQP properties and headers, and the rest carried through to the
// handler. A Message read back from the inbox table (a stored gap or a
// retry) has the same fields; its Headers come from JSON, so numbers there
// are float64: use the typed fields for the Ordo headers.
type Message struct {
	ID            string     // AMQP message-id
	Source        string     // x-ordo-source: the outbox database, wire.DefaultSource when absent (Store.Handle reads "" as that too)
	CorrelationID string     // the ordering key, within Source
	KeySeq        int64      // x-ordo-key-seq: 1, 2, 3, ... per key
	PrevKeySeq    int64      // x-ordo-prev-key-seq: the previous key_seq not skipped by the producer, 0 if none
	Partition     int        // x-ordo-partition
	Type          string     // AMQP type
	Exchange      string     // where it was published
	RoutingKey    string     // its routing key
	Timestamp     time.Time  // AMQP timestamp: the producer's occurred_at, whole seconds; zero if absent
	Headers       amqp.Table // every header
	Body          []byte
	// Redelivered is the broker's flag: an earlier delivery may have reached
	// a handler that crashed. The inbox counts such a delivery as one
	// attempt before it runs the handler again.
	Redelivered bool
}

// FromDelivery parses d. It returns an error wrapping ErrInvalidMessage when
// a field the inbox needs is missing or malformed. A CloudEvent in the
// AMQP binding's binary mode is accepted too: its cloudEvents:id, type
// and subject stand in for an empty message-id, type and correlation-id.
func FromDelivery(d *amqp.Delivery) (*Message, error) {
	m := &Message{
		ID:            d.MessageId,
		CorrelationID: d.CorrelationId,
		Type:          d.Type,
		Exchange:      d.Exchange,
		RoutingKey:    d.RoutingKey,
		Timestamp:     d.Timestamp,
		Headers:       d.Headers,
		Body:          d.Body,
		Redelivered:   d.Redelivered,
	}
	fillFromCloudEvents(m, d.Headers)
	if m.CorrelationID == "" {
		return nil, fmt.Errorf("message %q: no correlation id: %w", d.MessageId, ErrInvalidMessage)
	}
	o, err := wire.ParseOrder(d.Headers)
	if err != nil {
		return nil, fmt.Errorf("message %q: %w: %w", d.MessageId, err, ErrInvalidMessage)
	}
	if m.Source, err = wire.Source(d.Headers); err != nil {
		return nil, fmt.Errorf("message %q: %w: %w", d.MessageId, err, ErrInvalidMessage)
	}
	m.KeySeq, m.PrevKeySeq, m.Partition = o.KeySeq, o.PrevKeySeq, o.Partition
	return m, nil
}

// laneKey is the key a message's jobs are serialised on in a shard's
// lanes: its source and correlation id. A key's deliveries and its
// retries (retryKey) must map to the same lane key.
func laneKey(source, correlationID string) string { return source + "\x00" + correlationID }

// deliveryLaneKey is laneKey of a delivery not parsed yet; an invalid
// x-ordo-source gives the empty source (the delivery is dead-lettered).
func deliveryLaneKey(d *amqp.Delivery) string {
	source, _ := wire.Source(d.Headers)
	return laneKey(source, d.CorrelationId)
}
