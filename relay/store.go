package relay

import (
	"context"
	"time"

	"github.com/google/uuid"
)

// Row is one pending outbox row as the relay reads it.
type Row struct {
	ID            uuid.UUID
	Partition     int
	CorrelationID string
	KeySeq        int64
	PrevKeySeq    int64
	Exchange      string
	RoutingKey    string
	Type          string
	Payload       []byte
	Headers       []byte // JSON object
	OccurredAt    time.Time
	Attempts      int
	// PrevDead: the row just below is dead (skipped), so PrevKeySeq must
	// be looked up with Store.PrevKeySeq.
	PrevDead bool
}

// Settled identifies a published row for a relay write: the row, its
// partition, and the lease epoch it was published under.
type Settled struct {
	ID        uuid.UUID
	Partition int
	Epoch     int64
	Err       string        // the failure, for RecordFailures
	Delay     time.Duration // wait before the next attempt, for RecordFailures
}

// Store is the relay's view of the outbox. Every write checks, in its own
// transaction, that node still holds each row's partition at the epoch the
// row was published under (DESIGN.md invariant 3). Implementations are safe
// for concurrent use.
type Store interface {
	// ReadHeads returns up to limit pending rows of the given partitions in
	// seq order, leaving out the rows in exclude and every row that has
	// perKey or more pending rows of its key below it (perKey 1: key heads
	// only).
	ReadHeads(ctx context.Context, partitions []int32, exclude []uuid.UUID, perKey, limit int) ([]Row, error)
	// MarkPublished marks rows processed and returns the ids it marked.
	// Rows whose lease is no longer held at their epoch are left pending.
	MarkPublished(ctx context.Context, node string, rows []Settled) ([]uuid.UUID, error)
	// RecordFailures adds one attempt, the error text and the time of the
	// next attempt (now + Delay) to each row whose lease is still held, and
	// parks the rows that have now failed maxAttempts times. It returns the
	// ids it parked.
	RecordFailures(ctx context.Context, node string, rows []Settled, maxAttempts int) ([]uuid.UUID, error)
	// PrevKeySeq returns the highest key_seq of key below keySeq that is
	// not dead, or 0.
	PrevKeySeq(ctx context.Context, key string, keySeq int64) (int64, error)
	// DeleteProcessed deletes up to limit processed, not dead, rows of
	// partition processed more than olderThan ago (by the database's
	// clock), if node holds the partition at epoch, and returns how many it
	// deleted.
	DeleteProcessed(ctx context.Context, node string, partition int, epoch int64, olderThan time.Duration, limit int) (int64, error)
	// Listen calls wake with the partition of every outbox notification
	// until ctx ends, re-listening after every reconnect and calling wake
	// with partition -1 (any) once after each
	// (re)connect, so a notification missed while down costs one poll.
	Listen(ctx context.Context, wake func(partition int)) error
}
