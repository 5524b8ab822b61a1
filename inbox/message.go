package inbox

import (
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

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
// x-ordo-key-seq, x-ordo-prev-key-seq, x-ordo-partition), carries an
// x-ordo-source that is not a source name (wire.Source), or has text
// PostgreSQL cannot store (a NUL byte or invalid UTF-8 in its correlation
// id, message id, type, exchange, routing key, or a header's name or
// string value). Store.Handle returns it (wrapped) for such a Message,
// and when PostgreSQL refuses the message's own data (SQLSTATE class 22,
// e.g. a timestamp out of its range). The consumer dead-letters such a
// message as it came and counts it.
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
	if err := checkText(m); err != nil {
		return nil, fmt.Errorf("message %q: %w", d.MessageId, err)
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

// deliveryLaneKey is laneKey of a delivery not parsed yet, with the key
// FromDelivery resolves (the correlation id, else cloudEvents:subject);
// an invalid x-ordo-source gives the empty source (the delivery is
// dead-lettered).
func deliveryLaneKey(d *amqp.Delivery) string {
	source, _ := wire.Source(d.Headers)
	key := d.CorrelationId
	if key == "" {
		key, _ = d.Headers[wire.HeaderCloudEventsSubject].(string)
	}
	return laneKey(source, key)
}

// checkText returns an error wrapping ErrInvalidMessage when a text field
// of m, or a header's name or string value (nested tables and arrays
// included), is text PostgreSQL cannot store: a NUL byte or invalid UTF-8.
func checkText(m *Message) error {
	for _, f := range []struct{ name, v string }{
		{"correlation id", m.CorrelationID}, {"message id", m.ID}, {"type", m.Type},
		{"exchange", m.Exchange}, {"routing key", m.RoutingKey},
	} {
		if !storable(f.v) {
			return fmt.Errorf("%s %q: %w", f.name, f.v, errUnstorable)
		}
	}
	return checkHeaderText("header", m.Headers)
}

// errUnstorable wraps ErrInvalidMessage for text PostgreSQL cannot store.
var errUnstorable = fmt.Errorf("has a NUL byte or invalid UTF-8, which PostgreSQL cannot store: %w", ErrInvalidMessage)

func checkHeaderText(path string, v any) error {
	switch v := v.(type) {
	case string:
		if !storable(v) {
			return fmt.Errorf("%s value %q: %w", path, v, errUnstorable)
		}
	case amqp.Table:
		for k, e := range v {
			if !storable(k) {
				return fmt.Errorf("%s name %q: %w", path, k, errUnstorable)
			}
			if err := checkHeaderText(path+" "+k, e); err != nil {
				return err
			}
		}
	case map[string]any:
		return checkHeaderText(path, amqp.Table(v))
	case []any:
		for _, e := range v {
			if err := checkHeaderText(path, e); err != nil {
				return err
			}
		}
	}
	return nil
}

// storable reports whether PostgreSQL can store s as text.
func storable(s string) bool { return utf8.ValidString(s) && !strings.ContainsRune(s, 0) }

// storableText returns s with every NUL byte written as \x00 and every
// invalid UTF-8 byte replaced by U+FFFD, so PostgreSQL can store it: a
// handler's error text, say.
func storableText(s string) string {
	if storable(s) {
		return s
	}
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", `\x00`)
}
