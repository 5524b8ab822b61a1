package relay

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
)

// Message is one outbox row as it is published.
type Message struct {
	ID            uuid.UUID
	Partition     int
	Epoch         int64
	CorrelationID string
	KeySeq        int64
	PrevKeySeq    int64
	Exchange      string
	RoutingKey    string
	Type          string
	Payload       []byte
	Headers       map[string]any // the row's own headers, already decoded
	OccurredAt    time.Time
	// Source names the outbox database the row was read from; a
	// publisher sends it as wire.HeaderSource when it is not empty (the
	// node sets it for every source). Empty sends no header, which a
	// consumer reads as wire.DefaultSource.
	Source string
	// Deadline is the local deadline of the lease m is published under
	// (Lease.Deadline, as the relay last checked it): the publisher must
	// not write m to the broker after it. Zero: no deadline.
	Deadline time.Time
}

// Expired reports whether m's Deadline has passed at now.
func (m *Message) Expired(now time.Time) bool {
	return !m.Deadline.IsZero() && !now.Before(m.Deadline)
}

// Outcome is what became of one publish.
type Outcome int

const (
	// Confirmed: the broker acked the message and did not return it.
	Confirmed Outcome = iota
	// Nacked: the broker nacked the message.
	Nacked
	// Returned: the broker returned the message as unroutable (mandatory).
	Returned
	// Failed: the message could not be sent for a reason of its own, such
	// as a missing exchange.
	Failed
	// Unsent: the channel or connection went away before an outcome was
	// known. The message may or may not have reached the broker; it is not
	// its fault, so it is retried without counting an attempt.
	Unsent
)

func (o Outcome) String() string {
	switch o {
	case Confirmed:
		return "confirmed"
	case Nacked:
		return "nacked"
	case Returned:
		return "returned"
	case Failed:
		return "failed"
	case Unsent:
		return "unsent"
	}
	return fmt.Sprintf("outcome(%d)", int(o))
}

// Result is the outcome of one publish, with the reason for any but
// Confirmed.
type Result struct {
	Outcome Outcome
	Err     error
}

// Publisher sends messages to the broker with publisher confirms.
//
// Publish sends m with the mandatory flag and persistent delivery. If it
// returns nil, settle is called exactly once with m's outcome, from any
// goroutine, possibly before Publish returns; settle does not block. If it
// returns an error, m was not sent and settle is never called.
// Publish is called from one goroutine at a time.
//
// Publish never writes m after m.Deadline. It checks the deadline after
// every wait (for a lock, for the broker's answer, for earlier confirms)
// and right before it writes; a wait for the broker ends at the deadline.
// Past it, Publish returns an error wrapping ErrLeaseExpired. A write
// already under way when the deadline comes is cut off (the connection
// is reset), and m is settled Unsent or Publish returns that error.
//
// Connected reports whether the publisher has somewhere to publish now; the
// relay does not read while it is false. It is safe for concurrent use.
type Publisher interface {
	Publish(ctx context.Context, m *Message, settle func(Result)) error
	Connected() bool
}

// Flusher is implemented by a Publisher that may hold the messages of
// consecutive Publish calls in the connection and send them together
// (relay/rabbitmq corks its broker connection). The relay calls Flush when a
// round of publishes ends, before it waits for anything. Such a Publisher
// still sends what it holds on its own within a bounded time, and never
// lets a message reach the broker after its Deadline.
type Flusher interface {
	Flush()
}

// Flush flushes p if it is a Flusher. A Publisher that wraps another
// implements Flusher by calling Flush on the one it wraps.
func Flush(p Publisher) {
	if f, ok := p.(Flusher); ok {
		f.Flush()
	}
}

// ErrNotConnected is returned by Publish while the publisher has no open
// channel to the broker.
var ErrNotConnected = errors.New("relay: not connected to the broker")

// ErrLeaseExpired is returned (wrapped) by Publish when the message's
// Deadline passed before it could be written: it was not sent. It is not
// an attempt; the row stays pending for whoever holds the lease next.
var ErrLeaseExpired = errors.New("relay: the lease deadline passed before the publish")

// ErrExchangeNotFound is the Err of a Failed result whose exchange does not
// exist (checked with a passive declare).
var ErrExchangeNotFound = errors.New("exchange not found")
