package tablesource

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ordo-relay/ordo/relay"
	"github.com/ordo-relay/ordo/relay/internal/pgwrite"
)

// planFresh: every statement but the read and the mark is planned for its
// parameters and the tables as they are when it runs (see package
// pgstore's planFresh).
const planFresh = pgwrite.PlanFresh

// planCached: the read and the mark are prepared once per connection and
// PostgreSQL may keep a generic plan, whose cost is the custom plan's
// (TestStorePlansWithoutStatistics; package pgstore's planCached).
const planCached = pgwrite.PlanCached

// Store is the relay.Store of one node over an adopted table: key heads
// from ordo_table_rows in each partition's intake order, what the message
// carries read from the user's row by primary key, and every write
// (numbering, mark, failures) fenced by the node's leases. The intake
// (Intake) fills ordo_table_rows, numbered; the Store numbers what an
// intake of an earlier release left unnumbered there.
type Store struct {
	pool     *pgxpool.Pool
	node     string
	exchange string
	layout   Layout
	sql      storeSQL
	logger   *slog.Logger
	// numberKeys bounds the keys one numbering statement numbers
	// (numberKeysPerCall; a test lowers it).
	numberKeys int

	late      atomic.Int64 // rows numbered after a later row of their key
	listening atomic.Bool  // Listen is connected: Arm arms
}

// numberKeysPerCall is how many keys of a partition one numbering
// statement numbers at most: a partition with more takes several, each
// committed on its own.
const numberKeysPerCall = 256

var _ relay.Store = (*Store)(nil)

// NewStore returns the Store of node (the relay's Config.Node) over the
// table l maps, on pool, publishing to exchange. It returns an error
// wrapping ErrInvalidLayout for a layout Validate refuses.
func NewStore(pool *pgxpool.Pool, node string, l Layout, exchange string, logger *slog.Logger) (*Store, error) {
	if err := l.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = slog.Default()
	}
	return &Store{pool: pool, node: node, exchange: exchange, layout: l, sql: newStoreSQL(l), logger: logger,
		numberKeys: numberKeysPerCall}, nil
}

// LateRows returns how many rows this Store numbered after a row of their
// key with a later occurred-at (docs/adopt.md, "Late rows").
func (s *Store) LateRows() int64 { return s.late.Load() }

// ReadPending implements relay.Outbox. Rows not numbered yet are
// numbered first, fenced by the leases, and read again; a row still
// unnumbered then (its partition is no longer held here) is left out.
// A numbered row whose user row was processed or deleted outside Ordo is
// marked dead and left out.
func (s *Store) ReadPending(ctx context.Context, cursors []relay.Cursor, limit int) ([]relay.Row, error) {
	return s.readPending(ctx, s.sql.read, cursors, limit)
}

// PeekPending implements relay.Outbox.
func (s *Store) PeekPending(ctx context.Context, c relay.Cursor, limit int) ([]relay.Row, error) {
	return s.readPending(ctx, s.sql.peek, []relay.Cursor{c}, limit)
}

// scanned is one row of a read, with what the Store must do about it.
type scanned struct {
	row        relay.Row
	unnumbered bool
	live       bool  // the user's row is there and pending
	head       int64 // the key_seq of the parked row it waits behind; 0: none
}

func (s *Store) readPending(ctx context.Context, query string, cursors []relay.Cursor, limit int) ([]relay.Row, error) {
	parts := make([]int32, len(cursors))
	after := make([]int64, len(cursors))
	for i, c := range cursors {
		parts[i], after[i] = int32(c.Partition), c.After
	}
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("read pending rows: %w: %w", relay.ErrNoConnection, err)
	}
	defer conn.Release()
	got, err := s.read(ctx, conn.Conn(), query, parts, after, limit)
	if err != nil {
		return nil, err
	}
	var numberParts []int32
	seen := map[int32]bool{}
	for _, r := range got {
		if p := int32(r.row.Partition); r.unnumbered && !seen[p] {
			seen[p] = true
			numberParts = append(numberParts, p)
		}
	}
	if len(numberParts) > 0 {
		// One partition and at most numberKeys keys per statement, each
		// committed on its own: a read that runs out of time (a large
		// intake's first numbering on a loaded machine) keeps what it
		// numbered, and the next read goes on from there instead of
		// starting over.
		slices.Sort(numberParts)
		var late int64
		for i, p := range numberParts {
			for {
				var n, l int64
				var keys int
				if err := conn.QueryRow(ctx, sqlNumber, planFresh, s.node, []int32{p}, s.numberKeys).Scan(&n, &l, &keys); err != nil {
					return nil, fmt.Errorf("read pending rows: number the rows of partition %d (%d of %d): %w", p, i+1, len(numberParts), err)
				}
				late += l
				if keys < s.numberKeys {
					break
				}
			}
		}
		if late > 0 {
			s.late.Add(late)
			s.logger.Warn("rows numbered after a later row of their key (committed late, or a producer's clock behind)",
				"rows", late, "partitions", numberParts)
		}
		if got, err = s.read(ctx, conn.Conn(), query, parts, after, limit); err != nil {
			return nil, err
		}
	}
	out := make([]relay.Row, 0, len(got))
	var gone []relay.Settled
	for _, r := range got {
		switch {
		case r.unnumbered:
		case !r.live:
			gone = append(gone, relay.Settled{ID: r.row.ID, Partition: r.row.Partition})
		default:
			out = append(out, r.row)
		}
	}
	if len(gone) > 0 {
		if err := s.markGone(ctx, conn.Conn(), gone); err != nil {
			return nil, err
		}
	}
	return s.holdBehindParked(ctx, conn.Conn(), out, got)
}

// holdBehindParked holds the rows of got that wait behind a parked row
// and every pending row of their keys above it (sqlHoldBehindParked),
// and marks BehindParked, without payload, those rows and the rows of
// out it held. A parked key's rows are thus read about once and then
// left out of every read until its parked row is retried, skipped or
// deleted.
func (s *Store) holdBehindParked(ctx context.Context, conn *pgx.Conn, out []relay.Row, got []scanned) ([]relay.Row, error) {
	heads := map[pgwrite.Head]int64{}
	for _, r := range got {
		if r.head > 0 && !r.unnumbered && r.live {
			heads[pgwrite.Head{Key: r.row.CorrelationID, Partition: r.row.Partition}] = r.head
		}
	}
	if len(heads) == 0 {
		return out, nil
	}
	isHeld, err := pgwrite.Hold(ctx, conn, sqlHoldPlan, sqlHoldBehindParked, s.node, heads)
	if err != nil {
		return nil, fmt.Errorf("read pending rows: %w", err)
	}
	for i := range out {
		if isHeld[out[i].ID] {
			out[i].BehindParked, out[i].Payload = true, nil
		}
	}
	return out, nil
}

// markGone marks dead the rows of gone (processed or deleted outside
// Ordo) while the node holds their partitions.
func (s *Store) markGone(ctx context.Context, conn *pgx.Conn, gone []relay.Settled) error {
	ids, parts, _, _, _ := relay.SettledColumns(gone)
	if _, err := conn.Exec(ctx, sqlMarkGone, planFresh, s.node, ids, parts); err != nil {
		return fmt.Errorf("read pending rows: mark %d row(s) processed outside Ordo dead: %w", len(gone), err)
	}
	s.logger.Warn("rows processed or deleted outside Ordo after they were numbered: skipped", "rows", len(gone))
	return nil
}

// read runs one read of ordo_table_rows and the user's rows.
func (s *Store) read(ctx context.Context, conn *pgx.Conn, query string, parts []int32, after []int64, limit int) ([]scanned, error) {
	rows, err := conn.Query(ctx, query, planCached, parts, after, limit)
	if err != nil {
		return nil, fmt.Errorf("read pending rows: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (scanned, error) {
		var x scanned
		var wait float64
		var typ, rk, payload *string
		err := r.Scan(&x.row.ID, &x.row.Partition, &x.row.Seq, &x.row.CorrelationID, &x.row.KeySeq, &x.row.OccurredAt,
			&x.row.Attempts, &wait, &x.unnumbered, &x.row.PrevPending, &x.row.PrevDead, &x.head,
			&typ, &rk, &payload, &x.live)
		if wait > 0 {
			x.row.NextAttemptAt = time.Now().Add(time.Duration(wait * float64(time.Second)))
		}
		x.row.PrevKeySeq = max(x.row.KeySeq-1, 0)
		x.row.Exchange = s.exchange
		x.row.BehindParked = x.head > 0
		if typ != nil {
			x.row.Type = *typ
		}
		if rk != nil {
			x.row.RoutingKey = *rk
		}
		if payload != nil {
			x.row.Payload = []byte(*payload)
		}
		return x, err
	})
	if err != nil {
		return nil, fmt.Errorf("read pending rows: %w", err)
	}
	return out, nil
}

// MarkPublished implements relay.Outbox: it sets the user's processed-at
// and forgets the rows, in one statement fenced by the leases.
func (s *Store) MarkPublished(ctx context.Context, rows []relay.Settled) ([]uuid.UUID, error) {
	return pgwrite.Mark(ctx, s.pool, planCached, s.sql.mark, s.node, rows)
}

// RecordFailures implements relay.Outbox.
func (s *Store) RecordFailures(ctx context.Context, rows []relay.Settled, maxAttempts int) ([]uuid.UUID, error) {
	return pgwrite.RecordFailures(ctx, s.pool, sqlRecordFailures, s.node, rows, maxAttempts)
}

// PrevKeySeq implements relay.Outbox.
func (s *Store) PrevKeySeq(ctx context.Context, key string, keySeq int64) (int64, error) {
	return pgwrite.PrevKeySeq(ctx, s.pool, sqlPrevKeySeq, key, keySeq)
}

// DeleteProcessed implements relay.Retention. A row is deleted from
// ordo_table_rows when it is marked, and the user's rows are the user's
// (the article's cleanup job deletes them). What is left are the dead
// rows (processed or deleted outside Ordo, or skipped): those dead for
// longer than olderThan whose number no prev can walk over any more, and
// whose user row is not pending, go (deleteDeadSQL).
func (s *Store) DeleteProcessed(ctx context.Context, partition int, epoch int64, olderThan time.Duration, limit int) (int64, error) {
	tag, err := s.pool.Exec(ctx, s.sql.deleteDead, pgwrite.PlanFresh, s.node, partition, limit, olderThan.Seconds(), epoch)
	if err != nil {
		return 0, fmt.Errorf("delete dead rows of partition %d: %w", partition, err)
	}
	return tag.RowsAffected(), nil
}
