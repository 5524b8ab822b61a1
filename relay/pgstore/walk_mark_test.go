package pgstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/ordo-relay/ordo/admin"
	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/relay"
)

// The owner's numbering walks each partition from its mark
// (outbox_walk_marks: docs/outbox-table.md, "Where the walk starts").

// sampleRead inserts 70 rows of key "bulk-<p>" in partition p and reads
// them (a page above the rows before): the numbering call numbers more
// than 16 rows a partition, so it samples the outbox's writers after its
// walk.
func sampleRead(t *testing.T, h *pgHarness, p int) {
	t.Helper()
	var top int64
	if err := h.pool.QueryRow(testkit.Context(t, 10*time.Second), `SELECT coalesce(max(seq), 0) FROM outbox`).Scan(&top); err != nil {
		t.Fatal(err)
	}
	keys := make([]string, 70)
	for i := range keys {
		keys[i] = fmt.Sprintf("bulk-%d", p)
	}
	h.Insert(t, p, keys...)
	if rows := readAll(t, h.store, relay.Cursor{Partition: p, After: top}); len(rows) != len(keys) {
		t.Fatalf("read %d rows of partition %d; want %d", len(rows), p, len(keys))
	}
	var seen *int64
	if err := h.pool.QueryRow(testkit.Context(t, 10*time.Second), `SELECT (SELECT seen FROM outbox_walk_marks WHERE partition = $1)`, p).Scan(&seen); err != nil || seen == nil || *seen <= top {
		t.Fatalf("partition %d's mark holds no sample after the read (%v, %v)", p, deref(seen), err)
	}
}

// markOf returns partition p's mark (-1: none).
func markOf(t *testing.T, h *pgHarness, p int) int64 {
	t.Helper()
	var m *int64
	if err := h.pool.QueryRow(testkit.Context(t, 10*time.Second), `SELECT (SELECT walked_to FROM outbox_walk_marks WHERE partition = $1)`, p).Scan(&m); err != nil {
		t.Fatal(err)
	}
	if m == nil {
		return -1
	}
	return *m
}

// seqOf returns row id's seq, as q (the pool, or the row's open
// transaction) sees it.
func seqOf(t *testing.T, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, id uuid.UUID) int64 {
	t.Helper()
	var s int64
	if err := q.QueryRow(testkit.Context(t, 10*time.Second), `SELECT seq FROM outbox WHERE id = $1`, id).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestWalkMarkStaysBelowAnOpenWriter: a producer's row that commits after
// rows inserted after it were numbered lies below them, and the mark must
// not pass it, or the key's next row would be numbered first. T1 inserts
// a row of key k and stays open; calls that sample the writers number
// later rows, and a later call moves the mark; T1 commits; a later
// producer adds k's next row. T1's row is k's 1, the next row 2. T1
// began writing after the partition's last sample (its bound is that
// sample's value) or before the first (it has no bound).
func TestWalkMarkStaysBelowAnOpenWriter(t *testing.T) {
	testkit.RequirePostgres(t)
	for _, tc := range []struct {
		name    string
		sampled bool // a sample of partition 1 before T1 writes
	}{{"writer after the last sample", true}, {"writer before the first sample", false}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, false)
			ctx := testkit.Context(t, 30*time.Second)
			if tc.sampled {
				sampleRead(t, h, 1)
			}
			t1 := begin(t, h)
			first := insertIn(t, ctx, t1, 1, "k")
			s := seqOf(t, t1, first)
			sampleRead(t, h, 1) // a sample with T1 open
			h.Insert(t, 1, "x")
			readAll(t, h.store, relay.Cursor{Partition: 1, After: s}) // numbers x: moves the mark to that sample's bound
			if m := markOf(t, h, 1); m >= s {
				t.Fatalf("with T1 open, partition 1's mark is %d, at or above T1's row (seq %d)", m, s)
			}
			commit(t, t1)
			next := h.Insert(t, 1, "k")[0]
			readAll(t, h.store, relay.Cursor{Partition: 1, After: s - 1}) // T1's row and those above it
			if a, b := numberOf(t, h, first), numberOf(t, h, next); a == nil || b == nil || *a != 1 || *b != 2 {
				t.Fatalf("k's rows numbered %v and %v; want T1's 1, the next 2", deref(a), deref(b))
			}
		})
	}
}

func deref(p *int64) any {
	if p == nil {
		return "none"
	}
	return *p
}

// TestWalkStartsBelowARetriedRow: a refused row (in another partition
// than its key's) that an operator moves to the right partition and
// retries lies below that partition's mark; the next numbering walks it,
// before the key's row inserted after the retry.
func TestWalkStartsBelowARetriedRow(t *testing.T) {
	testkit.RequirePostgres(t)
	h := newHarness(t, false)
	ctx := testkit.Context(t, 30*time.Second)
	h.Insert(t, 1, "a")
	readAll(t, h.store, from(1)) // a's home is partition 1
	stray := h.Insert(t, 2, "a")[0]
	readAll(t, h.store, from(2)) // parks the stray row
	if !h.State(t, stray).Parked {
		t.Fatal("the stray row is not parked")
	}
	sampleRead(t, h, 1)
	h.Insert(t, 1, "c")
	readAll(t, h.store, from(1))
	if m, s := markOf(t, h, 1), seqOf(t, h.pool, stray); m <= s {
		t.Fatalf("partition 1's mark is %d, not above the stray row (seq %d): the test needs it above", m, s)
	}
	if _, err := h.pool.Exec(ctx, `UPDATE outbox SET partition = 1 WHERE id = $1`, stray); err != nil {
		t.Fatal(err)
	}
	if err := admin.NewStore(h.pool).Retry(ctx, admin.Actor{Operator: "test", RemoteAddr: "local"}, stray); err != nil {
		t.Fatal(err)
	}
	next := h.Insert(t, 1, "a")[0]
	readAll(t, h.store, from(1))
	if a, b := numberOf(t, h, stray), numberOf(t, h, next); a == nil || b == nil || *a != 2 || *b != 3 {
		t.Fatalf("a's retried row numbered %v, its next row %v; want 2 and 3", deref(a), deref(b))
	}
}

// TestWalkAfterTheSequenceIsSetBack: rows drawn from a sequence set back
// below a partition's mark are numbered by the next read, although it
// also returns rows above the mark: the sequence's value below the
// mark's last sample voids the mark.
func TestWalkAfterTheSequenceIsSetBack(t *testing.T) {
	testkit.RequirePostgres(t)
	h := newHarness(t, false)
	ctx := testkit.Context(t, 30*time.Second)
	sampleRead(t, h, 1)
	sampleRead(t, h, 1) // moves the mark to the first sample's bound, and samples again above it
	m := markOf(t, h, 1)
	if m <= 0 {
		t.Fatalf("partition 1's mark is %d; want above 0", m)
	}
	if _, err := h.pool.Exec(ctx, `SELECT setval(pg_get_serial_sequence('outbox', 'seq'), $1)`, m-10); err != nil {
		t.Fatal(err)
	}
	ids := h.Insert(t, 1, "a", "a", "a", "a", "a", "a", "a", "a", "a", "a", "a", "a", "a", "a", "a")
	if s, e := seqOf(t, h.pool, ids[0]), seqOf(t, h.pool, ids[len(ids)-1]); s > m || e <= m {
		t.Fatalf("the rows after the set-back run from seq %d to %d; want from below the mark %d to above it", s, e, m)
	}
	readAll(t, h.store, from(1))
	for i, id := range ids {
		if ks := numberOf(t, h, id); ks == nil || *ks != int64(i+1) {
			t.Fatalf("a's row %d after the set-back numbered %v; want %d", i, deref(ks), i+1)
		}
	}
}

// TestWalkFromTheFirstRowWhenAMarkFails: a pending row made unnumbered
// below its partition's mark by hand (its journal entry deleted) is
// numbered again by the next read that finds it with nothing above the
// mark, and otherwise by the partition's walk from its first row, due a
// minute after the last.
func TestWalkFromTheFirstRowWhenAMarkFails(t *testing.T) {
	testkit.RequirePostgres(t)
	h := newHarness(t, false)
	ctx := testkit.Context(t, 30*time.Second)
	ids := h.Insert(t, 1, "a", "a")
	readAll(t, h.store, from(1))
	sampleRead(t, h, 1)
	h.Insert(t, 1, "z")
	readAll(t, h.store, from(1))
	if m, s := markOf(t, h, 1), seqOf(t, h.pool, ids[1]); m <= s {
		t.Fatalf("partition 1's mark is %d; want above a's rows (seq %d)", m, s)
	}
	unjournal := func(id uuid.UUID) {
		t.Helper()
		if tag, err := h.pool.Exec(ctx, `DELETE FROM outbox_numbers WHERE id = $1`, id); err != nil || tag.RowsAffected() != 1 {
			t.Fatalf("delete the journal entry of %s: %v (%d rows)", id, err, tag.RowsAffected())
		}
	}
	unjournal(ids[0])
	readAll(t, h.store, from(1))
	if ks := numberOf(t, h, ids[0]); ks == nil || *ks != 3 {
		t.Fatalf("a's first row, read alone below the mark, numbered %v; want 3", deref(ks))
	}
	// Now found below the mark beside a row above it.
	unjournal(ids[0])
	h.Insert(t, 1, "b")
	readAll(t, h.store, from(1))
	if m, s := markOf(t, h, 1), seqOf(t, h.pool, ids[0]); m < s {
		t.Fatalf("partition 1's mark is %d; the test needs it at or above a's first row (seq %d)", m, s)
	}
	if ks := numberOf(t, h, ids[0]); ks != nil {
		t.Fatalf("a's first row, read below the mark beside a row above it, numbered %d before the walk from the first row", *ks)
	}
	if _, err := h.pool.Exec(ctx, `UPDATE outbox_walk_marks SET full_at = full_at - interval '61 seconds' WHERE partition = 1`); err != nil {
		t.Fatal(err)
	}
	h.Insert(t, 1, "c") // a row above the mark again
	readAll(t, h.store, from(1))
	if ks := numberOf(t, h, ids[0]); ks == nil || *ks != 4 {
		t.Fatalf("a's first row, after the walk from the first row was due, numbered %v; want 4", deref(ks))
	}
}

// TestWalkMarkStaysWithoutASafeSample: the mark does not move when a
// sample cannot bound the writers: the outbox's sequence caches values
// (a backend draws from a range it took before the sample), or the
// numbering runs in a repeatable-read transaction (its snapshot may
// predate the sample).
func TestWalkMarkStaysWithoutASafeSample(t *testing.T) {
	testkit.RequirePostgres(t)
	t.Run("cached sequence", func(t *testing.T) {
		t.Parallel()
		h := newHarness(t, false)
		ctx := testkit.Context(t, 30*time.Second)
		sampleRead(t, h, 1)
		if _, err := h.pool.Exec(ctx, `ALTER TABLE outbox ALTER COLUMN seq SET CACHE 10`); err != nil {
			t.Fatal(err)
		}
		h.Insert(t, 1, "a")
		readAll(t, h.store, from(1))
		if m := markOf(t, h, 1); m != 0 {
			t.Fatalf("with a cached sequence, partition 1's mark is %d; want 0", m)
		}
	})
	t.Run("repeatable read", func(t *testing.T) {
		t.Parallel()
		h := newHarness(t, false)
		ctx := testkit.Context(t, 30*time.Second)
		sampleRead(t, h, 1)
		id := h.Insert(t, 1, "a")[0]
		tx, err := h.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		if _, err := tx.Exec(ctx, `SELECT outbox_journal_rows('n1', ARRAY[1], ARRAY[$1::bigint])`, seqOf(t, h.pool, id)); err != nil {
			t.Fatal(err)
		}
		commit(t, tx)
		if ks := numberOf(t, h, id); ks == nil || *ks != 1 {
			t.Fatalf("a's row numbered %v; want 1", deref(ks))
		}
		if m := markOf(t, h, 1); m != 0 {
			t.Fatalf("after a numbering in a repeatable-read transaction, partition 1's mark is %d; want 0", m)
		}
	})
}
