package outbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
)

// MaxNameBytes is the longest correlation id, exchange, routing key, type or
// header name, in bytes: an AMQP short string.
const MaxNameBytes = 255

// ReservedHeaderPrefix starts the headers Ordo sets itself on every
// published message (x-ordo-key-seq, x-ordo-prev-key-seq, x-ordo-partition,
// x-ordo-epoch). Producers may not set headers with this prefix.
const ReservedHeaderPrefix = "x-ordo-"

// Message is one outgoing message as a producer describes it.
type Message struct {
	// CorrelationID is the ordering key (the aggregate id): messages with the
	// same CorrelationID are published in the order their transactions
	// committed. Required, 1 to 255 bytes of UTF-8.
	CorrelationID string
	// Exchange is the RabbitMQ exchange to publish to; empty means the
	// default exchange. At most 255 bytes.
	Exchange string
	// RoutingKey is the AMQP routing key. At most 255 bytes.
	RoutingKey string
	// Type is the AMQP type property, e.g. "bookstore.order-placed.v1".
	// Required, at most 255 bytes.
	Type string
	// Payload is the JSON body. Required; it must be valid JSON.
	Payload json.RawMessage
	// Headers are extra AMQP headers, such as traceparent. Values must be
	// strings, booleans, integers, finite floats or json.Number.
	Headers map[string]any
}

// ErrInvalidMessage is returned (wrapped in a *MessageError) by Enqueue for a
// message that breaks the contract. Nothing is written.
var ErrInvalidMessage = errors.New("invalid outbox message")

// MessageError says which message and field are wrong.
type MessageError struct {
	Index  int    // position of the message in the Enqueue call
	Field  string // e.g. "CorrelationID", "Headers[traceparent]"
	Reason string
}

func (e *MessageError) Error() string {
	return fmt.Sprintf("outbox message %d: %s: %s", e.Index, e.Field, e.Reason)
}

func (e *MessageError) Unwrap() error { return ErrInvalidMessage }

// validate checks m and returns its payload and headers in their stored form.
func (m *Message) validate(i int) (headers []byte, err error) {
	bad := func(field, format string, args ...any) error {
		return &MessageError{Index: i, Field: field, Reason: fmt.Sprintf(format, args...)}
	}
	for _, f := range []struct {
		name, value string
		required    bool
	}{
		{"CorrelationID", m.CorrelationID, true},
		{"Exchange", m.Exchange, false},
		{"RoutingKey", m.RoutingKey, false},
		{"Type", m.Type, true},
	} {
		if f.required && f.value == "" {
			return nil, bad(f.name, "is required")
		}
		if len(f.value) > MaxNameBytes {
			return nil, bad(f.name, "is %d bytes long, the limit is %d", len(f.value), MaxNameBytes)
		}
		if strings.IndexByte(f.value, 0) >= 0 {
			return nil, bad(f.name, "contains a NUL byte")
		}
	}
	if len(m.Payload) == 0 {
		return nil, bad("Payload", "is required")
	}
	if !json.Valid(m.Payload) {
		return nil, bad("Payload", "is not valid JSON")
	}
	for k, v := range m.Headers {
		field := "Headers[" + k + "]"
		switch {
		case k == "":
			return nil, bad("Headers", "a header name is empty")
		case len(k) > MaxNameBytes:
			return nil, bad(field, "name is %d bytes long, the limit is %d", len(k), MaxNameBytes)
		case strings.HasPrefix(strings.ToLower(k), ReservedHeaderPrefix):
			return nil, bad(field, "the %q prefix is reserved for headers Ordo sets", ReservedHeaderPrefix)
		}
		switch v := v.(type) {
		case string, bool, int, int8, int16, int32, int64, uint8, uint16, uint32:
		case uint:
			if uint64(v) > math.MaxInt64 {
				return nil, bad(field, "unsigned value %d does not fit an AMQP signed 64-bit integer", v)
			}
		case uint64:
			if v > math.MaxInt64 {
				return nil, bad(field, "unsigned value %d does not fit an AMQP signed 64-bit integer", v)
			}
		case float32:
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
				return nil, bad(field, "value %v is not a finite number", v)
			}
		case float64:
			if math.IsNaN(v) || math.IsInf(v, 0) {
				return nil, bad(field, "value %v is not a finite number", v)
			}
		case json.Number:
			if _, err := v.Float64(); err != nil {
				return nil, bad(field, "value %q is not a number", string(v))
			}
		default:
			return nil, bad(field, "value of type %T is not allowed (use a string, number or boolean)", v)
		}
	}
	if len(m.Headers) == 0 {
		return []byte("{}"), nil
	}
	headers, err = json.Marshal(m.Headers)
	if err != nil {
		return nil, bad("Headers", "%v", err)
	}
	return headers, nil
}
