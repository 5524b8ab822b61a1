package tablesource_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/lease"
	"github.com/ordo-relay/ordo/outbox"
	"github.com/ordo-relay/ordo/partition"
	"github.com/ordo-relay/ordo/relay"
	"github.com/ordo-relay/ordo/relay/tablesource"
)

const storeParts = 4

// adoptedDB is the article's table with Ordo's tables beside it (leases
// and tablesource's), every partition held by node n1 at epoch 1.
func adoptedDB(t testing.TB) *pgxpool.Pool {
	t.Helper()
	pool := articleDB(t)
	ctx := testkit.Context(t, 30*time.Second)
	if err := lease.Migrate(ctx, pool, storeParts); err != nil {
		t.Fatal(err)
	}
	if err := tablesource.Migrate(ctx, pool, storeParts); err != nil {
		t.Fatal(err)
	}
	if err := tablesource.Migrate(ctx, pool, storeParts); err != nil {
		t.Fatalf("migrate again: %v", err)
	}
	var pm *outbox.PartitionMismatchError
	if err := tablesource.Migrate(ctx, pool, 2*storeParts); !errors.As(err, &pm) || pm.Installed != storeParts {
		t.Fatalf("migrate with another partition count: %v, want the installed count's mismatch", err)
	}
	holdAll(t, pool, "n1", 1)
	return pool
}

// holdAll gives every partition's lease to node at epoch.
func holdAll(t testing.TB, pool *pgxpool.Pool, node string, epoch int64) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), `UPDATE ordo_leases SET owner = $1, epoch = $2, expires_at = clock_timestamp() + interval '1 hour'`, node, epoch); err != nil {
		t.Fatal(err)
	}
}

func newStore(t *testing.T, pool *pgxpool.Pool, node string) (*tablesource.Store, *tablesource.Intake) {
	t.Helper()
	logger := testkit.Logger(t, slog.LevelError)
	s, err := tablesource.NewStore(pool, node, tablesource.Article(), "bookstore.ordering", logger)
	if err != nil {
		t.Fatal(err)
	}
	r, err := tablesource.NewReader(tablesource.Article(), storeParts)
	if err != nil {
		t.Fatal(err)
	}
	return s, tablesource.NewIntake(pool, node, r, logger)
}

// readAll reads every partition from the start.
func readAll(t *testing.T, s *tablesource.Store) []relay.Row {
	t.Helper()
	cursors := make([]relay.Cursor, storeParts)
	for p := range cursors {
		cursors[p] = relay.Cursor{Partition: p}
	}
	rows, err := s.ReadPending(testkit.Context(t, 30*time.Second), cursors, 100)
	if err != nil {
		t.Fatal(err)
	}
	return rows
}

func byID(rows []relay.Row) map[uuid.UUID]relay.Row {
	m := map[uuid.UUID]relay.Row{}
	for _, r := range rows {
		m[r.ID] = r
	}
	return m
}

func take(t *testing.T, in *tablesource.Intake, sweep bool) int {
	t.Helper()
	n, err := in.Pass(testkit.Context(t, 30*time.Second), sweep)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// takeUnnumbered takes every pending row of the article's table in
// without numbers, as the intake of an earlier release did: the
// partition's owner numbers them when it reads them. It returns how many
// it took in.
func takeUnnumbered(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	ctx := testkit.Context(t, 30*time.Second)
	r, err := tablesource.NewReader(tablesource.Article(), storeParts)
	if err != nil {
		t.Fatal(err)
	}
	rows, err := r.Pending(ctx, pool, nil, 10000)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, row := range rows {
		var problem *string
		if row.Problem != nil {
			p := row.Problem.Error()
			problem = &p
		}
		tag, err := pool.Exec(ctx, `INSERT INTO ordo_table_rows (id, partition, key, occurred_at, problem)
			VALUES ($1, $2, $3, $4, $5) ON CONFLICT (id) DO NOTHING`, row.ID, row.Partition, row.Key, row.OccurredAt, problem)
		if err != nil {
			t.Fatal(err)
		}
		n += int(tag.RowsAffected())
	}
	return n
}

func settled(rows ...relay.Row) []relay.Settled {
	out := make([]relay.Settled, len(rows))
	for i, r := range rows {
		out[i] = relay.Settled{ID: r.ID, Partition: r.Partition, Epoch: 1}
	}
	return out
}

func processedAt(t *testing.T, pool *pgxpool.Pool, id uuid.UUID) *time.Time {
	t.Helper()
	var at *time.Time
	if err := pool.QueryRow(context.Background(), `SELECT "ProcessedAt" FROM "OutboxMessages" WHERE "Id" = $1`, id).Scan(&at); err != nil {
		t.Fatal(err)
	}
	return at
}

func keySeqInDB(t *testing.T, pool *pgxpool.Pool, id uuid.UUID) *int64 {
	t.Helper()
	var ks *int64
	if err := pool.QueryRow(context.Background(), `SELECT key_seq FROM ordo_table_rows WHERE id = $1`, id).Scan(&ks); err != nil {
		t.Fatal(err)
	}
	return ks
}

// TestStoreNumbersAndMarks: a key's rows, inserted out of their
// occurred-at order, are numbered in that order, durably, and come with
// the message the article's consumers expect; a row whose correlation id
// is null is a key of its own, keyed by its id. The mark sets
// "ProcessedAt" and frees the next row.
func TestStoreNumbersAndMarks(t *testing.T) {
	t.Parallel()
	pool := adoptedDB(t)
	s, in := newStore(t, pool, "n1")
	t0 := time.Now().Add(-time.Minute).Truncate(time.Microsecond)
	ids := []uuid.UUID{uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7())}
	insert(t, pool,
		msg{id: ids[0], corr: ptr("order-1"), at: t0.Add(2 * time.Second)},
		msg{id: ids[1], corr: ptr("order-1"), at: t0},
		msg{id: ids[2], corr: ptr("order-1"), at: t0.Add(time.Second)},
		msg{id: ids[3], at: t0})
	if n := take(t, in, true); n != 4 {
		t.Fatalf("took in %d rows, want 4", n)
	}
	if n := take(t, in, true); n != 0 {
		t.Fatalf("a second sweep took in %d rows, want 0", n)
	}
	got := byID(readAll(t, s))
	want := map[uuid.UUID]int64{ids[1]: 1, ids[2]: 2, ids[0]: 3, ids[3]: 1}
	for id, ks := range want {
		r, ok := got[id]
		if !ok {
			t.Fatalf("row %s not read; got %v", id, got)
		}
		if r.KeySeq != ks || r.PrevKeySeq != ks-1 || r.PrevPending != (ks > 1) {
			t.Errorf("row %s: key_seq %d prev %d prev pending %v, want %d, %d, %v", id, r.KeySeq, r.PrevKeySeq, r.PrevPending, ks, ks-1, ks > 1)
		}
		if r.Exchange != "bookstore.ordering" || r.Type != "OrderPlaced" || r.RoutingKey != "order.placed" || !strings.Contains(string(r.Payload), `"orderId"`) {
			t.Errorf("row %s: message %q %q %q %s", id, r.Exchange, r.Type, r.RoutingKey, r.Payload)
		}
		if ks := keySeqInDB(t, pool, id); ks == nil || *ks != want[id] {
			t.Errorf("row %s: key_seq in the database %v, want %d", id, ks, want[id])
		}
	}
	if got[ids[3]].CorrelationID != ids[3].String() {
		t.Errorf("a row without correlation id is keyed %q, want its id", got[ids[3]].CorrelationID)
	}
	marked, err := s.MarkPublished(testkit.Context(t, 30*time.Second), settled(got[ids[1]]))
	if err != nil || len(marked) != 1 {
		t.Fatalf("mark: %v %v", marked, err)
	}
	if processedAt(t, pool, ids[1]) == nil {
		t.Fatal(`"ProcessedAt" not set by the mark`)
	}
	after := byID(readAll(t, s))
	if _, ok := after[ids[1]]; ok {
		t.Error("a marked row is read again")
	}
	if r := after[ids[2]]; r.PrevPending || r.KeySeq != 2 {
		t.Errorf("the next row after the mark: key_seq %d prev pending %v, want 2, false", r.KeySeq, r.PrevPending)
	}
	if n := take(t, in, true); n != 0 {
		t.Fatalf("a sweep after the mark took in %d rows, want 0", n)
	}
}

// TestStoreNumbersOnlyUnderTheLease: a node that does not hold the
// partition numbers nothing (its read returns nothing) of the rows an
// intake of an earlier release took in unnumbered, and a mark at a stale
// epoch sets no "ProcessedAt".
func TestStoreNumbersOnlyUnderTheLease(t *testing.T) {
	t.Parallel()
	pool := adoptedDB(t)
	s1, _ := newStore(t, pool, "n1")
	s2, _ := newStore(t, pool, "n2")
	id := uuid.Must(uuid.NewV7())
	insert(t, pool, msg{id: id, corr: ptr("k"), at: time.Now()})
	takeUnnumbered(t, pool)
	if rows := readAll(t, s2); len(rows) != 0 {
		t.Fatalf("node n2, holding nothing, read %d rows", len(rows))
	}
	if ks := keySeqInDB(t, pool, id); ks != nil {
		t.Fatalf("node n2, holding nothing, numbered the row: key_seq %d", *ks)
	}
	rows := readAll(t, s1)
	if len(rows) != 1 || rows[0].KeySeq != 1 {
		t.Fatalf("n1 read %+v, want the row numbered 1", rows)
	}
	holdAll(t, pool, "n1", 2) // a new epoch: the row was read under 1
	marked, err := s1.MarkPublished(testkit.Context(t, 30*time.Second), settled(rows[0]))
	if err != nil {
		t.Fatal(err)
	}
	if len(marked) != 0 || processedAt(t, pool, id) != nil {
		t.Fatalf("a mark at a stale epoch marked %v (ProcessedAt %v)", marked, processedAt(t, pool, id))
	}
	parked, err := s1.RecordFailures(testkit.Context(t, 30*time.Second), settled(rows[0]), 1)
	if err != nil || len(parked) != 0 {
		t.Fatalf("a failure at a stale epoch parked %v (%v)", parked, err)
	}
}

// TestStoreLateRow: a row that commits after later rows of its key were
// numbered is missed by the fast pass, found by the sweep, numbered after
// them and counted late; it is published, not lost. The intake numbers
// and counts it; a row taken in unnumbered (by an intake of an earlier
// release) is numbered and counted by the partition's owner.
func TestStoreLateRow(t *testing.T) {
	t.Parallel()
	for _, unnumbered := range []bool{false, true} {
		t.Run(fmt.Sprintf("unnumbered=%v", unnumbered), func(t *testing.T) {
			t.Parallel()
			pool := adoptedDB(t)
			s, in := newStore(t, pool, "n1")
			t0 := time.Now().Add(-time.Minute).Truncate(time.Microsecond)
			a, b, late := uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7())
			insert(t, pool, msg{id: a, corr: ptr("k"), at: t0.Add(10 * time.Second)}, msg{id: b, corr: ptr("k"), at: t0.Add(20 * time.Second)})
			take(t, in, true)
			readAll(t, s)
			insert(t, pool, msg{id: late, corr: ptr("k"), at: t0})
			if n := take(t, in, false); n != 0 {
				t.Fatalf("the fast pass took in %d rows: the late row is behind its position", n)
			}
			if unnumbered {
				if n := takeUnnumbered(t, pool); n != 1 {
					t.Fatalf("took in %d rows unnumbered, want the late one", n)
				}
			} else if n := take(t, in, true); n != 1 {
				t.Fatalf("the sweep took in %d rows, want the late one", n)
			}
			r, ok := byID(readAll(t, s))[late]
			if !ok || r.KeySeq != 3 || r.PrevKeySeq != 2 || !r.PrevPending {
				t.Fatalf("the late row: %+v, want key_seq 3 after 2", r)
			}
			counted, other := in.LateRows(), s.LateRows()
			if unnumbered {
				counted, other = other, counted
			}
			if counted != 1 || other != 0 {
				t.Fatalf("late rows counted: %d by the one that numbered it, %d by the other; want 1 and 0", counted, other)
			}
		})
	}
}

// TestStoreHandOffKeepsNumbers: the next owner of a partition reads the
// numbers the first gave (a republish carries the same key_seq and
// prev), and numbers new rows after them; the old owner's mark is
// refused.
func TestStoreHandOffKeepsNumbers(t *testing.T) {
	t.Parallel()
	pool := adoptedDB(t)
	s1, in := newStore(t, pool, "n1")
	s2, _ := newStore(t, pool, "n2")
	t0 := time.Now().Add(-time.Minute).Truncate(time.Microsecond)
	ids := []uuid.UUID{uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7())}
	insert(t, pool, msg{id: ids[0], corr: ptr("k"), at: t0}, msg{id: ids[1], corr: ptr("k"), at: t0.Add(time.Second)})
	take(t, in, true)
	first := byID(readAll(t, s1))
	if _, err := s1.MarkPublished(testkit.Context(t, 30*time.Second), settled(first[ids[0]])); err != nil {
		t.Fatal(err)
	}
	holdAll(t, pool, "n2", 2)
	insert(t, pool, msg{id: ids[2], corr: ptr("k"), at: t0.Add(2 * time.Second)})
	take(t, in, true)
	second := byID(readAll(t, s2))
	if r := second[ids[1]]; r.KeySeq != first[ids[1]].KeySeq || r.PrevKeySeq != first[ids[1]].PrevKeySeq || r.PrevPending {
		t.Fatalf("after the hand-off the row reads %+v, was %+v", r, first[ids[1]])
	}
	if r := second[ids[2]]; r.KeySeq != 3 {
		t.Fatalf("the new owner numbered the new row %d, want 3", r.KeySeq)
	}
	marked, err := s1.MarkPublished(testkit.Context(t, 30*time.Second), settled(first[ids[1]]))
	if err != nil || len(marked) != 0 {
		t.Fatalf("the old owner's mark: %v %v, want refused", marked, err)
	}
}

// TestStoreBadRowParked: a row whose payload is not an object is parked
// with the reason when it is numbered; its key's next row waits behind
// it, without its payload; every other key flows. Skipped, the parked
// row lets its key's next row go.
func TestStoreBadRowParked(t *testing.T) {
	t.Parallel()
	pool := adoptedDB(t)
	s, in := newStore(t, pool, "n1")
	t0 := time.Now().Add(-time.Minute).Truncate(time.Microsecond)
	bad, behind, other := uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7())
	insert(t, pool, msg{id: bad, corr: ptr("b"), at: t0, payload: `[1, 2]`},
		msg{id: behind, corr: ptr("b"), at: t0.Add(time.Second)}, msg{id: other, corr: ptr("c"), at: t0})
	take(t, in, true)
	got := byID(readAll(t, s))
	if _, ok := got[bad]; ok {
		t.Fatal("the bad row was returned")
	}
	var reason *string
	if err := pool.QueryRow(context.Background(), `SELECT last_error FROM ordo_table_rows WHERE id = $1 AND parked_at IS NOT NULL`, bad).Scan(&reason); err != nil {
		t.Fatalf("the bad row is not parked: %v", err)
	}
	if reason == nil || !strings.Contains(*reason, "not a JSON object") {
		t.Fatalf("parked with reason %v", reason)
	}
	if r := got[behind]; !r.BehindParked || r.Payload != nil {
		t.Fatalf("the row behind the parked one: %+v", r)
	}
	if r := got[other]; r.KeySeq != 1 || r.PrevPending || r.Payload == nil {
		t.Fatalf("the other key's row: %+v", r)
	}
	// An operator's skip, in SQL (docs/operations.md): the key flows on.
	if _, err := pool.Exec(context.Background(), `UPDATE ordo_table_rows SET dead_at = now() WHERE id = $1 AND key_seq IS NOT NULL`, bad); err != nil {
		t.Fatal(err)
	}
	if r := byID(readAll(t, s))[behind]; r.BehindParked || r.PrevPending || !r.PrevDead || r.Payload == nil {
		t.Fatalf("the row behind the skipped one: %+v", r)
	}
}

// TestStoreRowProcessedElsewhere: a numbered row whose "ProcessedAt"
// someone else set (the old relay) is skipped: the next row's prev steps
// over its number.
func TestStoreRowProcessedElsewhere(t *testing.T) {
	t.Parallel()
	pool := adoptedDB(t)
	s, in := newStore(t, pool, "n1")
	t0 := time.Now().Add(-time.Minute).Truncate(time.Microsecond)
	a, b := uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7())
	insert(t, pool, msg{id: a, corr: ptr("k"), at: t0}, msg{id: b, corr: ptr("k"), at: t0.Add(time.Second)})
	take(t, in, true)
	readAll(t, s)
	if _, err := pool.Exec(context.Background(), `UPDATE "OutboxMessages" SET "ProcessedAt" = now() WHERE "Id" = $1`, a); err != nil {
		t.Fatal(err)
	}
	if _, ok := byID(readAll(t, s))[a]; ok {
		t.Fatal("a row processed elsewhere was returned")
	}
	r := byID(readAll(t, s))[b]
	if !r.PrevDead || r.KeySeq != 2 {
		t.Fatalf("the next row: %+v, want key_seq 2 with its prev dead", r)
	}
	prev, err := s.PrevKeySeq(testkit.Context(t, 30*time.Second), "k", 2)
	if err != nil || prev != 0 {
		t.Fatalf("prev of 2: %d %v, want 0", prev, err)
	}
}

// lockedNumbering sets up a numbering that runs out of time: key last
// has a numbered row (so a counter), then a row of first and one of last
// are taken in unnumbered (a and b), and last's counter is locked by the
// transaction returned (rolled back at the test's end), so that an
// owner's numbering waits on last.
func lockedNumbering(t *testing.T, pool *pgxpool.Pool, in *tablesource.Intake, first, last string) (a, b uuid.UUID, lock pgx.Tx) {
	t.Helper()
	t0 := time.Now().Add(-time.Minute).Truncate(time.Microsecond)
	insert(t, pool, msg{id: uuid.Must(uuid.NewV7()), corr: ptr(last), at: t0})
	take(t, in, true) // last's counter now exists
	a, b = uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7())
	insert(t, pool, msg{id: a, corr: ptr(first), at: t0.Add(time.Second)}, msg{id: b, corr: ptr(last), at: t0.Add(time.Second)})
	takeUnnumbered(t, pool) // the owner numbers them
	lock, _ = holdingSession(t, pool, `SELECT 1 FROM ordo_table_keys WHERE key = $1 FOR UPDATE`, last)
	return a, b, lock
}

// TestNumberingKeepsWhatACancelledReadDid: a read whose numbering runs
// out of time (here: one key's counter locked by another session) keeps
// the partitions it numbered before, so the next read goes on from there
// instead of numbering everything again, which on a loaded machine
// never finished within the read timeout.
func TestNumberingKeepsWhatACancelledReadDid(t *testing.T) {
	t.Parallel()
	pool := adoptedDB(t)
	s, in := newStore(t, pool, "n1")
	keyIn := func(p int) string {
		for i := 0; ; i++ {
			if k := fmt.Sprintf("order-%d", i); partition.Of(k, storeParts) == p {
				return k
			}
		}
	}
	first, last := keyIn(0), keyIn(storeParts-1)
	a, b, lock := lockedNumbering(t, pool, in, first, last)
	ctx := testkit.Context(t, 30*time.Second)
	cursors := make([]relay.Cursor, storeParts)
	for p := range cursors {
		cursors[p] = relay.Cursor{Partition: p}
	}
	short, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if _, err := s.ReadPending(short, cursors, 100); err == nil {
		t.Fatal("a read numbering a locked key's rows returned in time")
	}
	if ks := keySeqInDB(t, pool, a); ks == nil || *ks != 1 {
		t.Fatalf("partition 0's row numbered %v after the read ran out of time in partition %d, want 1 (kept)", ks, storeParts-1)
	}
	if err := lock.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	got := byID(readAll(t, s))
	if got[a].KeySeq != 1 || got[b].KeySeq != 2 {
		t.Fatalf("after the lock: key_seq %d and %d, want 1 and 2", got[a].KeySeq, got[b].KeySeq)
	}
}

// TestNumberingKeepsWhatACancelledStatementDid: within one partition, a
// read whose numbering runs out of time keeps the keys numbered before,
// as it keeps the partitions: one partition's numbering is cut into
// statements of a bounded number of keys, each committed on its own.
func TestNumberingKeepsWhatACancelledStatementDid(t *testing.T) {
	t.Parallel()
	pool := adoptedDB(t)
	s, in := newStore(t, pool, "n1")
	s.SetNumberKeys(1)
	var keys []string
	for i := 0; len(keys) < 2; i++ {
		if k := fmt.Sprintf("order-%d", i); partition.Of(k, storeParts) == 0 {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	first, last := keys[0], keys[1] // numbered in key order
	a, b, lock := lockedNumbering(t, pool, in, first, last)
	ctx := testkit.Context(t, 30*time.Second)
	short, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if _, err := s.ReadPending(short, []relay.Cursor{{Partition: 0}}, 100); err == nil {
		t.Fatal("a read numbering a locked key's rows returned in time")
	}
	if ks := keySeqInDB(t, pool, a); ks == nil || *ks != 1 {
		t.Fatalf("key %s's row numbered %v after the read ran out of time on key %s, want 1 (kept)", first, ks, last)
	}
	if err := lock.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	got := byID(readAll(t, s))
	if got[a].KeySeq != 1 || got[b].KeySeq != 2 {
		t.Fatalf("after the lock: key_seq %d and %d, want 1 and 2", got[a].KeySeq, got[b].KeySeq)
	}
}

// TestMigrateKeepsAnInstalledCount: in a database where a node of an
// earlier release installed Ordo's own outbox beside the adopted table,
// the partition count installed there stays the adopted table's.
func TestMigrateKeepsAnInstalledCount(t *testing.T) {
	pool := articleDB(t)
	ctx := testkit.Context(t, 30*time.Second)
	if err := outbox.Migrate(ctx, pool, storeParts); err != nil {
		t.Fatal(err)
	}
	var pm *outbox.PartitionMismatchError
	if err := tablesource.Migrate(ctx, pool, 2*storeParts); !errors.As(err, &pm) || pm.Installed != storeParts {
		t.Fatalf("migrate with another count than the outbox's: %v, want the installed count's mismatch", err)
	}
	if err := tablesource.Migrate(ctx, pool, storeParts); err != nil {
		t.Fatal(err)
	}
}

// TestDeleteDeadRows: retention deletes a dead row once the number above
// it is gone (published and forgotten), never one a prev may still walk
// over: below a pending row, below another dead row (until that one
// goes), or the key's top number; and nothing under a stale epoch.
func TestDeleteDeadRows(t *testing.T) {
	pool := adoptedDB(t)
	ctx := testkit.Context(t, 30*time.Second)
	// Key a: 1 dead, 2 published (gone), top 2: 1 goes. Key b: 1 dead,
	// 2 pending: kept. Key c: 1 dead, top 1: kept. Key d: 1 and 2 dead,
	// 3 published: 2 goes, then 1.
	if _, err := pool.Exec(ctx, `
INSERT INTO ordo_table_keys (key, partition, last_key_seq) VALUES ('a', 1, 2), ('b', 1, 2), ('c', 1, 1), ('d', 1, 3);
INSERT INTO ordo_table_rows (id, partition, key, occurred_at, key_seq, dead_at)
VALUES (gen_random_uuid(), 1, 'a', now(), 1, now() - interval '1 hour'),
       (gen_random_uuid(), 1, 'b', now(), 1, now() - interval '1 hour'),
       (gen_random_uuid(), 1, 'b', now(), 2, NULL),
       (gen_random_uuid(), 1, 'c', now(), 1, now() - interval '1 hour'),
       (gen_random_uuid(), 1, 'd', now(), 1, now() - interval '1 hour'),
       (gen_random_uuid(), 1, 'd', now(), 2, now() - interval '1 hour')`); err != nil {
		t.Fatal(err)
	}
	s, err := tablesource.NewStore(pool, "n1", tablesource.Article(), "bookstore.ordering", testkit.Logger(t, slog.LevelWarn))
	if err != nil {
		t.Fatal(err)
	}
	left := func() string {
		var got string
		if err := pool.QueryRow(ctx, `SELECT string_agg(key || key_seq, ' ' ORDER BY key, key_seq) FROM ordo_table_rows`).Scan(&got); err != nil {
			t.Fatal(err)
		}
		return got
	}
	if n, err := s.DeleteProcessed(ctx, 1, 2, time.Minute, 100); err != nil || n != 0 {
		t.Fatalf("under a stale epoch: deleted %d (%v), want none", n, err)
	}
	if n, err := s.DeleteProcessed(ctx, 1, 1, 2*time.Hour, 100); err != nil || n != 0 {
		t.Fatalf("rows dead for less than the age: deleted %d (%v), want none", n, err)
	}
	if n, err := s.DeleteProcessed(ctx, 1, 1, time.Minute, 100); err != nil || n != 2 {
		t.Fatalf("first run: deleted %d (%v), want 2; left %s", n, err, left())
	}
	if got := left(); got != "b1 b2 c1 d1" {
		t.Fatalf("after the first run: %s, want b1 b2 c1 d1", got)
	}
	if n, err := s.DeleteProcessed(ctx, 1, 1, time.Minute, 100); err != nil || n != 1 {
		t.Fatalf("second run: deleted %d (%v), want 1", n, err)
	}
	if got := left(); got != "b1 b2 c1" {
		t.Fatalf("after the second run: %s, want b1 b2 c1", got)
	}
}

// TestStoreHoldsAParkedKeysRows: the read that meets rows behind a parked
// row holds them and every pending row of their key above it, so that
// later reads leave the key out; an operator's retry of the parked row,
// in SQL (docs/operations.md), releases them, and a skip does too.
func TestStoreHoldsAParkedKeysRows(t *testing.T) {
	t.Parallel()
	pool := adoptedDB(t)
	s, in := newStore(t, pool, "n1")
	t0 := time.Now().Add(-time.Minute).Truncate(time.Microsecond)
	ids := make([]uuid.UUID, 4)
	for i := range ids {
		ids[i] = uuid.Must(uuid.NewV7())
		insert(t, pool, msg{id: ids[i], corr: ptr("p"), at: t0.Add(time.Duration(i) * time.Second)})
	}
	other := uuid.Must(uuid.NewV7())
	insert(t, pool, msg{id: other, corr: ptr("q"), at: t0})
	take(t, in, true)
	first := byID(readAll(t, s))
	parked, err := s.RecordFailures(testkit.Context(t, 30*time.Second), settled(first[ids[0]]), 1)
	if err != nil || len(parked) != 1 {
		t.Fatalf("park the key's first row: %v %v", parked, err)
	}
	heldNow := func() int {
		var n int
		if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM ordo_table_rows WHERE key = 'p' AND held_behind = 1`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	got := byID(readAll(t, s))
	for _, id := range ids[1:] {
		if r, ok := got[id]; ok && (!r.BehindParked || r.Payload != nil) {
			t.Fatalf("row %s behind the parked row read as %+v", id, r)
		}
	}
	if n := heldNow(); n != 3 {
		t.Fatalf("%d of the key's 3 later rows held after the read, want 3", n)
	}
	again := byID(readAll(t, s))
	if len(again) != 1 || again[other].ID != other {
		t.Fatalf("a read after the hold returned %d rows, want only the other key's", len(again))
	}
	// The retry, as docs/operations.md gives it: every held row is back.
	if _, err := pool.Exec(context.Background(), `UPDATE ordo_table_rows SET parked_at = NULL, attempts = 0,
		next_attempt_at = NULL WHERE id = $1 AND parked_at IS NOT NULL`, ids[0]); err != nil {
		t.Fatal(err)
	}
	if n := heldNow(); n != 0 {
		t.Fatalf("%d rows still held after the retry", n)
	}
	back := byID(readAll(t, s))
	for i, id := range ids {
		if r, ok := back[id]; !ok || r.KeySeq != int64(i+1) || r.BehindParked || r.PrevPending != (i > 0) {
			t.Fatalf("after the retry row %d: %+v (read %v)", i+1, r, ok)
		}
	}
	// Parked again, held again by a read, then skipped: released too.
	if _, err := s.RecordFailures(testkit.Context(t, 30*time.Second), settled(back[ids[0]]), 1); err != nil {
		t.Fatal(err)
	}
	readAll(t, s)
	if n := heldNow(); n != 3 {
		t.Fatalf("%d rows held after the second park, want 3", n)
	}
	if _, err := pool.Exec(context.Background(), `UPDATE ordo_table_rows SET dead_at = now() WHERE id = $1 AND key_seq IS NOT NULL`, ids[0]); err != nil {
		t.Fatal(err)
	}
	if r := byID(readAll(t, s))[ids[1]]; r.BehindParked || !r.PrevDead || r.Payload == nil {
		t.Fatalf("the row after the skipped one: %+v", r)
	}
}

// TestDeadRowOfAPendingUserRowKept: a row skipped in ordo_table_rows alone,
// its user row left pending, stays there past the retention age, even with
// the number above it gone: deleted, it would let the intake take the
// user's row in again and publish it.
func TestDeadRowOfAPendingUserRowKept(t *testing.T) {
	t.Parallel()
	pool := adoptedDB(t)
	ctx := testkit.Context(t, 30*time.Second)
	s, in := newStore(t, pool, "n1")
	t0 := time.Now().Add(-time.Minute).Truncate(time.Microsecond)
	skipped, next := uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7())
	insert(t, pool, msg{id: skipped, corr: ptr("k"), at: t0}, msg{id: next, corr: ptr("k"), at: t0.Add(time.Second)})
	take(t, in, true)
	rows := byID(readAll(t, s))
	if rows[skipped].KeySeq != 1 {
		t.Fatalf("first row read as %+v, want key_seq 1", rows[skipped])
	}
	if _, err := pool.Exec(ctx, `UPDATE ordo_table_rows SET dead_at = now() - interval '1 hour' WHERE id = $1`, skipped); err != nil {
		t.Fatal(err)
	}
	nextRow := byID(readAll(t, s))[next]
	if nextRow.KeySeq != 2 {
		t.Fatalf("second row read as %+v, want key_seq 2", nextRow)
	}
	if marked, err := s.MarkPublished(ctx, settled(nextRow)); err != nil || len(marked) != 1 {
		t.Fatalf("mark the second row: %v %v", marked, err)
	}
	if n, err := s.DeleteProcessed(ctx, nextRow.Partition, 1, time.Minute, 100); err != nil || n != 0 {
		t.Fatalf("retention deleted %d rows (%v), want none: the skipped row's user row is pending", n, err)
	}
	if n := take(t, in, true); n != 0 {
		t.Fatalf("the intake took %d rows in again", n)
	}
	if got := readAll(t, s); len(got) != 0 {
		t.Fatalf("read %+v after the skip and the mark, want nothing", got)
	}

	// Once the user's row is processed too, the dead row goes.
	if _, err := pool.Exec(ctx, `UPDATE "OutboxMessages" SET "ProcessedAt" = now() WHERE "Id" = $1`, skipped); err != nil {
		t.Fatal(err)
	}
	if n, err := s.DeleteProcessed(ctx, nextRow.Partition, 1, time.Minute, 100); err != nil || n != 1 {
		t.Fatalf("retention deleted %d rows (%v), want the skipped row", n, err)
	}
}
