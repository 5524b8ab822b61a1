// Package pgstore is the PostgreSQL backend of the relay: a relay.Store
// over the outbox table. Every write checks, in its own statement, that
// the node still holds each row's partition at the epoch the row was
// published under (the lease row locked FOR SHARE until the write
// commits), and every statement is planned for the table as it is when it
// runs. It owns no table: the outbox and its trigger are package outbox's
// (whose NotifyChannel it listens on), the lease tables package lease's.
package pgstore

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ordo-relay/ordo/relay"
	"github.com/ordo-relay/ordo/relay/internal/pgwrite"
)

// planFresh is the query mode of the relay's statements but the read and
// the mark: pgx describes the statement once and caches only its
// description; each execution parses an unnamed statement that PostgreSQL
// plans for the parameters and the table as they are now. A named
// prepared statement (pgx's default) may switch to a cached generic plan
// after five executions, and that plan is never revisited as the table
// grows: made while the outbox was empty after an idle start, an earlier
// key-head read's plan walked every pending row once per candidate row,
// 2.3-3.7 s a read on a 40,000-row burst, and the relay stalled
// (TestIdleThenBurst).
const planFresh = pgx.QueryExecModeCacheDescribe

// planCached is the read's and the mark's query mode: every plan of
// theirs, generic or custom, with or without statistics, costs about the
// same buffers per row at 10,000 and 100,000 pending rows
// (TestPlansFollowTheWork), so they are prepared once per connection and
// PostgreSQL may keep a generic plan. Parsing and planning were most of a
// tail read's cost: 0.75-0.94 ms a read of 64 empty partitions planned
// afresh, 0.59-0.62 ms prepared with a custom plan, 0.22-0.26 ms with the
// generic one (one connection, 1,000 reads, idle machine).
const planCached = pgwrite.PlanCached

// Store is the PostgreSQL relay.Store of one node.
type Store struct {
	pool   *pgxpool.Pool
	node   string // the lease owner every write is checked against
	logger *slog.Logger
	arms   chan armRequest // served by Listen on its connection

	listening  atomic.Bool  // Listen is connected and serves arms
	registered atomic.Bool  // the node is in ordo_numbering_nodes
	lastRead   atomic.Int64 // rows the last read returned: the next one's first allocation (readRows)

	listenConnectMin time.Duration // the first bound of Listen's connect (0: listenConnectMin; tests shorten it)
	watchTick        time.Duration // how often Listen looks at the sequence (0: watchTick)
}

var _ relay.Store = (*Store)(nil)

// New returns the Store of node (the relay's Config.Node: every write is
// checked against its leases) on pool. Listen uses a connection of its
// own from the pool's configuration, outside the pool.
func New(pool *pgxpool.Pool, node string, logger *slog.Logger) *Store {
	if logger == nil {
		logger = slog.Default()
	}
	return &Store{pool: pool, node: node, logger: logger, arms: make(chan armRequest)}
}

// ReadPending implements relay.Outbox.
func (s *Store) ReadPending(ctx context.Context, cursors []relay.Cursor, limit int) ([]relay.Row, error) {
	return s.readPending(ctx, sqlReadPending, cursors, limit)
}

// PeekPending implements relay.Outbox.
func (s *Store) PeekPending(ctx context.Context, c relay.Cursor, limit int) ([]relay.Row, error) {
	return s.readPending(ctx, sqlPeekPending, []relay.Cursor{c}, limit)
}

// readPending runs query, sqlReadPending or sqlPeekPending. If rows come
// without key_seq, it numbers their partitions' rows up to them in the
// journal (sqlJournalRows, fenced by the leases, committed before
// anything is returned) and reads again, the two in one round trip; a row
// still unnumbered then (its partition is no longer held here) is left
// out. Rows behind a parked row of their
// key it holds out of later reads (sqlHoldBehindParked), and returns them,
// and the rows of the page that hold held too, marked BehindParked.
func (s *Store) readPending(ctx context.Context, query string, cursors []relay.Cursor, limit int) ([]relay.Row, error) {
	parts := make([]int32, len(cursors))
	after := make([]int64, len(cursors))
	for i, c := range cursors {
		parts[i], after[i] = int32(c.Partition), c.After
	}
	// The connection first, apart: a read that timed out waiting for one
	// did not run (relay.ErrNoConnection).
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("read pending rows: %w: %w", relay.ErrNoConnection, err)
	}
	defer conn.Release()
	if !s.registered.Load() {
		if _, err := conn.Exec(ctx, sqlRegister, planFresh, s.node); err != nil {
			return nil, fmt.Errorf("read pending rows: record node %q as numbering rows: %w", s.node, err)
		}
		s.registered.Store(true)
	}
	out, behind, err := s.numbered(ctx, conn.Conn(), query, parts, after, limit)
	if err != nil || len(behind) == 0 {
		return out, err
	}
	return s.holdBehindParked(ctx, conn.Conn(), out, behind)
}

// numbered reads, and if rows come without key_seq numbers their
// partitions' rows up to them and reads again (see readPending).
func (s *Store) numbered(ctx context.Context, conn *pgx.Conn, query string, parts []int32, after []int64, limit int) ([]relay.Row, map[uuid.UUID]int64, error) {
	out, unnumbered, behind, err := s.readRows(ctx, conn, query, parts, after, limit)
	if err != nil || len(unnumbered) == 0 {
		return out, behind, err
	}
	// Each partition's rows up to the highest seq the read returned
	// unnumbered: never the backlog above the read.
	upTo := map[int32]int64{}
	for _, row := range unnumbered {
		upTo[int32(row.Partition)] = max(upTo[int32(row.Partition)], row.Seq)
	}
	numParts := make([]int32, 0, len(upTo))
	numUpTo := make([]int64, 0, len(upTo))
	for p, seq := range upTo {
		numParts, numUpTo = append(numParts, p), append(numUpTo, seq)
	}
	// The numbering and the second read go in one round trip, one
	// implicit transaction: the read sees the numbers, and its rows are
	// returned only once the batch's end has committed them.
	b := &pgx.Batch{}
	b.Queue(sqlJournalRows, s.node, numParts, numUpTo)
	b.Queue(query, parts, after, limit)
	br := conn.SendBatch(ctx, b)
	if _, err := br.Exec(); err != nil {
		br.Close()
		return nil, nil, fmt.Errorf("read pending rows: number the rows of %d partition(s): %w", len(numParts), err)
	}
	rows, err := br.Query()
	if err == nil {
		out, unnumbered, behind, err = s.scanRead(rows)
	}
	if cerr := br.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("read pending rows: commit the numbers of %d partition(s): %w", len(numParts), cerr)
	}
	if err != nil || len(unnumbered) == 0 {
		return out, behind, err
	}
	kept := out[:0]
	for _, row := range out {
		if row.KeySeq > 0 {
			kept = append(kept, row)
		}
	}
	return kept, behind, nil
}

// holdBehindParked holds the rows of out that wait behind a parked row
// (behind: the parked row's key_seq, by row) and every pending row of
// their keys above that row, and marks BehindParked, without payload or
// headers, those rows and the rows of out it held. A parked key's rows
// are thus read about once and then left out of every read, until an
// operator acts on its parked row.
func (s *Store) holdBehindParked(ctx context.Context, conn *pgx.Conn, out []relay.Row, behind map[uuid.UUID]int64) ([]relay.Row, error) {
	heads := map[pgwrite.Head]int64{}
	for _, row := range out {
		if ks, ok := behind[row.ID]; ok {
			heads[pgwrite.Head{Key: row.CorrelationID, Partition: row.Partition}] = ks
		}
	}
	isHeld, err := pgwrite.Hold(ctx, conn, sqlHoldPlan, sqlHoldBehindParked, s.node, heads)
	if err != nil {
		return nil, fmt.Errorf("read pending rows: %w", err)
	}
	for i := range out {
		if _, ok := behind[out[i].ID]; ok || isHeld[out[i].ID] {
			out[i].BehindParked, out[i].Payload, out[i].Headers = true, nil, nil
		}
	}
	return out, nil
}

// maxReadHint bounds the rows readRows allocates for before the read
// returns any.
const maxReadHint = 4096

// readRows runs one read and returns its rows and, apart, those of them
// without key_seq, and the rows behind a parked row with that row's
// key_seq. It allocates for as many rows as the last read returned:
// reads of a drain return pages of similar size, and growing the slice
// row by row from nothing copied each page about twice.
func (s *Store) readRows(ctx context.Context, conn *pgx.Conn, query string, parts []int32, after []int64, limit int) (out, unnumbered []relay.Row, behind map[uuid.UUID]int64, err error) {
	rows, err := conn.Query(ctx, query, planCached, parts, after, limit)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("read pending rows: %w", err)
	}
	return s.scanRead(rows)
}

// scanRead takes in the rows of a read (sqlReadPending or
// sqlPeekPending): see readRows.
func (s *Store) scanRead(rows pgx.Rows) (out, unnumbered []relay.Row, behind map[uuid.UUID]int64, err error) {
	out = make([]relay.Row, 0, min(s.lastRead.Load(), maxReadHint))
	out, err = pgx.AppendRows(out, rows, func(r pgx.CollectableRow) (relay.Row, error) {
		var x relay.Row
		var wait *float64
		var bare bool
		var head int64
		err := r.Scan(&x.ID, &x.Partition, &x.Seq, &x.CorrelationID, &x.KeySeq, &x.Exchange, &x.RoutingKey,
			&x.Type, &x.Payload, &x.Headers, &x.OccurredAt, &x.Attempts, &wait, &x.PrevPending, &x.PrevDead, &bare, &head)
		if wait != nil && *wait > 0 {
			x.NextAttemptAt = time.Now().Add(time.Duration(*wait * float64(time.Second)))
		}
		x.PrevKeySeq = max(x.KeySeq-1, 0)
		if bare {
			unnumbered = append(unnumbered, x)
		}
		if head > 0 {
			if behind == nil {
				behind = map[uuid.UUID]int64{}
			}
			behind[x.ID] = head
		}
		return x, err
	})
	if err != nil {
		return nil, nil, nil, fmt.Errorf("read pending rows: %w", err)
	}
	s.lastRead.Store(int64(len(out)))
	return out, unnumbered, behind, nil
}

// MarkPublished implements relay.Outbox.
func (s *Store) MarkPublished(ctx context.Context, rows []relay.Settled) ([]uuid.UUID, error) {
	return pgwrite.Mark(ctx, s.pool, planCached, sqlMarkPublished, s.node, rows)
}

// RecordFailures implements relay.Outbox.
func (s *Store) RecordFailures(ctx context.Context, rows []relay.Settled, maxAttempts int) ([]uuid.UUID, error) {
	return pgwrite.RecordFailures(ctx, s.pool, sqlRecordFailures, s.node, rows, maxAttempts)
}

// PrevKeySeq implements relay.Outbox.
func (s *Store) PrevKeySeq(ctx context.Context, key string, keySeq int64) (int64, error) {
	return pgwrite.PrevKeySeq(ctx, s.pool, sqlPrevKeySeq, key, keySeq)
}

// DeleteProcessed implements relay.Retention.
func (s *Store) DeleteProcessed(ctx context.Context, partition int, epoch int64, olderThan time.Duration, limit int) (int64, error) {
	var n int64
	if err := s.pool.QueryRow(ctx, sqlRetention, planFresh, s.node, partition, limit, olderThan.Seconds(), epoch).Scan(&n); err != nil {
		return 0, fmt.Errorf("delete processed rows of partition %d: %w", partition, err)
	}
	return n, nil
}
