package pgstore_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/ordo-relay/ordo/admin"
	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/outbox"
	"github.com/ordo-relay/ordo/relay"
	"github.com/ordo-relay/ordo/relay/pgstore"
)

// The partition owner numbers the rows that arrive without key_seq
// (docs/outbox-table.md, "Who numbers a key's rows").

// insertIn inserts one row of key in partition p with the documented
// INSERT, in tx, and returns its id.
func insertIn(t *testing.T, ctx context.Context, tx pgx.Tx, p int, key string) uuid.UUID {
	t.Helper()
	id := uuid.Must(uuid.NewV7())
	if _, err := tx.Exec(ctx, `INSERT INTO outbox (id, partition, correlation_id, exchange, routing_key, type, payload)
		VALUES ($1, $2, $3, 'ex', 'rk', 't', $4)`, id, p, key, json.RawMessage(`{}`)); err != nil {
		t.Fatalf("insert %s in partition %d: %v", key, p, err)
	}
	return id
}

func begin(t *testing.T, h *pgHarness) pgx.Tx {
	t.Helper()
	tx, err := h.pool.Begin(testkit.Context(t, 30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	return tx
}

func commit(t *testing.T, tx pgx.Tx) {
	t.Helper()
	if err := tx.Commit(testkit.Context(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
}

func readAll(t *testing.T, s *pgstore.Store, cursors ...relay.Cursor) []relay.Row {
	t.Helper()
	rows, err := s.ReadPending(testkit.Context(t, 30*time.Second), cursors, 100)
	if err != nil {
		t.Fatalf("ReadPending: %v", err)
	}
	return rows
}

// numberOf returns row id's key_seq, in the row or in the owner's
// journal (nil: numbered nowhere).
func numberOf(t *testing.T, h *pgHarness, id uuid.UUID) *int64 {
	t.Helper()
	var ks *int64
	if err := h.pool.QueryRow(testkit.Context(t, 10*time.Second), `SELECT coalesce(o.key_seq, n.key_seq)
		FROM outbox AS o LEFT JOIN outbox_numbers AS n ON n.id = o.id WHERE o.id = $1`, id).Scan(&ks); err != nil {
		t.Fatalf("key_seq of %s: %v", id, err)
	}
	return ks
}

func byID(rows []relay.Row) map[uuid.UUID]relay.Row {
	out := map[uuid.UUID]relay.Row{}
	for _, r := range rows {
		out[r.ID] = r
	}
	return out
}

// TestNumberingFollowsVisibilityNotXmin is the three-transaction case:
// T2 (the lowest xid) and T1 (the highest) write one key, an unrelated T3
// (between them) stays open. T1 commits first: its row is numbered 1 and
// read at once, although T2 and T3 are open (no stall behind the oldest
// transaction). T2 commits while T3 is still open: its row is numbered 2,
// above T1's, and waits for it. A reader gated on pg_snapshot_xmin would
// read nothing until T3 ends, and then number T2's row (the lower seq)
// first.
func TestNumberingFollowsVisibilityNotXmin(t *testing.T) {
	testkit.RequirePostgres(t)
	h := newHarness(t, false)
	ctx := testkit.Context(t, 30*time.Second)
	t2, t3, t1 := begin(t, h), begin(t, h), begin(t, h)
	idT2 := insertIn(t, ctx, t2, 1, "k") // xid 100, the lower seq
	if _, err := t3.Exec(ctx, `CREATE TEMP TABLE unrelated (x int); INSERT INTO unrelated VALUES (1)`); err != nil {
		t.Fatal(err) // xid 101
	}
	idT1 := insertIn(t, ctx, t1, 1, "k") // xid 102, the higher seq
	var x2, x3, x1 int64
	for _, q := range []struct {
		tx  pgx.Tx
		xid *int64
	}{{t2, &x2}, {t3, &x3}, {t1, &x1}} {
		if err := q.tx.QueryRow(ctx, `SELECT pg_current_xact_id()::text::bigint`).Scan(q.xid); err != nil {
			t.Fatal(err)
		}
	}
	if !(x2 < x3 && x3 < x1) {
		t.Fatalf("xids %d, %d, %d: want T2 < T3 < T1", x2, x3, x1)
	}
	commit(t, t1)

	rows := readAll(t, h.store, from(1))
	if len(rows) != 1 || rows[0].ID != idT1 || rows[0].KeySeq != 1 || rows[0].PrevPending {
		t.Fatalf("with T2 and T3 open, read %+v; want T1's row alone, key_seq 1", rows)
	}
	commit(t, t2)
	rows = readAll(t, h.store, from(1))
	got := byID(rows)
	if len(rows) != 2 || got[idT1].KeySeq != 1 || got[idT2].KeySeq != 2 || !got[idT2].PrevPending || got[idT2].PrevKeySeq != 1 {
		t.Fatalf("with T3 open, read %+v; want T1's row key_seq 1, T2's key_seq 2 waiting for it", rows)
	}
	if rows[0].ID != idT2 {
		t.Fatalf("rows not in seq order: %+v", rows)
	}
}

func from(p int) relay.Cursor { return relay.Cursor{Partition: p} }

// TestNumberingTakesTheKeysEarlierRows: a producer that serialises its
// key (its row committed before the next producer's began) gets commit
// order even when its row lies below the relay's cursor: a tail read that
// finds the key's later row numbers every unnumbered row of the key, in
// seq order.
func TestNumberingTakesTheKeysEarlierRows(t *testing.T) {
	testkit.RequirePostgres(t)
	h := newHarness(t, false)
	ctx := testkit.Context(t, 30*time.Second)
	late := begin(t, h)
	first := insertIn(t, ctx, late, 1, "a") // the lower seq, committed late
	other := begin(t, h)
	b := insertIn(t, ctx, other, 1, "b")
	commit(t, other)
	rows := readAll(t, h.store, from(1))
	if len(rows) != 1 || rows[0].ID != b {
		t.Fatalf("read %+v; want b's row alone", rows)
	}
	cursor := rows[0].Seq
	commit(t, late)
	next := begin(t, h)
	second := insertIn(t, ctx, next, 1, "a")
	commit(t, next)

	rows = readAll(t, h.store, relay.Cursor{Partition: 1, After: cursor})
	if len(rows) != 1 || rows[0].ID != second || rows[0].KeySeq != 2 || !rows[0].PrevPending {
		t.Fatalf("tail read %+v; want a's second row, key_seq 2, waiting for the first", rows)
	}
	rows = readAll(t, h.store, from(1))
	if got := byID(rows); got[first].KeySeq != 1 {
		t.Fatalf("a's first row: %+v; want key_seq 1", got[first])
	}
}

// TestNumberingStopsAtTheRead: a read numbers its partition's rows up to
// the last row it returned, never the backlog above it (so a read's cost
// follows the rows it returns), and the next read goes on with the same
// keys' next numbers.
func TestNumberingStopsAtTheRead(t *testing.T) {
	testkit.RequirePostgres(t)
	h := newHarness(t, false)
	keys := make([]string, 300)
	for i := range keys {
		keys[i] = []string{"a", "b", "c"}[i%3]
	}
	h.Insert(t, 1, keys...)
	ctx := testkit.Context(t, 30*time.Second)
	first, err := h.store.ReadPending(ctx, []relay.Cursor{from(1)}, 10)
	if err != nil || len(first) != 10 {
		t.Fatalf("read %d rows (%v); want 10", len(first), err)
	}
	// The numbers are in the journal, not in the rows.
	var numbered, inRows int
	if err := h.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM outbox_numbers), (SELECT count(*) FROM outbox WHERE key_seq IS NOT NULL)`).
		Scan(&numbered, &inRows); err != nil {
		t.Fatal(err)
	}
	if numbered != 10 || inRows != 0 {
		t.Fatalf("a read of 10 rows numbered %d of the 300 in the journal, %d in the rows; want 10 and 0", numbered, inRows)
	}
	next, err := h.store.ReadPending(ctx, []relay.Cursor{{Partition: 1, After: first[9].Seq}}, 10)
	if err != nil || len(next) != 10 {
		t.Fatalf("next read: %d rows (%v); want 10", len(next), err)
	}
	for i, r := range append(first, next...) {
		if want := int64(i/3 + 1); r.KeySeq != want || r.CorrelationID != keys[i] {
			t.Fatalf("row %d: %s key_seq %d; want %s key_seq %d", i, r.CorrelationID, r.KeySeq, keys[i], want)
		}
	}
}

// TestNumbersSurviveATakeover: a node numbers rows and loses the
// partition before it publishes them; the next owner reads the same
// key_seq and the same row below. The node that lost it numbers nothing
// more: a row committed after the takeover is numbered by the new owner.
func TestNumbersSurviveATakeover(t *testing.T) {
	testkit.RequirePostgres(t)
	h := newHarness(t, false)
	ids := h.Insert(t, 1, "a", "b", "a")
	before := readAll(t, h.store, from(1))
	if len(before) != 3 {
		t.Fatalf("n1 read %+v; want 3 rows", before)
	}
	h.Grant(t, "n2", 1)
	n2 := pgstore.New(h.pool, "n2", nil)
	after := readAll(t, n2, from(1))
	if len(after) != len(before) {
		t.Fatalf("n2 read %d rows; n1 read %d", len(after), len(before))
	}
	for i := range before {
		a, b := after[i], before[i]
		if a.ID != b.ID || a.KeySeq != b.KeySeq || a.PrevKeySeq != b.PrevKeySeq || a.PrevPending != b.PrevPending {
			t.Fatalf("row %d: n1 read %+v, n2 %+v", i, b, a)
		}
	}
	late := h.Insert(t, 1, "a")
	if rows := readAll(t, h.store, from(1)); len(rows) != 3 {
		t.Fatalf("n1, no longer the owner, read %+v; want the 3 numbered rows only", rows)
	}
	if ks := numberOf(t, h, late[0]); ks != nil {
		t.Fatalf("n1 numbered a row of a partition it no longer holds: key_seq %d", *ks)
	}
	got := byID(readAll(t, n2, from(1)))
	if got[late[0]].KeySeq != 3 || got[ids[2]].KeySeq != 2 {
		t.Fatalf("n2 numbered a's late row %+v (a's second: %+v); want key_seq 3 above 2", got[late[0]], got[ids[2]])
	}
}

// TestOldNodeTakesOverJournaledRows: a relay older than the journal
// numbers rows with outbox_number_rows and reads key_seq from the row.
// Taking over a partition whose rows n1 numbered in the journal, it gets
// those numbers written into the rows (not new ones), the journal
// entries go, and the partition's rows n1 had not read are numbered after
// them.
func TestOldNodeTakesOverJournaledRows(t *testing.T) {
	testkit.RequirePostgres(t)
	h := newHarness(t, false)
	ctx := testkit.Context(t, 30*time.Second)
	ids := h.Insert(t, 1, "a", "b", "a")
	read := byID(readAll(t, h.store, from(1)))
	late := h.Insert(t, 1, "a", "b")
	h.Grant(t, "old", 1)
	var numbered int64
	if err := h.pool.QueryRow(ctx, `SELECT outbox_number_rows('old', '{1}', NULL)`).Scan(&numbered); err != nil || numbered != 2 {
		t.Fatalf("outbox_number_rows numbered %d rows (%v); want the 2 rows n1 had not read", numbered, err)
	}
	inRow := func(id uuid.UUID) int64 {
		t.Helper()
		var ks *int64
		if err := h.pool.QueryRow(ctx, `SELECT key_seq FROM outbox WHERE id = $1`, id).Scan(&ks); err != nil || ks == nil {
			t.Fatalf("row %s: key_seq %v (%v); want it in the row", id, ks, err)
		}
		return *ks
	}
	for _, id := range ids {
		if got := inRow(id); got != read[id].KeySeq {
			t.Fatalf("row %s: key_seq %d in the row, n1 read it as %d", id, got, read[id].KeySeq)
		}
	}
	if a, b := inRow(late[0]), inRow(late[1]); a != 3 || b != 2 {
		t.Fatalf("the rows n1 had not read: a %d, b %d; want 3 and 2", a, b)
	}
	var left int
	if err := h.pool.QueryRow(ctx, `SELECT count(*) FROM outbox_numbers`).Scan(&left); err != nil || left != 0 {
		t.Fatalf("%d journal entries left (%v); want none", left, err)
	}
}

// TestTwoNumberingsOfOnePartitionTakeTurns: two reads of one node number
// a partition at once (the read and a peek, say). The second waits for the
// first and then finds the rows numbered: it numbers nothing, fails with
// nothing, and the key's counter moved once. Without the per-partition
// lock both counted the same rows, and the second failed on the journal's
// primary key.
func TestTwoNumberingsOfOnePartitionTakeTurns(t *testing.T) {
	testkit.RequirePostgres(t)
	h := newHarness(t, false)
	ctx := testkit.Context(t, 30*time.Second)
	h.Insert(t, 4, "a", "a", "b")
	first, err := h.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Rollback(ctx)
	var n int64
	if err := first.QueryRow(ctx, `SELECT outbox_journal_rows('n1', '{4}', NULL)`).Scan(&n); err != nil || n != 3 {
		t.Fatalf("first numbering: %d rows (%v), want 3", n, err)
	}
	second := make(chan error, 1)
	var got int64
	go func() {
		second <- h.pool.QueryRow(ctx, `SELECT outbox_journal_rows('n1', '{4}', NULL)`).Scan(&got)
	}()
	testkit.WaitFor(t, 10*time.Second, "the second numbering waiting for the first", func() bool {
		var waiting bool
		err := h.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%outbox_journal_rows%')`).Scan(&waiting)
		return err == nil && waiting
	})
	if err := first.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-second; err != nil || got != 0 {
		t.Fatalf("second numbering: %d rows (%v), want 0 and no error", got, err)
	}
	var last int64
	if err := h.pool.QueryRow(ctx, `SELECT last_key_seq FROM outbox_keys WHERE correlation_id = 'a'`).Scan(&last); err != nil || last != 2 {
		t.Fatalf("a's counter at %d (%v), want 2", last, err)
	}
}

// TestMarkLeavesTheNumberInTheJournal: the mark sets processed_at and
// leaves the row's journaled key_seq where it is (written into the row,
// it made the row's WAL record carry most of the row); a later row of
// the key is numbered above it and reads it as its prev, published; the
// retention that deletes the row deletes its entry, and the later row
// still reads as before.
func TestMarkLeavesTheNumberInTheJournal(t *testing.T) {
	testkit.RequirePostgres(t)
	h := newHarness(t, false)
	ctx := testkit.Context(t, 30*time.Second)
	epoch := h.Grant(t, "n1", 2)
	ids := h.Insert(t, 2, "k", "k")
	rows := readAll(t, h.store, from(2))
	if len(rows) != 2 || rows[1].KeySeq != 2 || !rows[1].PrevPending {
		t.Fatalf("read %+v; want k's two rows, the second waiting for the first", rows)
	}
	marked, err := h.store.MarkPublished(ctx, []relay.Settled{{ID: ids[0], Partition: 2, Epoch: epoch}})
	if err != nil || len(marked) != 1 {
		t.Fatalf("MarkPublished = %v, %v", marked, err)
	}
	var inRow, journaled *int64
	if err := h.pool.QueryRow(ctx, `SELECT o.key_seq, n.key_seq FROM outbox AS o LEFT JOIN outbox_numbers AS n ON n.id = o.id
		WHERE o.id = $1 AND o.processed_at IS NOT NULL`, ids[0]).Scan(&inRow, &journaled); err != nil || inRow != nil || journaled == nil || *journaled != 1 {
		t.Fatalf("the marked row: key_seq %v in the row, %v in the journal (%v); want none and 1", inRow, journaled, err)
	}
	after := relay.Cursor{Partition: 2, After: rows[0].Seq}
	rows = readAll(t, h.store, after)
	if len(rows) != 1 || rows[0].ID != ids[1] || rows[0].KeySeq != 2 || rows[0].PrevPending {
		t.Fatalf("read after the mark %+v; want k's second row, key_seq 2, its prev published", rows)
	}
	if prev, err := h.store.PrevKeySeq(ctx, "k", 2); err != nil || prev != 1 {
		t.Fatalf("PrevKeySeq(k, 2) = %d, %v; want 1", prev, err)
	}
	deleted, err := h.store.DeleteProcessed(ctx, 2, epoch, 0, 10)
	if err != nil || deleted != 1 {
		t.Fatalf("DeleteProcessed = %d, %v; want the marked row", deleted, err)
	}
	var left int
	if err := h.pool.QueryRow(ctx, `SELECT count(*) FROM outbox_numbers WHERE id = $1`, ids[0]).Scan(&left); err != nil || left != 0 {
		t.Fatalf("%d journal entries of the deleted row left (%v); want none", left, err)
	}
	rows = readAll(t, h.store, after)
	if len(rows) != 1 || rows[0].ID != ids[1] || rows[0].KeySeq != 2 || rows[0].PrevPending {
		t.Fatalf("read after retention %+v; want k's second row, key_seq 2, its prev gone (published)", rows)
	}
}

// TestProducersDeadAtIsNotASkip: once DropKeySeqTrigger has dropped
// outbox_dead_is_processed, nothing refuses a dead_at a producer writes,
// and the relay does not take it for an operator's skip: the mark clears
// it, so the key's next row names the published row as its prev, and the
// purge leaves a pending row that carries one (here parked, the row held
// behind it deleted by hand, which lets the purge take a skipped row).
func TestProducersDeadAtIsNotASkip(t *testing.T) {
	testkit.RequirePostgres(t)
	h := newHarness(t, false)
	ctx := testkit.Context(t, 30*time.Second)
	if on, err := outbox.DeadCheckInstalled(ctx, h.pool); err != nil || on {
		t.Fatalf("outbox_dead_is_processed installed after the drop: %v, %v", on, err)
	}
	epoch := h.Grant(t, "n1", 2)
	insertDead := func(key string) uuid.UUID {
		t.Helper()
		id := uuid.Must(uuid.NewV7())
		if _, err := h.pool.Exec(ctx, `INSERT INTO outbox (id, partition, correlation_id, exchange, routing_key, type, payload, dead_at)
			VALUES ($1, 2, $2, 'ex', 'rk', 't', '{}', clock_timestamp())`, id, key); err != nil {
			t.Fatalf("a producer's row with dead_at: %v", err)
		}
		return id
	}

	first := insertDead("d")
	second := h.Insert(t, 2, "d")[0]
	rows := readAll(t, h.store, from(2))
	if len(rows) != 2 || rows[0].ID != first || rows[0].KeySeq != 1 || rows[1].ID != second || !rows[1].PrevPending {
		t.Fatalf("read %+v; want d's two rows, the second waiting for the first", rows)
	}
	if marked, err := h.store.MarkPublished(ctx, []relay.Settled{{ID: first, Partition: 2, Epoch: epoch}}); err != nil || len(marked) != 1 {
		t.Fatalf("MarkPublished = %v, %v", marked, err)
	}
	var dead bool
	if err := h.pool.QueryRow(ctx, `SELECT dead_at IS NOT NULL FROM outbox WHERE id = $1`, first).Scan(&dead); err != nil || dead {
		t.Fatalf("the published row: dead %v (%v); want its dead_at cleared by the mark", dead, err)
	}
	rows = readAll(t, h.store, relay.Cursor{Partition: 2, After: rows[0].Seq})
	if len(rows) != 1 || rows[0].ID != second || rows[0].PrevPending || rows[0].PrevDead {
		t.Fatalf("read after the mark %+v; want d's second row, its prev published, not skipped", rows)
	}
	if prev, err := h.store.PrevKeySeq(ctx, "d", 2); err != nil || prev != 1 {
		t.Fatalf("PrevKeySeq(d, 2) = %d, %v; want 1: the row below was published", prev, err)
	}

	parked := insertDead("p")
	behind := h.Insert(t, 2, "p")[0]
	rows = readAll(t, h.store, relay.Cursor{Partition: 2, After: rows[0].Seq})
	if len(rows) != 2 || rows[0].ID != parked {
		t.Fatalf("read %+v; want p's two rows", rows)
	}
	if got, err := h.store.RecordFailures(ctx, []relay.Settled{{ID: parked, Partition: 2, Epoch: epoch}}, 1); err != nil || len(got) != 1 {
		t.Fatalf("RecordFailures = %v, %v; want p's first row parked", got, err)
	}
	if _, err := h.pool.Exec(ctx, `DELETE FROM outbox WHERE id = $1`, behind); err != nil {
		t.Fatal(err)
	}
	n, err := admin.NewStore(h.pool).Purge(ctx, admin.Actor{Operator: "test", RemoteAddr: "local"})
	if err != nil || n != 0 {
		t.Fatalf("Purge = %d, %v; want nothing purged: the one row with dead_at is pending", n, err)
	}
	if st := h.State(t, parked); !st.Parked {
		t.Fatalf("p's parked row after the purge: %+v; want it there, parked", st)
	}
}

// TestPurgeStepsOverAJournaledRow: a skipped row may be purged once a
// later row of its key is published, and the later row's key_seq stays
// in the owner's journal after its mark. Counting every journaled number
// above as pending, the purge kept the skipped row for ever.
func TestPurgeStepsOverAJournaledRow(t *testing.T) {
	testkit.RequirePostgres(t)
	h := newHarness(t, false)
	ctx := testkit.Context(t, 30*time.Second)
	epoch := h.Grant(t, "n1", 2)
	ops := admin.NewStore(h.pool)
	who := admin.Actor{Operator: "test", RemoteAddr: "local"}
	skipped := h.Insert(t, 2, "s")[0]
	if rows := readAll(t, h.store, from(2)); len(rows) != 1 || rows[0].KeySeq != 1 {
		t.Fatalf("read %+v; want s's row, key_seq 1", rows)
	}
	if got, err := h.store.RecordFailures(ctx, []relay.Settled{{ID: skipped, Partition: 2, Epoch: epoch}}, 1); err != nil || len(got) != 1 {
		t.Fatalf("RecordFailures = %v, %v; want s's row parked", got, err)
	}
	if err := ops.Skip(ctx, who, skipped); err != nil {
		t.Fatal(err)
	}
	if n, err := ops.Purge(ctx, who); err != nil || n != 0 {
		t.Fatalf("Purge = %d, %v; want nothing: no later row of s is published", n, err)
	}
	later := h.Insert(t, 2, "s")[0]
	rows := readAll(t, h.store, from(2))
	if len(rows) != 1 || rows[0].ID != later || rows[0].KeySeq != 2 || !rows[0].PrevDead {
		t.Fatalf("read %+v; want s's second row, key_seq 2, above the skipped one", rows)
	}
	if n, err := ops.Purge(ctx, who); err != nil || n != 0 {
		t.Fatalf("Purge = %d, %v; want nothing: s's later row is pending", n, err)
	}
	if marked, err := h.store.MarkPublished(ctx, []relay.Settled{{ID: later, Partition: 2, Epoch: epoch}}); err != nil || len(marked) != 1 {
		t.Fatalf("MarkPublished = %v, %v", marked, err)
	}
	if n, err := ops.Purge(ctx, who); err != nil || n != 1 {
		t.Fatalf("Purge = %d, %v; want the skipped row: s's later row is published", n, err)
	}
}

// TestRowInTheWrongPartitionIsParked: a key's row in a partition other
// than its earlier rows' is parked, unnumbered, with the reason; the
// partition's other keys go on, and the key's own rows are untouched.
func TestRowInTheWrongPartitionIsParked(t *testing.T) {
	testkit.RequirePostgres(t)
	h := newHarness(t, false)
	good := h.Insert(t, 1, "a")
	readAll(t, h.store, from(1)) // numbers a in partition 1
	stray := h.Insert(t, 2, "a", "b")
	rows := readAll(t, h.store, from(2))
	if len(rows) != 1 || rows[0].ID != stray[1] || rows[0].KeySeq != 1 {
		t.Fatalf("read %+v; want b's row alone, key_seq 1 (a's stray row parked: reads leave it out)", rows)
	}
	st := h.State(t, stray[0])
	if !st.Parked || !strings.Contains(st.LastError, "belongs to partition 1") || !strings.Contains(st.LastError, "partition 2") {
		t.Fatalf("stray row: parked %v, reason %q", st.Parked, st.LastError)
	}
	if a := byID(readAll(t, h.store, from(1)))[good[0]]; a.KeySeq != 1 || a.Parked {
		t.Fatalf("a's row in its partition: %+v", a)
	}
	// The operator lists it (key_seq 0: none) and skips it; the key's
	// rows go on from where they were.
	ctx := testkit.Context(t, 30*time.Second)
	ops := admin.NewStore(h.pool)
	parked, err := ops.ListParked(ctx, 10)
	if err != nil || len(parked) != 1 || parked[0].ID != stray[0] || parked[0].KeySeq != 0 {
		t.Fatalf("ListParked = %+v, %v; want the stray row, key_seq 0", parked, err)
	}
	if err := ops.Skip(ctx, admin.Actor{Operator: "test", RemoteAddr: "local"}, stray[0]); err != nil {
		t.Fatal(err)
	}
	next := h.Insert(t, 1, "a")
	if got := byID(readAll(t, h.store, from(1)))[next[0]]; got.KeySeq != 2 || got.PrevKeySeq != 1 {
		t.Fatalf("a's next row after the skip: %+v; want key_seq 2 above 1", got)
	}
}

// TestBadRowsAreParkedAtNumbering: a row the key_seq trigger would have
// refused (lengths, headers) is parked with the reason instead.
func TestBadRowsAreParkedAtNumbering(t *testing.T) {
	testkit.RequirePostgres(t)
	h := newHarness(t, false)
	ctx := testkit.Context(t, 30*time.Second)
	long := strings.Repeat("x", 256)
	bad := map[string]string{}
	for want, cols := range map[string][3]string{
		"correlation_id must be 1 to 255 bytes": {"", "rk", "{}"},
		"routing_key is longer than 255 bytes":  {"k1", long, "{}"},
		"headers must be a JSON object":         {"k2", "rk", "[]"},
	} {
		id := uuid.Must(uuid.NewV7())
		if _, err := h.pool.Exec(ctx, `INSERT INTO outbox (id, partition, correlation_id, exchange, routing_key, type, payload, headers)
			VALUES ($1, 3, $2, 'ex', $3, 't', '{}', $4::jsonb)`, id, cols[0], cols[1], cols[2]); err != nil {
			t.Fatal(err)
		}
		bad[id.String()] = want
	}
	ok := h.Insert(t, 3, "k3")
	rows := readAll(t, h.store, from(3))
	if len(rows) != 1 || rows[0].ID != ok[0] || rows[0].KeySeq != 1 {
		t.Fatalf("read %+v; want the good row alone, key_seq 1 (the bad ones parked: reads leave them out)", rows)
	}
	for id, want := range bad {
		numbered := numberOf(t, h, uuid.MustParse(id)) != nil
		if st := h.State(t, uuid.MustParse(id)); !st.Parked || numbered || !strings.Contains(st.LastError, want) {
			t.Errorf("bad row (%s): parked %v, numbered %v, reason %q", want, st.Parked, numbered, st.LastError)
		}
	}
}

// TestDropKeySeqTriggerWaitsForOldNodes: the trigger goes only once every
// node holding a lease has recorded that it numbers rows (a relay does,
// before its first read); until then the refusal names the others.
func TestDropKeySeqTriggerWaitsForOldNodes(t *testing.T) {
	testkit.RequirePostgres(t)
	h := newHarness(t, true)
	ctx := testkit.Context(t, 30*time.Second)
	h.Grant(t, "old", 1)
	h.Grant(t, "n1", 2)
	err := outbox.DropKeySeqTrigger(ctx, h.pool)
	if !errors.Is(err, outbox.ErrOldNodesRunning) || !strings.Contains(err.Error(), "n1, old") {
		t.Fatalf("drop with n1 and old unrecorded: %v; want ErrOldNodesRunning naming both", err)
	}
	readAll(t, h.store, from(2)) // n1 records itself
	err = outbox.DropKeySeqTrigger(ctx, h.pool)
	if !errors.Is(err, outbox.ErrOldNodesRunning) || strings.Contains(err.Error(), "n1") || !strings.Contains(err.Error(), "old") {
		t.Fatalf("drop with old unrecorded: %v; want ErrOldNodesRunning naming old alone", err)
	}
	if _, err := h.pool.Exec(ctx, `UPDATE ordo_leases SET expires_at = clock_timestamp() WHERE owner = 'old'`); err != nil {
		t.Fatal(err)
	}
	// r1 numbers rows but is of release 1: it may still read through
	// outbox_pending_by_partition, which stays while it holds a lease.
	if _, err := h.pool.Exec(ctx, `INSERT INTO ordo_numbering_nodes (node, release) VALUES ('r1', 1)`); err != nil {
		t.Fatal(err)
	}
	h.Grant(t, "r1", 3)
	if err := outbox.DropKeySeqTrigger(ctx, h.pool); err != nil {
		t.Fatalf("drop once old's lease expired: %v", err)
	}
	if on, err := outbox.KeySeqTriggerInstalled(ctx, h.pool); err != nil || on {
		t.Fatalf("trigger installed after the drop: %v, %v", on, err)
	}
	users, err := outbox.PendingIndexUsers(ctx, h.pool)
	if on, ierr := outbox.PendingIndexInstalled(ctx, h.pool); err != nil || ierr != nil || !on || !slices.Equal(users, []string{"r1"}) {
		t.Fatalf("with r1 (release 1) holding a lease: pending index installed %v (%v), users %q (%v); want it kept for r1", on, ierr, users, err)
	}
	if _, err := h.pool.Exec(ctx, `UPDATE ordo_leases SET expires_at = clock_timestamp() WHERE owner = 'r1'`); err != nil {
		t.Fatal(err)
	}
	// r2 is of release 2: it reads no pending index, but its mark keeps a
	// dead_at a producer wrote, so outbox_dead_is_processed stays for it.
	if _, err := h.pool.Exec(ctx, `INSERT INTO ordo_numbering_nodes (node, release) VALUES ('r2', 2)`); err != nil {
		t.Fatal(err)
	}
	h.Grant(t, "r2", 4)
	if err := outbox.DropKeySeqTrigger(ctx, h.pool); err != nil {
		t.Fatalf("a second drop: %v", err)
	}
	if on, err := outbox.PendingIndexInstalled(ctx, h.pool); err != nil || on {
		t.Fatalf("pending index installed after r1's lease expired: %v, %v; want it dropped", on, err)
	}
	users, err = outbox.DeadCheckUsers(ctx, h.pool)
	if on, ierr := outbox.DeadCheckInstalled(ctx, h.pool); err != nil || ierr != nil || !on || !slices.Equal(users, []string{"r2"}) {
		t.Fatalf("with r2 (release 2) holding a lease: dead check installed %v (%v), users %q (%v); want it kept for r2", on, ierr, users, err)
	}
	if _, err := h.pool.Exec(ctx, `UPDATE ordo_leases SET expires_at = clock_timestamp() WHERE owner = 'r2'`); err != nil {
		t.Fatal(err)
	}
	if err := outbox.DropKeySeqTrigger(ctx, h.pool); err != nil {
		t.Fatalf("a third drop: %v", err)
	}
	if on, err := outbox.DeadCheckInstalled(ctx, h.pool); err != nil || on {
		t.Fatalf("dead check installed after r2's lease expired: %v, %v; want it dropped", on, err)
	}
	// A producer's INSERT now gets no key_seq; the owner numbers it.
	var ks *int64
	err = h.pool.QueryRow(ctx, `INSERT INTO outbox (id, partition, correlation_id, exchange, routing_key, type, payload)
		VALUES ($1, 2, 'z', 'ex', 'rk', 't', '{}') RETURNING key_seq`, uuid.Must(uuid.NewV7())).Scan(&ks)
	if err != nil || ks != nil {
		t.Fatalf("RETURNING key_seq without the trigger: %v, %v; want NULL", ks, err)
	}
	if rows := readAll(t, h.store, from(2)); len(rows) != 1 || rows[0].KeySeq != 1 {
		t.Fatalf("read %+v; want z numbered 1", rows)
	}
}

// listening runs h's Listen until the test ends and returns its wake-ups
// (partitions; -1 for a connect) and an arm of partition 1, which waits
// until Listen is connected.
func listening(t *testing.T, h *pgHarness) (woke chan int, arm func() []int) {
	t.Helper()
	ctx, cancel := context.WithCancel(testkit.Context(t, 60*time.Second))
	woke = make(chan int, 64)
	done := make(chan error, 1)
	go func() {
		done <- h.store.Listen(ctx, func(p int) {
			select {
			case woke <- p:
			default:
			}
		})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Listen: %v", err)
		}
	})
	arm = func() []int {
		t.Helper()
		var got []int
		var err error
		testkit.WaitFor(t, 10*time.Second, "Listen connected", func() bool {
			got, err = h.store.Arm(testkit.Context(t, 10*time.Second), []int{1})
			return !errors.Is(err, pgstore.ErrNotListening)
		})
		if err != nil {
			t.Fatalf("Arm: %v", err)
		}
		return got
	}
	return woke, arm
}

// wokenUp waits for partition 1's wake-up after what.
func wokenUp(t *testing.T, woke chan int, what string) {
	t.Helper()
	began := time.Now()
	select {
	case p := <-woke:
		if p != 1 {
			t.Fatalf("%s: woke %d; want 1", what, p)
		}
		t.Logf("%s: woken after %v", what, time.Since(began))
	case <-time.After(30 * time.Second):
		t.Fatalf("%s: partition 1 not woken", what)
	}
}

// drainWakes drops the wake-ups so far (Listen's connect).
func drainWakes(woke chan int) {
	for len(woke) > 0 {
		<-woke
	}
}

// TestArmWaitsForOpenProducers: without the trigger, an arm succeeds only
// once no producer's transaction that wrote to the outbox is open (its
// row, committed after the relay's last read, would wake nobody), and an
// armed partition is woken by the next insert, which moves the sequence.
func TestArmWaitsForOpenProducers(t *testing.T) {
	testkit.RequirePostgres(t)
	h := newHarness(t, false)
	woke, arm := listening(t, h)
	open := begin(t, h)
	insertIn(t, testkit.Context(t, 30*time.Second), open, 1, "a")
	if got := arm(); len(got) != 0 {
		t.Fatalf("armed %v while a producer's transaction is open; want none", got)
	}
	commit(t, open)
	if got := arm(); len(got) != 1 {
		t.Fatalf("armed %v once the producer committed; want [1]", got)
	}
	drainWakes(woke)
	h.Insert(t, 1, "b")
	wokenUp(t, woke, "an insert into an armed partition")
}

// TestArmedPartitionsWokenOnceTheTriggerIsDropped: a partition armed
// while the key_seq trigger is installed is woken by the trigger's
// notification. Once the trigger is dropped with Listen running, no
// producer notifies: Listen finds the trigger gone and wakes the
// partitions it armed under it, and an arm after that watches the
// sequence, so the next insert wakes its partition too.
func TestArmedPartitionsWokenOnceTheTriggerIsDropped(t *testing.T) {
	testkit.RequirePostgres(t)
	h := newHarness(t, true)
	woke, arm := listening(t, h)
	armed := func() {
		t.Helper()
		if got := arm(); len(got) != 1 {
			t.Fatalf("armed %v; want [1]", got)
		}
		drainWakes(woke)
	}
	armed()
	h.Insert(t, 1, "a")
	wokenUp(t, woke, "an insert under the trigger")

	armed()
	if err := outbox.DropKeySeqTrigger(testkit.Context(t, 30*time.Second), h.pool); err != nil {
		t.Fatal(err)
	}
	h.Insert(t, 1, "b")
	wokenUp(t, woke, "an insert after the trigger was dropped")

	armed()
	h.Insert(t, 1, "c")
	wokenUp(t, woke, "an insert into a partition armed again")
}
