package outbox_test

import (
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/partition"
)

// requireCheck fails unless err is a check violation (SQLSTATE 23514)
// naming constraint.
func requireCheck(t *testing.T, err error, constraint string) {
	t.Helper()
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "23514" || pgErr.ConstraintName != constraint {
		t.Fatalf("err = %v, want a check violation of %s", err, constraint)
	}
}

// TestBookkeepingAndRangeChecks: the relay's bookkeeping checks (CHECK
// constraints, on INSERT and on UPDATE) and the partition range (a
// constraint, also where a counter row without a partition gets one)
// refuse what they must, with their names and SQLSTATE 23514, after
// migration 12 rewrote the trigger.
func TestBookkeepingAndRangeChecks(t *testing.T) {
	t.Parallel()
	pool, _ := setup(t, 2)
	ctx := testkit.Context(t, 30*time.Second)

	// A counter row without a partition (a key whose rows were all gone
	// at migration 7): the row that records one must be in range.
	if _, err := pool.Exec(ctx, `INSERT INTO outbox_keys (correlation_id, last_key_seq) VALUES ('legacy', 3)`); err != nil {
		t.Fatal(err)
	}
	_, err := pool.Exec(ctx, plainInsert, uuid.Must(uuid.NewV7()), 64, "legacy")
	requireCheck(t, err, "outbox_partition_range")
	var keyPart *int
	var last int
	if err := pool.QueryRow(ctx, `SELECT partition, last_key_seq FROM outbox_keys WHERE correlation_id = 'legacy'`).Scan(&keyPart, &last); err != nil {
		t.Fatal(err)
	}
	if keyPart != nil || last != 3 {
		t.Fatalf("the refused row changed the counter: partition %v, last_key_seq %d", keyPart, last)
	}
	legacy := partition.Of("legacy", 64)
	if _, err := pool.Exec(ctx, plainInsert, uuid.Must(uuid.NewV7()), legacy, "legacy"); err != nil {
		t.Fatalf("the legacy key's next row, in range: %v", err)
	}

	// The relay's bookkeeping, on INSERT.
	for _, c := range []struct{ name, columns, values, constraint string }{
		{"negative attempts", "attempts", "-1", "outbox_attempts_nonnegative"},
		{"dead but pending", "dead_at", "clock_timestamp()", "outbox_dead_is_processed"},
	} {
		t.Run("insert "+c.name, func(t *testing.T) {
			_, err := pool.Exec(ctx, `INSERT INTO outbox (id, partition, correlation_id, exchange, routing_key, type, payload, `+c.columns+`)
				VALUES ($1, $2, 'bookkeeping', 'ex', 'rk', 't', '{}', `+c.values+`)`, uuid.Must(uuid.NewV7()), partition.Of("bookkeeping", 64))
			requireCheck(t, err, c.constraint)
		})
	}
	// ... and on UPDATE, which the relay and the operator write.
	id := uuid.Must(uuid.NewV7())
	if _, err := pool.Exec(ctx, plainInsert, id, partition.Of("bookkeeping", 64), "bookkeeping"); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ name, set, constraint string }{
		{"negative attempts", "attempts = -1", "outbox_attempts_nonnegative"},
		{"dead but pending", "dead_at = clock_timestamp()", "outbox_dead_is_processed"},
	} {
		t.Run("update "+c.name, func(t *testing.T) {
			_, err := pool.Exec(ctx, `UPDATE outbox SET `+c.set+` WHERE id = $1`, id)
			requireCheck(t, err, c.constraint)
		})
	}
	// What the relay and the operator do write passes.
	if _, err := pool.Exec(ctx, `UPDATE outbox SET attempts = attempts + 1, dead_at = clock_timestamp(), processed_at = clock_timestamp() WHERE id = $1`, id); err != nil {
		t.Fatalf("a skip: %v", err)
	}
}
