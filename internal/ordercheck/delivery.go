package ordercheck

import (
	"fmt"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ordo-relay/ordo/wire"
)

// Delivery is one message as a consumer received it (a test's Checker, the bench, the demo), with Ordo's headers
// parsed by wire.Int. A header that is absent or not an integer leaves its
// field zero (and HasPrevKeySeq false for x-ordo-prev-key-seq).
type Delivery struct {
	MessageID     string
	CorrelationID string
	Type          string
	RoutingKey    string
	KeySeq        int64 // x-ordo-key-seq
	PrevKeySeq    int64 // x-ordo-prev-key-seq, when HasPrevKeySeq
	HasPrevKeySeq bool
	Partition     int   // x-ordo-partition
	Epoch         int64 // x-ordo-epoch
	Body          []byte
	Redelivered   bool
	Received      time.Time
}

// DeliveryFromAMQP converts an AMQP delivery, parsing Ordo's headers, and
// stamps it with the current time.
func DeliveryFromAMQP(d amqp.Delivery) Delivery {
	out := Delivery{
		MessageID:     d.MessageId,
		CorrelationID: d.CorrelationId,
		Type:          d.Type,
		RoutingKey:    d.RoutingKey,
		Body:          d.Body,
		Redelivered:   d.Redelivered,
		Received:      time.Now(),
	}
	out.KeySeq, _ = wire.Int(d.Headers, wire.HeaderKeySeq)
	prev, err := wire.Int(d.Headers, wire.HeaderPrevKeySeq)
	out.PrevKeySeq, out.HasPrevKeySeq = prev, err == nil
	p, _ := wire.Int(d.Headers, wire.HeaderPartition)
	out.Partition = int(p)
	out.Epoch, _ = wire.Int(d.Headers, wire.HeaderEpoch)
	return out
}

// Report summarises what a History (or a Checker) has seen. The bench
// writes it into its JSON results as is (bench/internal/result.Check).
type Report struct {
	Total        int      `json:"total"`                  // deliveries, redeliveries and duplicates included
	Distinct     int      `json:"distinct"`               // distinct message ids
	Duplicates   int      `json:"duplicates"`             // deliveries whose message id had been delivered before, not flagged redelivered: published again
	Redeliveries int      `json:"redeliveries,omitempty"` // deliveries whose message id had been delivered before, flagged redelivered by the broker
	Lost         int      `json:"lost"`                   // expected messages (History.Expect, ExpectEvent) never delivered
	Reorders     int      `json:"reorders"`               // first deliveries with a key_seq below the key's highest so far
	Gaps         int      `json:"gaps"`                   // first deliveries that skip a message of their key not skipped on purpose
	Keys         int      `json:"keys"`                   // distinct correlation ids
	LostIDs      []string `json:"lostIds,omitempty"`      // the first lost ids (key/type for an ExpectEvent), at most the History's cap, in Expect order
	Problems     []string `json:"problems,omitempty"`     // the first reorders and gaps, at most the History's cap, described
}

// String returns all counts on one line (redeliveries only when there are
// any).
func (r Report) String() string {
	s := fmt.Sprintf("total=%d distinct=%d duplicates=%d lost=%d reorders=%d gaps=%d keys=%d",
		r.Total, r.Distinct, r.Duplicates, r.Lost, r.Reorders, r.Gaps, r.Keys)
	if r.Redeliveries > 0 {
		s += fmt.Sprintf(" redeliveries=%d", r.Redeliveries)
	}
	return s
}

// Detail returns String followed by the lost ids and the problems, one per
// line, for failure messages.
func (r Report) Detail() string {
	var b strings.Builder
	b.WriteString(r.String())
	if len(r.LostIDs) > 0 {
		fmt.Fprintf(&b, "\nlost ids (first %d): %s", len(r.LostIDs), strings.Join(r.LostIDs, " "))
	}
	for _, p := range r.Problems {
		b.WriteString("\n  ")
		b.WriteString(p)
	}
	return b.String()
}

// OK reports whether nothing was lost, reordered or skipped. Duplicates are
// allowed: delivery is at least once.
func (r Report) OK() bool { return r.Lost == 0 && r.Reorders == 0 && r.Gaps == 0 }
