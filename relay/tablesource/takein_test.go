package tablesource_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/partition"
)

// TestIntakeNumbersAsItTakesIn: a pass writes each row numbered, each
// key's rows in occurred-at order, and moves the key's counter, before
// any owner reads them.
func TestIntakeNumbersAsItTakesIn(t *testing.T) {
	t.Parallel()
	pool := adoptedDB(t)
	_, in := newStore(t, pool, "n1")
	t0 := time.Now().Add(-time.Minute).Truncate(time.Microsecond)
	a1, a2, b1 := uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7())
	insert(t, pool, msg{id: a2, corr: ptr("a"), at: t0.Add(time.Second)}, msg{id: a1, corr: ptr("a"), at: t0},
		msg{id: b1, corr: ptr("b"), at: t0})
	if n := take(t, in, true); n != 3 {
		t.Fatalf("took in %d rows, want 3", n)
	}
	for id, want := range map[uuid.UUID]int64{a1: 1, a2: 2, b1: 1} {
		if ks := keySeqInDB(t, pool, id); ks == nil || *ks != want {
			t.Errorf("row %s taken in with key_seq %v, want %d", id, ks, want)
		}
	}
	for key, want := range map[string]int64{"a": 2, "b": 1} {
		if got := counter(t, pool, key); got != want {
			t.Errorf("key %s's counter %d, want %d", key, got, want)
		}
	}
}

// TestTwoIntakesNumberOnce: an intake taking a key's rows in while
// another holds the key's counter (it has locked it and is taking the
// first of the rows in) waits for it, then numbers only the rest: each
// row one number, no gap, and no failed pass.
func TestTwoIntakesNumberOnce(t *testing.T) {
	t.Parallel()
	pool := adoptedDB(t)
	s, in := newStore(t, pool, "n1")
	ctx := testkit.Context(t, 30*time.Second)
	t0 := time.Now().Add(-time.Minute).Truncate(time.Microsecond)
	first, x, y := uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7())
	insert(t, pool, msg{id: first, corr: ptr("k"), at: t0})
	take(t, in, true) // k's counter exists, at 1
	insert(t, pool, msg{id: x, corr: ptr("k"), at: t0.Add(time.Second)}, msg{id: y, corr: ptr("k"), at: t0.Add(2 * time.Second)})

	other, pid := holdingSession(t, pool, `SELECT 1 FROM ordo_table_keys WHERE key = 'k' FOR UPDATE`)
	done := passInBackground(ctx, in)
	waitBlockedBy(t, pool, pid)
	// What the other intake's take-in does next, with the counter locked.
	if _, err := other.Exec(ctx, `INSERT INTO ordo_table_rows (id, partition, key, occurred_at, key_seq) VALUES ($1, $2, 'k', $3, 2)`,
		x, partition.Of("k", storeParts), t0.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := other.Exec(ctx, `UPDATE ordo_table_keys SET last_key_seq = 2 WHERE key = 'k'`); err != nil {
		t.Fatal(err)
	}
	if err := other.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil || r.n != 1 {
		t.Fatalf("the second intake took in %d rows (%v), want 1, the row the first had not", r.n, r.err)
	}
	for id, want := range map[uuid.UUID]int64{x: 2, y: 3} {
		if ks := keySeqInDB(t, pool, id); ks == nil || *ks != want {
			t.Errorf("row %s numbered %v, want %d", id, ks, want)
		}
	}
	if got := counter(t, pool, "k"); got != 3 {
		t.Errorf("k's counter %d, want 3", got)
	}
	got := byID(readAll(t, s))
	if got[x].KeySeq != 2 || got[y].KeySeq != 3 || got[y].PrevKeySeq != 2 {
		t.Fatalf("read: %+v and %+v, want key_seq 2 and 3", got[x], got[y])
	}
}

// TestIntakeBehindAnUnnumberedRow: a key's row that an intake of an
// earlier release took in unnumbered keeps its place: the key's next row
// is taken in unnumbered behind it, and the partition's owner numbers
// both in order.
func TestIntakeBehindAnUnnumberedRow(t *testing.T) {
	t.Parallel()
	pool := adoptedDB(t)
	s, in := newStore(t, pool, "n1")
	t0 := time.Now().Add(-time.Minute).Truncate(time.Microsecond)
	old, next, other := uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7())
	insert(t, pool, msg{id: old, corr: ptr("k"), at: t0})
	takeUnnumbered(t, pool)
	insert(t, pool, msg{id: next, corr: ptr("k"), at: t0.Add(time.Second)}, msg{id: other, corr: ptr("o"), at: t0})
	if n := take(t, in, true); n != 2 {
		t.Fatalf("took in %d rows, want 2", n)
	}
	if ks := keySeqInDB(t, pool, next); ks != nil {
		t.Fatalf("the row behind an unnumbered one was numbered %d at intake", *ks)
	}
	if ks := keySeqInDB(t, pool, other); ks == nil || *ks != 1 {
		t.Fatalf("another key's row numbered %v, want 1", ks)
	}
	got := byID(readAll(t, s))
	if got[old].KeySeq != 1 || got[next].KeySeq != 2 || got[next].PrevKeySeq != 1 {
		t.Fatalf("read: %+v and %+v, want key_seq 1 and 2", got[old], got[next])
	}
}

// TestIntakeRowTakenInMeanwhile: a row an intake of an earlier release
// (which locks no counter) inserts while this intake takes the same page
// in would leave its number unused, a gap: the take-in fails as a
// serialization failure instead, takes nothing in, and the next pass
// takes the rest in behind that row, which the owner then numbers first.
func TestIntakeRowTakenInMeanwhile(t *testing.T) {
	t.Parallel()
	pool := adoptedDB(t)
	s, in := newStore(t, pool, "n1")
	ctx := testkit.Context(t, 30*time.Second)
	t0 := time.Now().Add(-time.Minute).Truncate(time.Microsecond)
	x, y := uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7())
	insert(t, pool, msg{id: x, corr: ptr("k"), at: t0}, msg{id: y, corr: ptr("k"), at: t0.Add(time.Second)})

	other, pid := holdingSession(t, pool, `INSERT INTO ordo_table_rows (id, partition, key, occurred_at) VALUES ($1, $2, 'k', $3)`,
		x, partition.Of("k", storeParts), t0)
	done := passInBackground(ctx, in)
	waitBlockedBy(t, pool, pid)
	if err := other.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	var pgErr *pgconn.PgError
	if r.err == nil || !errors.As(r.err, &pgErr) || pgErr.Code != "40001" || !strings.Contains(pgErr.Message, "taken in meanwhile") {
		t.Fatalf("the pass beside an older intake: %d taken in, err %v; want a serialization failure", r.n, r.err)
	}
	if n := take(t, in, true); n != 1 {
		t.Fatalf("the next pass took in %d rows, want 1", n)
	}
	got := byID(readAll(t, s))
	if got[x].KeySeq != 1 || got[y].KeySeq != 2 || got[y].PrevKeySeq != 1 {
		t.Fatalf("read: %+v and %+v, want key_seq 1 and 2", got[x], got[y])
	}
}

// holdingSession runs sql in a transaction it leaves open (rolled back
// at the end of the test unless committed) and returns it with its
// backend's pid.
func holdingSession(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) (pgx.Tx, int32) {
	t.Helper()
	ctx := testkit.Context(t, 30*time.Second)
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Release)
	var pid int32
	if err := conn.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	if _, err := tx.Exec(ctx, sql, args...); err != nil {
		t.Fatal(err)
	}
	return tx, pid
}

type passResult struct {
	n   int
	err error
}

// passInBackground runs a sweep of in and sends its result.
func passInBackground(ctx context.Context, in interface {
	Pass(context.Context, bool) (int, error)
}) <-chan passResult {
	done := make(chan passResult, 1)
	go func() {
		n, err := in.Pass(ctx, true)
		done <- passResult{n, err}
	}()
	return done
}

// waitBlockedBy waits until a session of the test's database waits for a
// lock pid holds.
func waitBlockedBy(t *testing.T, pool *pgxpool.Pool, pid int32) {
	t.Helper()
	testkit.WaitFor(t, 10*time.Second, "a session waiting for the holding one's locks", func() bool {
		var waiting bool
		err := pool.QueryRow(context.Background(), `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND $1 = ANY(pg_blocking_pids(pid)))`, pid).Scan(&waiting)
		return err == nil && waiting
	})
}

// counter returns key's last_key_seq.
func counter(t *testing.T, pool *pgxpool.Pool, key string) int64 {
	t.Helper()
	var n int64
	if err := pool.QueryRow(context.Background(), `SELECT last_key_seq FROM ordo_table_keys WHERE key = $1`, key).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
