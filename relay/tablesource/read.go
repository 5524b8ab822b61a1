package tablesource

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/ordo-relay/ordo/partition"
)

// ErrBadRow is wrapped by Row.Problem when a row cannot be published as it
// is. The relay parks such a row with the problem as its reason; the read
// itself goes on.
var ErrBadRow = errors.New("row cannot be published")

// maxShortString is AMQP's short-string limit (bytes): the correlation id,
// type and routing key travel as short strings.
const maxShortString = 255

// Row is one pending row of a mapped table, with its key and partition
// resolved.
type Row struct {
	// ID is the row's id: the AMQP message id.
	ID uuid.UUID
	// Key is the ordering key: the correlation id, or ID's text form
	// (lower case, hyphenated, as PostgreSQL writes a uuid) where the
	// correlation id is null.
	Key string
	// CorrelationID is the row's correlation id, "" where it is null
	// (HasCorrelationID false). It is sent as the AMQP correlation id.
	CorrelationID    string
	HasCorrelationID bool
	// Partition is partition.Of(Key, partitions).
	Partition int
	// Type and RoutingKey are the row's, "" where null (and then Problem
	// says so).
	Type       string
	RoutingKey string
	// Payload is the message body as the table holds it (JSON text).
	Payload []byte
	// OccurredAt orders the key's rows, ties broken by ID.
	OccurredAt time.Time
	// Problem, when not nil, wraps ErrBadRow and says why the row cannot
	// be published as it is.
	Problem error
}

// Position is a place in the read order: a row's occurred-at and id.
type Position struct {
	OccurredAt time.Time
	ID         uuid.UUID
}

// Position returns the row's place in the read order.
func (r Row) Position() Position {
	return Position{OccurredAt: r.OccurredAt, ID: r.ID}
}

// Reader reads a mapped table's pending rows. It holds only the layout,
// the partition count and the queries built from them: it is safe for
// concurrent use and needs no cleanup.
type Reader struct {
	layout     Layout
	partitions int
	sqlFirst   string
	sqlAfter   string
}

// NewReader returns a Reader of the table l maps, whose keys fall into
// partitions partitions. It returns an error wrapping ErrInvalidLayout for
// a layout that Validate refuses, and one wrapping
// partition.ErrInvalidCount for a bad count. It does not touch the
// database: call Check for that.
func NewReader(l Layout, partitions int) (*Reader, error) {
	if err := l.Validate(); err != nil {
		return nil, err
	}
	if err := partition.ValidateCount(partitions); err != nil {
		return nil, fmt.Errorf("table reader: %w", err)
	}
	first, after := pendingSQL(l)
	return &Reader{layout: l, partitions: partitions, sqlFirst: first, sqlAfter: after}, nil
}

// Pending returns up to limit pending rows (processed-at null) in the
// order occurred-at, then id: the order of each key's rows. With after
// nil it reads from the oldest pending row; otherwise it reads the rows
// after *after. It runs in a read-only transaction of its own that steers
// the planner to the partial index (see plannerSettings): four round
// trips.
//
// A read after a position misses a row that commits later with an
// occurred-at behind that position (a long producer transaction, a clock
// behind the others): callers that must see every row read from the start
// again (docs/adopt.md, "Intake: who reads the user's table"). A row that
// cannot be published is returned with Problem set; only a failed query is
// an error.
func (r *Reader) Pending(ctx context.Context, db TxBeginner, after *Position, limit int) ([]Row, error) {
	if limit <= 0 {
		return nil, fmt.Errorf("read pending rows of %s: limit %d is not positive", r.layout, limit)
	}
	var out []Row
	err := pgx.BeginTxFunc(ctx, db, pgx.TxOptions{AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		if err := plannerSettings(ctx, tx); err != nil {
			return err
		}
		var err error
		out, err = r.pending(ctx, tx, after, limit)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("read pending rows of %s: %w", r.layout, err)
	}
	return out, nil
}

// plannerSettings makes the ordered walk of the partial index the only
// plan the pending read can get, for the rest of tx. Without statistics
// (a backlog written since the last ANALYZE) PostgreSQL estimates that
// few rows are pending and chooses a bitmap scan of every pending row and
// a sort: the whole backlog for one page (docs/adopt.md).
func plannerSettings(ctx context.Context, tx pgx.Tx) error {
	if _, err := tx.Exec(ctx, sqlPlannerSettings); err != nil {
		return fmt.Errorf("planner settings: %w", err)
	}
	return nil
}

// pages reads the pending rows after after (nil: from the oldest), limit
// at a time, all in one read-only REPEATABLE READ transaction steered as
// Pending's is, and calls page with each page that has rows; first, if
// not nil, runs in that transaction before the first read. One snapshot
// for every page: read page by page in snapshots of their own, a key's
// row committing between two reads behind the first page's end is
// missed while the key's next row, committed after it, is read by the
// second.
func (r *Reader) pages(ctx context.Context, db TxBeginner, after *Position, limit int, first func(pgx.Tx) error, page func([]Row) error) error {
	tx, err := db.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }() // read-only: nothing to keep
	if err := plannerSettings(ctx, tx); err != nil {
		return err
	}
	if first != nil {
		if err := first(tx); err != nil {
			return err
		}
	}
	for {
		rows, err := r.pending(ctx, tx, after, limit)
		if err != nil {
			return fmt.Errorf("read pending rows: %w", err)
		}
		if len(rows) > 0 {
			if err := page(rows); err != nil {
				return err
			}
			p := rows[len(rows)-1].Position()
			after = &p
		}
		if len(rows) < limit {
			return nil
		}
	}
}

// Batcher sends a pipeline of statements: a pool, a connection.
type Batcher interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// onePage reads the pending rows after after (nil: from the oldest), at
// most limit, in one round trip: the planner settings and the read in one
// pipeline, whose implicit transaction the settings last for. whole says
// the page came back short: its rows are all the pass reads, in the one
// snapshot of a single statement. A full page is not a pass's end; the
// caller reads the pass again with pages, in one snapshot.
func (r *Reader) onePage(ctx context.Context, db Batcher, after *Position, limit int) (rows []Row, whole bool, err error) {
	b := &pgx.Batch{}
	b.Queue(sqlPlannerSettings)
	sql, args := r.pendingQuery(after, limit)
	b.Queue(sql, args...).Query(func(res pgx.Rows) error {
		rows, err = r.scanPending(res)
		return err
	})
	if err := db.SendBatch(ctx, b).Close(); err != nil {
		return nil, false, fmt.Errorf("read pending rows: %w", err)
	}
	return rows, len(rows) < limit, nil
}

// pendingQuery is the pending read after after (nil: from the oldest) and
// its arguments.
func (r *Reader) pendingQuery(after *Position, limit int) (string, []any) {
	if after == nil {
		return r.sqlFirst, []any{limit}
	}
	return r.sqlAfter, []any{after.OccurredAt, after.ID, limit}
}

// pending is Pending inside tx, whose planner settings the caller made.
func (r *Reader) pending(ctx context.Context, tx pgx.Tx, after *Position, limit int) ([]Row, error) {
	sql, args := r.pendingQuery(after, limit)
	rows, err := tx.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	return r.scanPending(rows)
}

// scanPending reads the rows of a pending read and closes them.
func (r *Reader) scanPending(rows pgx.Rows) ([]Row, error) {
	defer rows.Close()
	var out []Row
	for rows.Next() {
		var (
			id                       string
			typ, rk, payload, corrID *string
			occurredAt               time.Time
		)
		if err := rows.Scan(&id, &typ, &rk, &payload, &corrID, &occurredAt); err != nil {
			return nil, err
		}
		row, err := r.row(id, typ, rk, payload, corrID, occurredAt)
		if err != nil {
			return nil, err
		}
		out = append(out, row)
	}
	return out, rows.Err()
}

// row builds a Row from the scanned columns and checks what would keep it
// from being published. Only an id that is not a uuid is an error (Check
// refuses such a column).
func (r *Reader) row(id string, typ, rk, payload, corrID *string, occurredAt time.Time) (Row, error) {
	uid, err := uuid.Parse(id)
	if err != nil {
		return Row{}, fmt.Errorf("column %s: %w", quote(r.layout.ID), err)
	}
	row := Row{ID: uid, OccurredAt: occurredAt}
	var problems []string
	if corrID != nil {
		row.CorrelationID, row.HasCorrelationID, row.Key = *corrID, true, *corrID
	} else {
		row.Key = uid.String()
	}
	switch {
	case row.HasCorrelationID && row.CorrelationID == "":
		problems = append(problems, fmt.Sprintf("%s is empty (null makes the row a key of its own; empty is no key)", quote(r.layout.CorrelationID)))
	case len(row.CorrelationID) > maxShortString:
		problems = append(problems, fmt.Sprintf("%s is %d bytes, longer than AMQP's %d-byte short string", quote(r.layout.CorrelationID), len(row.CorrelationID), maxShortString))
	}
	row.Partition = partition.Of(row.Key, r.partitions)
	shortString := func(col string, v *string, dst *string) {
		switch {
		case v == nil:
			problems = append(problems, col+" is null")
		case len(*v) > maxShortString:
			problems = append(problems, fmt.Sprintf("%s is %d bytes, longer than AMQP's %d-byte short string", col, len(*v), maxShortString))
		default:
			*dst = *v
		}
	}
	shortString(quote(r.layout.Type), typ, &row.Type)
	shortString(quote(r.layout.RoutingKey), rk, &row.RoutingKey)
	if payload == nil {
		problems = append(problems, quote(r.layout.Payload)+" is null")
	} else {
		row.Payload = []byte(*payload)
		if !isJSONObject(row.Payload) {
			problems = append(problems, quote(r.layout.Payload)+" is not a JSON object")
		}
	}
	if len(problems) > 0 {
		row.Problem = fmt.Errorf("%w: %s", ErrBadRow, strings.Join(problems, "; "))
	}
	return row, nil
}

// isJSONObject reports whether b is valid JSON whose value is an object.
func isJSONObject(b []byte) bool {
	t := bytes.TrimLeft(b, " \t\r\n")
	return len(t) > 0 && t[0] == '{' && json.Valid(b)
}
