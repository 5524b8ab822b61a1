package outbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"

	"github.com/ordo-relay/ordo/wire"
)

// MaxNameBytes is the longest correlation id, exchange, routing key, type or
// header name, in bytes: an AMQP short string.
const MaxNameBytes = 255

// MaxHeaderFrameBytes is the most bytes a message's AMQP content header
// frame may take: its properties and every header, Ordo's own included,
// encoded. It is RabbitMQ's default frame_max (128 KiB); the broker closes
// the whole connection over a bigger frame, so Enqueue refuses a message
// whose headers would not fit. (A broker configured with a smaller
// frame_max is checked by the relay, which parks such a message.)
const MaxHeaderFrameBytes = 128 << 10

// MaxHeaderValueBytes is the longest string header value, in bytes.
const MaxHeaderValueBytes = 64 << 10

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

// validate checks m and returns its headers in their stored form.
func (m *Message) validate(i int) (headers []byte, err error) {
	bad := func(field, reason string) error {
		return &MessageError{Index: i, Field: field, Reason: reason}
	}
	if field, reason := m.checkNames(); reason != "" {
		return nil, bad(field, reason)
	}
	switch {
	case len(m.Payload) == 0:
		return nil, bad("Payload", "is required")
	case !json.Valid(m.Payload):
		return nil, bad("Payload", "is not valid JSON")
	}
	for k, v := range m.Headers {
		if field, reason := checkHeader(k, v); reason != "" {
			return nil, bad(field, reason)
		}
	}
	if size := m.headerFrameBytes(); size > MaxHeaderFrameBytes {
		return nil, bad("Headers", fmt.Sprintf("with the message's properties they take %d bytes encoded as AMQP, more than one frame holds (%d, RabbitMQ's default frame_max)", size, MaxHeaderFrameBytes))
	}
	if len(m.Headers) == 0 {
		return []byte("{}"), nil
	}
	headers, err = json.Marshal(m.Headers)
	if err != nil {
		return nil, bad("Headers", err.Error())
	}
	return headers, nil
}

// checkNames checks the AMQP short strings of m: the field at fault and
// why, or an empty reason.
func (m *Message) checkNames() (field, reason string) {
	for _, f := range []struct {
		name, value string
		required    bool
	}{
		{"CorrelationID", m.CorrelationID, true},
		{"Exchange", m.Exchange, false},
		{"RoutingKey", m.RoutingKey, false},
		{"Type", m.Type, true},
	} {
		switch {
		case f.required && f.value == "":
			return f.name, "is required"
		case len(f.value) > MaxNameBytes:
			return f.name, fmt.Sprintf("is %d bytes long, the limit is %d", len(f.value), MaxNameBytes)
		case strings.IndexByte(f.value, 0) >= 0:
			return f.name, "contains a NUL byte"
		}
	}
	return "", ""
}

// checkHeader checks one header's name and value: the field at fault and
// why, or an empty reason.
func checkHeader(k string, v any) (field, reason string) {
	field = "Headers[" + k + "]"
	switch {
	case k == "":
		return "Headers", "a header name is empty"
	case len(k) > MaxNameBytes:
		return field, fmt.Sprintf("name is %d bytes long, the limit is %d", len(k), MaxNameBytes)
	case strings.HasPrefix(strings.ToLower(k), wire.ReservedPrefix):
		return field, fmt.Sprintf("the %q prefix is reserved for headers Ordo sets", wire.ReservedPrefix)
	}
	return field, checkHeaderValue(v)
}

// checkHeaderValue says why v cannot be an AMQP header value, or returns
// an empty string when it can.
func checkHeaderValue(v any) string {
	const notInt64 = "unsigned value %d does not fit an AMQP signed 64-bit integer"
	const notFinite = "value %v is not a finite number"
	switch v := v.(type) {
	case string:
		if len(v) > MaxHeaderValueBytes {
			return fmt.Sprintf("value is %d bytes long, the limit is %d", len(v), MaxHeaderValueBytes)
		}
	case bool, int, int8, int16, int32, int64, uint8, uint16, uint32:
	case uint:
		if uint64(v) > math.MaxInt64 {
			return fmt.Sprintf(notInt64, v)
		}
	case uint64:
		if v > math.MaxInt64 {
			return fmt.Sprintf(notInt64, v)
		}
	case float32:
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return fmt.Sprintf(notFinite, v)
		}
	case float64:
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return fmt.Sprintf(notFinite, v)
		}
	case json.Number:
		if _, err := v.Float64(); err != nil {
			return fmt.Sprintf("value %q is not a number", string(v))
		}
	default:
		return fmt.Sprintf("value of type %T is not allowed (use a string, number or boolean)", v)
	}
	return ""
}

// ordoHeadersBytes is what the headers Ordo adds take encoded (name length
// octet, name, type octet, value): x-ordo-key-seq, x-ordo-prev-key-seq,
// x-ordo-epoch and x-ordo-attempt as 64-bit integers, x-ordo-partition as
// a 32-bit one.
const ordoHeadersBytes = (1 + 14 + 9) + (1 + 19 + 9) + (1 + 12 + 9) + (1 + 14 + 9) + (1 + 16 + 5)

// headerFrameBytes returns the size of the content header frame the relay
// will send for m (a validated message): frame overhead, class, weight,
// body size, property flags, the properties it sets (content type,
// delivery mode, correlation id, message id, timestamp, type) and the
// header table. Integers go out as 64-bit values, and so do floats.
func (m *Message) headerFrameBytes() int {
	n := 8 + 2 + 2 + 8 + 2
	n += 1 + len("application/json") + 1 + (1 + len(m.CorrelationID)) + (1 + 36) + 8 + (1 + len(m.Type))
	n += 4 + ordoHeadersBytes
	for k, v := range m.Headers {
		n += 1 + len(k)
		switch v := v.(type) {
		case string:
			n += 5 + len(v)
		case bool:
			n += 2
		default: // a number
			n += 9
		}
	}
	return n
}
