package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/partition"
)

// TestConcurrentDuplicateInsertLeavesNoGap: a retry of an INSERT that runs
// while the first attempt's transaction is still open waits for the key's
// counter lock; once the first commits, the retry must insert nothing and
// consume no key_seq (migration 0006 left a permanent gap here: the next
// row got key_seq + 2, and consumers waited forever for the missing one).
// Also for a first-row key, whose counter the retry would otherwise
// create.
func TestConcurrentDuplicateInsertLeavesNoGap(t *testing.T) {
	t.Parallel()
	pool, _ := setup(t, 4)
	ctx := testkit.Context(t, 30*time.Second)
	insert := `INSERT INTO outbox (id, partition, correlation_id, exchange, routing_key, type, payload)
		VALUES ($1, $2, $3, 'ex', 'rk', 't', '{}') ON CONFLICT (id) DO NOTHING`
	for _, c := range []struct{ name, key string }{{"existing key", "dup-old"}, {"new key", "dup-new"}} {
		t.Run(c.name, func(t *testing.T) {
			p := partition.Of(c.key, 64)
			if c.key == "dup-old" {
				if _, err := pool.Exec(ctx, insert, uuid.Must(uuid.NewV7()), p, c.key); err != nil {
					t.Fatal(err)
				}
			}
			id := uuid.Must(uuid.NewV7())
			retryConn, err := pool.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			var retryPID int
			if err := retryConn.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&retryPID); err != nil {
				t.Fatal(err)
			}
			first, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			retried := make(chan error, 1)
			defer func() {
				// First end the first transaction, then the retry, then
				// give its connection back.
				_ = first.Rollback(context.Background())
				<-retried
				retryConn.Release()
			}()
			if _, err := first.Exec(ctx, insert, id, p, c.key); err != nil {
				retried <- nil
				t.Fatal(err)
			}
			go func() {
				_, err := retryConn.Exec(ctx, insert, id, p, c.key)
				retried <- err
			}()
			waitForLockWait(t, pool, retryPID)
			if err := first.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			err = <-retried
			retried <- nil // for the deferred wait
			if err != nil {
				t.Fatalf("retry: %v", err)
			}
			// The next row follows the first attempt's without a gap.
			if _, err := pool.Exec(ctx, insert, uuid.Must(uuid.NewV7()), p, c.key); err != nil {
				t.Fatal(err)
			}
			rows, _ := pool.Query(ctx, `SELECT key_seq FROM outbox WHERE correlation_id = $1 ORDER BY key_seq`, c.key)
			seqs, err := pgx.CollectRows(rows, pgx.RowTo[int64])
			if err != nil {
				t.Fatal(err)
			}
			for i, s := range seqs {
				if s != int64(i+1) {
					t.Fatalf("key_seq %v: a gap at %d", seqs, i+1)
				}
			}
			var last int64
			if err := pool.QueryRow(ctx, `SELECT last_key_seq FROM outbox_keys WHERE correlation_id = $1`, c.key).Scan(&last); err != nil || last != int64(len(seqs)) {
				t.Fatalf("counter at %d (%v) for rows %v", last, err, seqs)
			}
		})
	}
}

// waitForLockWait waits until backend pid waits for a lock.
func waitForLockWait(t *testing.T, pool interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, pid int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var waiting bool
		err := pool.QueryRow(context.Background(),
			`SELECT coalesce(wait_event_type = 'Lock', false) FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&waiting)
		if err != nil {
			t.Fatal(err)
		}
		if waiting {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the retry never waited for the key's lock")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
