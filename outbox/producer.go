package outbox

import (
	"context"
	"errors"
	"fmt"
	"sort"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/ordo-relay/ordo/partition"
)

// Execer runs a statement. pgx.Tx satisfies it; Enqueue is meant to be
// called with the caller's transaction so the messages commit with the
// business rows.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// ErrKeyPartition is returned (wrapped, with the database's error naming
// both partitions) by Enqueue when the database refuses a row because its
// correlation id's earlier rows are in another partition: another producer
// wrote the key's first row with a wrong partition (see
// docs/outbox-table.md, "One key, one partition"). Nothing is written.
var ErrKeyPartition = errors.New("correlation id's earlier rows are in another partition")

// constraintKeyPartition names the trigger's check that a key keeps its
// partition (migration 0007).
const constraintKeyPartition = "outbox_key_partition"

// Producer writes messages to the outbox. It is safe for concurrent use.
type Producer struct {
	partitions int
}

// NewProducer returns a Producer for an outbox installed with the given
// partition count (see LoadPartitions).
func NewProducer(partitions int) (*Producer, error) {
	if err := partition.ValidateCount(partitions); err != nil {
		return nil, err
	}
	return &Producer{partitions: partitions}, nil
}

// Partitions returns the partition count the producer hashes into.
func (p *Producer) Partitions() int { return p.partitions }

// Enqueue validates msgs and inserts them, in order, through tx. Each gets a
// new UUIDv7 id (returned in the same order) and its partition; the database
// assigns key_seq and occurred_at. If any message is invalid nothing is
// written and the error is a *MessageError. Messages of one correlation id
// within one call get consecutive key_seq in slice order. Rows are inserted
// grouped by key (so concurrent calls over the same keys cannot deadlock);
// seq follows that insert order.
//
// When ctx carries a span context (an OpenTelemetry span, or a remote
// parent extracted from a request), each message without a traceparent
// header of its own gets the W3C traceparent and tracestate headers of
// that context, so the relay and the consumer continue its trace.
func (p *Producer) Enqueue(ctx context.Context, tx Execer, msgs ...Message) ([]uuid.UUID, error) {
	if len(msgs) == 0 {
		return nil, nil
	}
	ids, args, err := p.rows(ctx, msgs)
	if err != nil {
		return nil, err
	}
	if _, err := tx.Exec(ctx, sqlEnqueue, args...); err != nil {
		return nil, EnqueueError(len(msgs), err)
	}
	return ids, nil
}

// Queue validates msgs and queues their INSERT, the one Enqueue runs, on
// b: the rows are written when b is sent, in the transaction b runs in
// (begun by b.BeginTx or the caller's), so business rows and messages can
// reach the database in one round trip. It returns the ids as Enqueue
// does; if any message is invalid nothing is queued and the error is a
// *MessageError. The INSERT's own error comes from sending b: pass it
// through EnqueueError to get Enqueue's errors (ErrKeyPartition).
func (p *Producer) Queue(ctx context.Context, b *pgx.Batch, msgs ...Message) ([]uuid.UUID, error) {
	if len(msgs) == 0 {
		return nil, nil
	}
	ids, args, err := p.rows(ctx, msgs)
	if err != nil {
		return nil, err
	}
	b.Queue(sqlEnqueue, args...)
	return ids, nil
}

// EnqueueError wraps err, the database's error for an INSERT of n
// messages, as Enqueue returns it: with ErrKeyPartition when the database
// refused a row whose key's earlier rows are in another partition.
func EnqueueError(n int, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.ConstraintName == constraintKeyPartition {
		return fmt.Errorf("outbox: enqueue %d message(s): %w: %w", n, ErrKeyPartition, err)
	}
	return fmt.Errorf("outbox: enqueue %d message(s): %w", n, err)
}

// rows validates msgs and returns their ids in the caller's order and
// sqlEnqueue's arguments, the rows sorted by key.
func (p *Producer) rows(ctx context.Context, msgs []Message) ([]uuid.UUID, []any, error) {
	n := len(msgs)
	var (
		ids        = make([]uuid.UUID, n) // in the caller's order
		rowIDs     = make([]uuid.UUID, n) // in insert order
		partitions = make([]int32, n)
		keys       = make([]string, n)
		exchanges  = make([]string, n)
		routing    = make([]string, n)
		types      = make([]string, n)
		payloads   = make([]string, n)
		headers    = make([]string, n)
	)
	// Rows are inserted sorted by key (stably, so each key keeps the
	// caller's order): two transactions enqueueing the same keys then take
	// the keys' counter locks in the same order and cannot deadlock.
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool { return msgs[order[a]].CorrelationID < msgs[order[b]].CorrelationID })
	trace := traceHeaders(ctx)
	for j, i := range order {
		m := &msgs[i]
		if trace != nil {
			m = withTrace(m, trace)
		}
		h, err := m.validate(i)
		if err != nil {
			return nil, nil, err
		}
		id, err := uuid.NewV7()
		if err != nil {
			return nil, nil, fmt.Errorf("outbox: new message id: %w", err)
		}
		ids[i] = id
		rowIDs[j] = id
		partitions[j] = int32(partition.Of(m.CorrelationID, p.partitions))
		keys[j], exchanges[j], routing[j], types[j] = m.CorrelationID, m.Exchange, m.RoutingKey, m.Type
		payloads[j], headers[j] = string(m.Payload), string(h)
	}
	return ids, []any{rowIDs, partitions, keys, exchanges, routing, types, payloads, headers}, nil
}
