package tablesource_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/ordo-relay/ordo/internal/testkit"
)

// TestIntakeSkipsARowBeingMarked: a sweep that read a row while its mark
// was under way (set "ProcessedAt", forget the row, not yet committed)
// waits for the mark and then does not take the row in again: taken in
// again it would be numbered and published a second time.
func TestIntakeSkipsARowBeingMarked(t *testing.T) {
	t.Parallel()
	pool := adoptedDB(t)
	s, in := newStore(t, pool, "n1")
	ctx := testkit.Context(t, 30*time.Second)
	id := uuid.Must(uuid.NewV7())
	insert(t, pool, msg{id: id, corr: ptr("k"), at: time.Now()})
	take(t, in, true)
	readAll(t, s)

	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	var marker int32
	if err := conn.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&marker); err != nil {
		t.Fatal(err)
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // committed below
	if _, err := tx.Exec(ctx, `UPDATE "OutboxMessages" SET "ProcessedAt" = now() WHERE "Id" = $1`, id); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `DELETE FROM ordo_table_rows WHERE id = $1`, id); err != nil {
		t.Fatal(err)
	}

	type result struct {
		n   int
		err error
	}
	done := make(chan result, 1)
	go func() {
		n, err := in.Pass(ctx, true)
		done <- result{n, err}
	}()
	// The sweep reads the row pending (the mark has not committed) and
	// waits for the mark's row locks.
	testkit.WaitFor(t, 10*time.Second, "the sweep waits for the mark's locks", func() bool {
		var waiting bool
		err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND $1 = ANY(pg_blocking_pids(pid)))`, marker).Scan(&waiting)
		return err == nil && waiting
	})
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	var again int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM ordo_table_rows WHERE id = $1`, id).Scan(&again); err != nil {
		t.Fatal(err)
	}
	if again != 0 || r.n != 0 {
		t.Fatalf("the sweep took the marked row in again (%d taken in, %d row(s) in ordo_table_rows)", r.n, again)
	}
}
