package relay

import (
	"context"
	"errors"
	"time"

	"github.com/google/uuid"
)

// Row is one pending outbox row as the relay reads it.
type Row struct {
	ID            uuid.UUID
	Partition     int
	Seq           int64
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
	// Parked: the row failed MaxAttempts times and waits for an operator.
	// The relay sets it when RecordFailures parks the row: a read does
	// not return parked rows.
	Parked bool
	// NextAttemptAt, when set, is the earliest time the row may be
	// published again after a failure.
	NextAttemptAt time.Time
	// PrevPending: the row just below (key_seq - 1, same key) was pending
	// when the row was read, so this row must wait for it.
	PrevPending bool
	// PrevDead: the row just below is dead (skipped), so PrevKeySeq must
	// be looked up with Store.PrevKeySeq.
	PrevDead bool
	// BehindParked: a row below it in its key is parked, so it cannot go
	// before an operator acts on that row. It comes without Payload and
	// Headers, and the relay does not keep it.
	BehindParked bool
}

// ErrNoConnection is wrapped by the error of a Store operation that did
// not run because no database connection could be had in time (its
// context ended while it waited for one). A read that timed out so says
// nothing of the rows it asked for: the relay backs off instead of
// splitting it (docs/design.md, "A slow row is read alone"), since a
// server slow to take connections (restarting, overloaded) would
// otherwise have every partition read alone, each read of it waiting
// for a connection in turn.
var ErrNoConnection = errors.New("no database connection in time")

// Cursor asks for one partition's pending rows whose seq is above After.
type Cursor struct {
	Partition int
	After     int64
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

// SettledColumns returns rows as the columns a Store's write passes to
// its database as arrays: ids, partitions, epochs, errors and delays (in
// seconds). Ids are [16]byte values, which pgx encodes in binary
// directly; for uuid.UUID it first tries and fails other encodings,
// which cost about a quarter of the node's CPU in a drain. Never nil: a
// NULL array would match no row.
func SettledColumns(rows []Settled) (ids [][16]byte, parts []int32, epochs []int64, errs []string, delays []float64) {
	ids = make([][16]byte, len(rows))
	parts = make([]int32, len(rows))
	epochs = make([]int64, len(rows))
	errs = make([]string, len(rows))
	delays = make([]float64, len(rows))
	for i, r := range rows {
		ids[i], parts[i], epochs[i], errs[i], delays[i] = r.ID, int32(r.Partition), r.Epoch, r.Err, r.Delay.Seconds()
	}
	return ids, parts, epochs, errs, delays
}

// Store is the relay's view of the outbox, in three concerns: the hot
// path (Outbox), Retention, and Notifications. A Store is bound to one
// node at construction, the lease owner every write is checked against;
// it must be the relay's Config.Node. Implementations are safe for
// concurrent use. relaytest.StoreSuite states the contract as tests.
type Store interface {
	Outbox
	Retention
	Notifications
}

// Outbox is the relay's hot path: reading pending rows, writing what
// became of the published ones, and the dead-row lookup a publish may
// need. Every write checks, in its own transaction, that the Store's node
// still holds each row's partition at the epoch the row was published
// under (docs/design.md, invariant 3).
type Outbox interface {
	// ReadPending returns, for each cursor, up to limit pending rows of its
	// partition whose seq is above After, in seq order, each with
	// PrevPending and PrevDead describing the row below it in its key:
	// every pending row that is not parked, backing-off ones included
	// (they say so in NextAttemptAt). A parked row is not returned, and
	// the rows of its key above it are returned at most about once, with
	// BehindParked set (the Store then leaves them out of later reads,
	// until an operator acts on the parked row): a parked key costs the
	// read a fixed amount, not its rows on every pass. A row returned
	// without BehindParked may still wait behind a parked row that is not
	// the row below it (PrevPending keeps it waiting). After an
	// operator's retry the parked row and its key's rows are returned as
	// any pending rows. Its cost follows the rows returned. A row that
	// arrived without key_seq is
	// numbered first, durably, while the Store's node holds its partition
	// (docs/outbox-table.md, "Who numbers a key's rows"): every row
	// returned has its key_seq, and a row the node could not number is
	// left out.
	ReadPending(ctx context.Context, cursors []Cursor, limit int) ([]Row, error)
	// PeekPending is ReadPending of one partition with every row's
	// Payload and Headers left out (nil): its cost does
	// not grow with the rows' size. The relay peeks at the row that a read
	// of it alone could not return within ReadTimeout, to charge it an
	// attempt (docs/design.md, "A slow row is read alone").
	PeekPending(ctx context.Context, c Cursor, limit int) ([]Row, error)
	// MarkPublished marks rows processed and returns the ids it marked.
	// Rows whose lease is no longer held at their epoch are left pending.
	MarkPublished(ctx context.Context, rows []Settled) ([]uuid.UUID, error)
	// RecordFailures adds one attempt, the error text and the time of the
	// next attempt (now + Delay) to each row whose lease is still held, and
	// parks the rows that have now failed maxAttempts times. It returns the
	// ids it parked.
	RecordFailures(ctx context.Context, rows []Settled, maxAttempts int) ([]uuid.UUID, error)
	// PrevKeySeq returns the highest key_seq of key below keySeq that is
	// not dead, or 0: x-ordo-prev-key-seq of a row whose row below is
	// dead (Row.PrevDead), looked up right before its publish.
	PrevKeySeq(ctx context.Context, key string, keySeq int64) (int64, error)
}

// Retention deletes what the relay no longer needs.
type Retention interface {
	// DeleteProcessed deletes up to limit processed, not dead, rows of
	// partition processed more than olderThan ago (by the database's
	// clock), if the Store's node holds the partition at epoch, and
	// returns how many it deleted.
	DeleteProcessed(ctx context.Context, partition int, epoch int64, olderThan time.Duration, limit int) (int64, error)
}

// Notifications tell the relay of commits, for the partitions it arms
// (wake.go).
type Notifications interface {
	// Listen calls wake with the partition of every outbox notification
	// until ctx ends, re-listening after every reconnect and calling wake
	// with partition -1 (any) once after each (re)connect, so a
	// notification missed while down costs one read. A (re)connect also
	// disarms every partition.
	Listen(ctx context.Context, wake func(partition int)) error
	// Arm asks that the next commits to each of partitions be notified
	// through Listen, and returns those now armed (already armed ones
	// included). Producers notify only armed partitions: NOTIFY serialises
	// their commits database-wide (docs/design.md, "NOTIFY serialises
	// commits"). A partition is not armed while a producer's transaction
	// that wrote to it without notifying is open; once Arm returns it
	// armed, every commit to it that did not notify is visible to a read
	// begun after Arm returned. Arming lasts until the partition's first
	// notification (Listen disarms it before it calls wake; commits racing
	// that one may notify too), until Disarm, or until Listen's
	// connection ends (wake(-1) follows). It fails while Listen is not
	// connected.
	Arm(ctx context.Context, partitions []int) ([]int, error)
	// Disarm stops the notifications of partitions' commits (the relay
	// polls them instead). Partitions not armed are left alone.
	Disarm(ctx context.Context, partitions []int) error
}

// EveryCommitNotified is implemented by a Store whose writers notify
// every commit whether its partition is armed or not: an adopted table's
// intake, the one writer of its Store's table, which notifies at no
// producer's expense. The relay then keeps every partition armed at any
// rate and never polls for commits (the safety poll every PollInterval
// still runs): a notification does not disarm its partition, and a read
// covers only the partitions notified. Arm must still fail while Listen
// is not connected, and Listen must call wake(-1) after each (re)connect.
type EveryCommitNotified interface {
	EveryCommitNotifies() bool
}
