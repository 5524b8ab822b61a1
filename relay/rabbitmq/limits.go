package rabbitmq

import (
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ordo-relay/ordo/relay"
)

// ErrUnsendable is the Err of a Failed result for a message AMQP cannot
// carry (a header name over 255 bytes, a header value or payload over the
// limits below, headers and properties that do not fit one frame of the
// negotiated frame_max); it was not sent.
var ErrUnsendable = errors.New("message cannot be sent over AMQP")

// Limits below the broker's defaults (frame_max 128 KiB for all headers
// together, max_message_size 16 MiB on RabbitMQ 4).
const (
	maxHeaderBytes  = 64 << 10
	maxPayloadBytes = 16 << 20
)

// frameOverhead is what a frame adds to its payload: type, channel and
// size (7 bytes) and the frame-end octet. frame_max counts it.
const frameOverhead = 8

// checkSendable refuses what the AMQP client or the broker would reject
// by closing the channel or the connection.
func checkSendable(m *relay.Message) error {
	for k, v := range m.Headers {
		if len(k) > 255 {
			return fmt.Errorf("header name of %d bytes (AMQP allows 255)", len(k))
		}
		if s, ok := v.(string); ok && len(s) > maxHeaderBytes {
			return fmt.Errorf("header %q of %d bytes (at most %d)", k, len(s), maxHeaderBytes)
		}
	}
	if len(m.Payload) > maxPayloadBytes {
		return fmt.Errorf("payload of %d bytes (at most %d)", len(m.Payload), maxPayloadBytes)
	}
	return nil
}

// checkFrame refuses a message whose content header frame (its properties
// and headers, encoded) would exceed frameMax, the frame_max negotiated
// with the broker: RabbitMQ answers such a frame by closing the whole
// connection (FRAME_ERROR, frame_too_large), with every other message in
// flight on it. frameMax 0 means no limit.
func checkFrame(pub *amqp.Publishing, frameMax int) error {
	if frameMax <= 0 {
		return nil
	}
	size, err := headerFrameSize(pub)
	if err != nil {
		return err
	}
	if size+frameOverhead > frameMax {
		return fmt.Errorf("headers and properties take %d bytes encoded, more than one frame holds (frame_max %d)", size+frameOverhead, frameMax)
	}
	return nil
}

// headerFrameSize returns the size of the content header frame's payload
// for pub: class id, weight, body size, property flags and the properties
// amqp091-go sends (it leaves out empty ones).
func headerFrameSize(pub *amqp.Publishing) (int, error) {
	n := 2 + 2 + 8 + 2
	for _, s := range []string{pub.ContentType, pub.ContentEncoding, pub.CorrelationId, pub.ReplyTo,
		pub.Expiration, pub.MessageId, pub.Type, pub.UserId, pub.AppId} {
		if s != "" {
			n += 1 + len(s)
		}
	}
	if len(pub.Headers) > 0 {
		t, err := tableSize(pub.Headers)
		if err != nil {
			return 0, err
		}
		n += 4 + t
	}
	if pub.DeliveryMode != 0 {
		n++
	}
	if pub.Priority != 0 {
		n++
	}
	if !pub.Timestamp.IsZero() {
		n += 8
	}
	return n, nil
}

// tableSize is the encoded size of an AMQP field table's entries.
func tableSize(t amqp.Table) (int, error) {
	n := 0
	for k, v := range t {
		f, err := fieldSize(v)
		if err != nil {
			return 0, fmt.Errorf("header %q: %w", k, err)
		}
		n += 1 + len(k) + f
	}
	return n, nil
}

// fieldSize is the encoded size of one field value, its type octet
// included, as amqp091-go writes it.
func fieldSize(v any) (int, error) {
	switch v := v.(type) {
	case nil:
		return 1, nil
	case bool, byte, int8:
		return 2, nil
	case int16, uint16:
		return 3, nil
	case int, int32, uint32, float32:
		return 5, nil
	case int64, float64, time.Time:
		return 9, nil
	case amqp.Decimal:
		return 6, nil
	case string:
		return 5 + len(v), nil
	case []byte:
		return 5 + len(v), nil
	case []any:
		n := 5
		for _, x := range v {
			f, err := fieldSize(x)
			if err != nil {
				return 0, err
			}
			n += f
		}
		return n, nil
	case amqp.Table:
		t, err := tableSize(v)
		return 5 + t, err
	}
	return 0, fmt.Errorf("value of type %T cannot be sent over AMQP", v)
}
