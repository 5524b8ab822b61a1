package testkit

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ordo-relay/ordo/outbox"
)

// Outbox is the setup most tests against PostgreSQL start from: a fresh
// database (NewDatabase) with the outbox installed at Partitions
// partitions, a small pool on it, and a Producer for it. Importing it makes
// testkit depend on package outbox, so outbox's own in-package tests
// (package outbox, not outbox_test) cannot import testkit.
type Outbox struct {
	URL        string
	Pool       *pgxpool.Pool
	Producer   *outbox.Producer
	Partitions int
}

// NewOutbox creates the database, migrates it (outbox.Migrate) and opens a
// pool of maxConns connections, all removed when tb ends. Like NewDatabase
// it skips tb (fails it in CI) when PostgreSQL cannot be reached.
func NewOutbox(tb testing.TB, partitions int, maxConns int32) *Outbox {
	tb.Helper()
	dbURL, pool := NewDatabasePool(tb, maxConns)
	if err := outbox.Migrate(Context(tb, 30*time.Second), pool, partitions); err != nil {
		tb.Fatalf("outbox.Migrate: %v", err)
	}
	prod, err := outbox.NewProducer(partitions)
	if err != nil {
		tb.Fatalf("outbox.NewProducer: %v", err)
	}
	return &Outbox{URL: dbURL, Pool: pool, Producer: prod, Partitions: partitions}
}

// Enqueue commits msgs in one transaction and returns their ids, failing
// tb on an error. With c not nil, every id is Expected by c.
func (o *Outbox) Enqueue(tb testing.TB, c *Checker, msgs ...outbox.Message) []uuid.UUID {
	tb.Helper()
	ctx := Context(tb, 30*time.Second)
	var ids []uuid.UUID
	err := pgx.BeginFunc(ctx, o.Pool, func(tx pgx.Tx) error {
		var err error
		ids, err = o.Producer.Enqueue(ctx, tx, msgs...)
		return err
	})
	if err != nil {
		tb.Fatalf("enqueue %d messages: %v", len(msgs), err)
	}
	if c != nil {
		for _, id := range ids {
			c.Expect(id.String())
		}
	}
	return ids
}

// Parked returns how many rows are parked and not processed, failing tb on
// an error.
func (o *Outbox) Parked(tb testing.TB) int {
	tb.Helper()
	var n int
	if err := o.Pool.QueryRow(Context(tb, 30*time.Second), `SELECT count(*) FROM outbox WHERE parked_at IS NOT NULL AND processed_at IS NULL`).Scan(&n); err != nil {
		tb.Fatalf("count parked rows: %v", err)
	}
	return n
}

// WaitParked waits up to timeout until at least n rows are parked.
func (o *Outbox) WaitParked(tb testing.TB, n int, timeout time.Duration) {
	tb.Helper()
	WaitFor(tb, timeout, fmt.Sprintf("%d parked", n), func() bool { return o.Parked(tb) >= n })
}

// Pending returns how many rows are not yet processed (parked ones
// included), failing tb on an error.
func (o *Outbox) Pending(tb testing.TB) int {
	tb.Helper()
	var n int
	if err := o.Pool.QueryRow(Context(tb, 30*time.Second), `SELECT count(*) FROM outbox WHERE processed_at IS NULL`).Scan(&n); err != nil {
		tb.Fatalf("count pending rows: %v", err)
	}
	return n
}
