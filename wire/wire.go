// Package wire is Ordo's message contract on the broker: the AMQP headers
// the relay sets on every message it publishes, and their parsing. The
// relay, the inbox, the test kit, the bench and the demo all use it, so a
// header is named, typed and read in one place. It imports nothing outside
// the standard library, and takes an AMQP table as the map it is
// (amqp091-go's Table is a map[string]any).
//
// Besides the headers below, a message carries its outbox row's id as the
// AMQP message-id, its ordering key as the correlation-id, its type as the
// AMQP type and its occurred_at as the timestamp. docs/consumer.md ("The
// headers the inbox reads") is the contract as a consumer sees it;
// docs/outbox-table.md says which row columns they come from.
package wire

import (
	"errors"
	"fmt"
	"math"
)

// ReservedPrefix starts every header Ordo sets itself. A producer may not
// set headers with it (outbox.Enqueue refuses them, case-insensitively).
const ReservedPrefix = "x-ordo-"

// The headers the relay sets on every message.
const (
	// HeaderKeySeq is the message's position in its key's sequence: 1, 2,
	// 3, ... per correlation id, with no gaps unless the producer skipped
	// one (an integer; Ordo sends int64).
	HeaderKeySeq = "x-ordo-key-seq"
	// HeaderPrevKeySeq is the key_seq of the key's previous message that
	// the producer did not skip, 0 for the first (int64). A consumer that
	// has handled PrevKeySeq may handle this one.
	HeaderPrevKeySeq = "x-ordo-prev-key-seq"
	// HeaderPartition is the key's partition, 0 to partitions-1 (int32):
	// the inbox binds its shard queues on it.
	HeaderPartition = "x-ordo-partition"
	// HeaderEpoch is the lease epoch of the partition the message was
	// published under (int64); it rises at every change of owner.
	HeaderEpoch = "x-ordo-epoch"
	// HeaderAttempt is a number unique to one publish among the publishing
	// node's publishes, not an attempt count (int64). The broker echoes it
	// in a basic.return, which is how a return is matched to the publish it
	// answers. Consumers may ignore it.
	HeaderAttempt = "x-ordo-attempt"
	// HeaderSource names the outbox database (the source) the message was
	// read from (a string that passes ValidateSource). The relay sets it
	// once it serves several sources (docs/design.md, "Sources"); the
	// inbox reads it already. Keys, and so
	// key_seq, are per source: a consumer keeps its state per (source,
	// correlation id). A message without it belongs to DefaultSource, so
	// messages published before sources existed keep their meaning.
	HeaderSource = "x-ordo-source"
)

// CloudEvents (https://cloudevents.io), AMQP protocol binding 1.0, binary
// content mode: a node run with -cloudevents adds these headers beside the
// Ordo ones, and the inbox reads id, type and subject when the AMQP
// properties are empty. In AMQP 0-9-1 the binding's application properties
// are the message headers.
const (
	// CloudEventsPrefix prefixes the header of every CloudEvents attribute.
	CloudEventsPrefix = "cloudEvents:"

	HeaderCloudEventsSpecVersion = CloudEventsPrefix + "specversion" // CloudEventsSpecVersion
	HeaderCloudEventsID          = CloudEventsPrefix + "id"          // the message id
	HeaderCloudEventsSource      = CloudEventsPrefix + "source"      // the node's -cloudevents-source
	HeaderCloudEventsType        = CloudEventsPrefix + "type"        // the row's type
	HeaderCloudEventsTime        = CloudEventsPrefix + "time"        // occurred_at, RFC 3339
	HeaderCloudEventsSubject     = CloudEventsPrefix + "subject"     // the correlation id

	// CloudEventsSpecVersion is the CloudEvents version the headers follow.
	CloudEventsSpecVersion = "1.0"
)

// ErrNoHeader is returned (wrapped) when a header is absent.
var ErrNoHeader = errors.New("header absent")

// ErrNotInteger is returned (wrapped) when a header that must be an
// integer holds another type, a string or a float among them.
var ErrNotInteger = errors.New("header not an integer")

// ErrOutOfRange is returned (wrapped) by ParseOrder when the ordering
// headers are integers but not a possible combination.
var ErrOutOfRange = errors.New("header out of range")

// Int returns header name of h as an int64. Every integer width is
// accepted, signed or unsigned (another language's client may send a
// different width than Ordo does); a uint64 or uint above MaxInt64, and
// every other type, return an error wrapping ErrNotInteger. An absent
// header returns an error wrapping ErrNoHeader.
func Int(h map[string]any, name string) (int64, error) {
	v, ok := h[name]
	if !ok {
		return 0, fmt.Errorf("%s: %w", name, ErrNoHeader)
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
	case uint64:
		if x <= math.MaxInt64 {
			return int64(x), nil
		}
	case uint:
		if uint64(x) <= math.MaxInt64 {
			return int64(x), nil
		}
	}
	return 0, fmt.Errorf("%s is a %T: %w", name, v, ErrNotInteger)
}

// Order is the ordering a message carries in its headers.
type Order struct {
	KeySeq     int64 // HeaderKeySeq, at least 1
	PrevKeySeq int64 // HeaderPrevKeySeq, 0 <= PrevKeySeq < KeySeq
	Partition  int   // HeaderPartition, 0 <= Partition <= MaxInt32
}

// ParseOrder reads HeaderKeySeq, HeaderPrevKeySeq and HeaderPartition from
// h. It returns an error wrapping ErrNoHeader or ErrNotInteger (from Int)
// when one is missing or not an integer, and one wrapping ErrOutOfRange
// when they are not a possible combination.
func ParseOrder(h map[string]any) (Order, error) {
	var o Order
	var err error
	if o.KeySeq, err = Int(h, HeaderKeySeq); err != nil {
		return Order{}, err
	}
	if o.PrevKeySeq, err = Int(h, HeaderPrevKeySeq); err != nil {
		return Order{}, err
	}
	p, err := Int(h, HeaderPartition)
	if err != nil {
		return Order{}, err
	}
	if o.KeySeq < 1 || o.PrevKeySeq < 0 || o.PrevKeySeq >= o.KeySeq || p < 0 || p > math.MaxInt32 {
		return Order{}, fmt.Errorf("key_seq %d, prev %d, partition %d: %w", o.KeySeq, o.PrevKeySeq, p, ErrOutOfRange)
	}
	o.Partition = int(p)
	return o, nil
}
