package inbox

import (
	"errors"
	"fmt"
	"math"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// The AMQP headers Ordo sets on every message (DESIGN.md, "The AMQP
// message"). They are the whole contract between a producer and the inbox.
const (
	HeaderKeySeq     = "x-ordo-key-seq"
	HeaderPrevKeySeq = "x-ordo-prev-key-seq"
	HeaderPartition  = "x-ordo-partition"
)

// Headers the inbox adds to a message it dead-letters.
const (
	HeaderDeadReason   = "x-ordo-inbox-reason"
	HeaderDeadAttempts = "x-ordo-inbox-attempts"
	HeaderDeadConsumer = "x-ordo-inbox-consumer"
)

// ErrInvalidMessage is returned (wrapped) by FromDelivery when a delivery
// lacks a correlation id, a usable x-ordo-key-seq, x-ordo-prev-key-seq or
// x-ordo-partition. The consumer dead-letters such a message and counts it.
var ErrInvalidMessage = errors.New("not an Ordo message")

// Message is one delivery as the inbox sees it: the ordering fields parsed
// from the AMQP properties and headers, and the rest carried through to the
// handler. A Message read back from the inbox table (a stored gap or a
// retry) has the same fields; its Headers come from JSON, so numbers there
// are float64: use the typed fields for the Ordo headers.
type Message struct {
	ID            string     // AMQP message-id
	CorrelationID string     // the ordering key
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
	var err error
	if m.KeySeq, err = intHeader(d.Headers, HeaderKeySeq); err != nil {
		return nil, fmt.Errorf("message %q: %w", d.MessageId, err)
	}
	if m.PrevKeySeq, err = intHeader(d.Headers, HeaderPrevKeySeq); err != nil {
		return nil, fmt.Errorf("message %q: %w", d.MessageId, err)
	}
	p, err := intHeader(d.Headers, HeaderPartition)
	if err != nil {
		return nil, fmt.Errorf("message %q: %w", d.MessageId, err)
	}
	m.Partition = int(p)
	if m.KeySeq < 1 || m.PrevKeySeq < 0 || m.PrevKeySeq >= m.KeySeq || p < 0 || p > math.MaxInt32 {
		return nil, fmt.Errorf("message %q: key_seq %d, prev %d, partition %d out of range: %w",
			d.MessageId, m.KeySeq, m.PrevKeySeq, p, ErrInvalidMessage)
	}
	return m, nil
}

// intHeader reads an integer header of any AMQP integer type (another
// language's client may send a different width than Ordo does).
func intHeader(h amqp.Table, name string) (int64, error) {
	v, ok := h[name]
	if !ok {
		return 0, fmt.Errorf("no %s header: %w", name, ErrInvalidMessage)
	}
	switch x := v.(type) {
	case int64:
		return x, nil
	case int32:
		return int64(x), nil
	case int16:
		return int64(x), nil
	case int8:
		return int64(x), nil
	case int:
		return int64(x), nil
	case uint8:
		return int64(x), nil
	case uint16:
		return int64(x), nil
	case uint32:
		return int64(x), nil
	default:
		return 0, fmt.Errorf("header %s has type %T, want an integer: %w", name, v, ErrInvalidMessage)
	}
}
