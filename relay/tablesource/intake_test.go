package tablesource_test

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/relay/tablesource"
)

// TestIntakeSkipsARowBeingMarked: a sweep whose snapshot saw a row
// pending and not taken in, while another intake took it in and its
// owner published it and is marking it (taken in, "ProcessedAt" set,
// forgotten: one transaction, not yet committed), waits for the mark and
// then does not take the row in again: taken in again it would be
// numbered and published a second time.
func TestIntakeSkipsARowBeingMarked(t *testing.T) {
	t.Parallel()
	pool := adoptedDB(t)
	_, in := newStore(t, pool, "n1")
	ctx := testkit.Context(t, 30*time.Second)
	id := uuid.Must(uuid.NewV7())
	insert(t, pool, msg{id: id, corr: ptr("k"), at: time.Now()})

	tx, marker := holdingSession(t, pool, `INSERT INTO ordo_table_rows (id, partition, key, occurred_at, key_seq) VALUES ($1, 0, 'k', now(), 1)`, id)
	for _, sql := range []string{
		`UPDATE "OutboxMessages" SET "ProcessedAt" = now() WHERE "Id" = $1`,
		`DELETE FROM ordo_table_rows WHERE id = $1`,
	} {
		if _, err := tx.Exec(ctx, sql, id); err != nil {
			t.Fatal(err)
		}
	}
	done := passInBackground(ctx, in)
	// The sweep reads the row pending (the mark has not committed) and
	// waits for the mark's row locks.
	waitBlockedBy(t, pool, marker)
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

// TestIntakePassIsOneSnapshot: a key's row committing late, behind the
// end of a pass's first page, and the key's next row committed after it
// before the pass reads its second page: the pass takes in neither (the
// next pass takes both, in order), never the second without the first,
// which would be numbered first.
func TestIntakePassIsOneSnapshot(t *testing.T) {
	t.Parallel()
	pool := adoptedDB(t)
	_, in := newStore(t, pool, "n1")
	in.Page = 1
	ctx := testkit.Context(t, 30*time.Second)
	t0 := time.Now().Add(-time.Minute).Truncate(time.Microsecond)
	x, a1, a2 := uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7())
	insert(t, pool, msg{id: x, corr: ptr("x"), at: t0.Add(2 * time.Second)})
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // committed below
	if _, err := tx.Exec(ctx, sqlInsert, a1, "OrderPlaced", "order.placed", `{}`, "k", t0.Add(time.Second), nil); err != nil {
		t.Fatal(err)
	}
	once := false
	in.SetAfterPage(func() {
		if once {
			return
		}
		once = true
		if err := tx.Commit(ctx); err != nil {
			t.Error(err)
		}
		insert(t, pool, msg{id: a2, corr: ptr("k"), at: t0.Add(3 * time.Second)})
	})
	take(t, in, true)
	var hasA1, hasA2 bool
	if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM ordo_table_rows WHERE id = $1), EXISTS (SELECT 1 FROM ordo_table_rows WHERE id = $2)`,
		a1, a2).Scan(&hasA1, &hasA2); err != nil {
		t.Fatal(err)
	}
	if hasA2 && !hasA1 {
		t.Fatal("the pass took in the key's second row without its first")
	}
	if n := take(t, in, true); n != 2 || !once {
		t.Fatalf("the next pass took in %d rows, want both of the key's", n)
	}
}

// TestIntakeFastPassSendsOnlyNewRows: a fast pass whose look-back holds
// only rows this intake took in (pending: not yet published) takes no
// page in at all, and one that also holds a new row sends that row
// alone; a sweep still sends every pending row it reads, and a new row
// that commits behind the position is taken in by the next sweep.
func TestIntakeFastPassSendsOnlyNewRows(t *testing.T) {
	t.Parallel()
	pool := adoptedDB(t)
	_, in := newStore(t, pool, "n1")
	var sent []int
	in.SetOnTake(func(n int) { sent = append(sent, n) })
	now := time.Now().Truncate(time.Microsecond)
	for i := range 3 {
		insert(t, pool, msg{id: uuid.Must(uuid.NewV7()), corr: ptr(fmt.Sprintf("k%d", i)), at: now.Add(time.Duration(i) * time.Millisecond)})
	}
	if n := take(t, in, true); n != 3 {
		t.Fatalf("the first sweep took in %d rows, want 3", n)
	}
	sent = nil
	if n := take(t, in, false); n != 0 || len(sent) != 0 {
		t.Fatalf("a fast pass over rows taken in already took in %d, sending pages of %v rows; want none sent", n, sent)
	}
	insert(t, pool, msg{id: uuid.Must(uuid.NewV7()), corr: ptr("k9"), at: now.Add(10 * time.Millisecond)})
	if n := take(t, in, false); n != 1 || !slices.Equal(sent, []int{1}) {
		t.Fatalf("a fast pass with one new row took in %d, sending pages of %v rows; want the one row alone", n, sent)
	}
	// Behind the look-back: only a sweep reads it, and a sweep sends all.
	insert(t, pool, msg{id: uuid.Must(uuid.NewV7()), corr: ptr("k8"), at: now.Add(-time.Hour)})
	sent = nil
	if n := take(t, in, false); n != 0 {
		t.Fatalf("a fast pass took in %d rows from before its look-back", n)
	}
	if n := take(t, in, true); n != 1 || !slices.Equal(sent, []int{5}) {
		t.Fatalf("the sweep took in %d, sending pages of %v rows; want the late row taken in from a page of all 5 pending", n, sent)
	}
}

// TestIntakeProbesWhileIdle: an intake whose next fast pass is an hour
// away takes a new row in within its probe interval, and a probe that
// finds nothing newer than its last read starts no pass.
func TestIntakeProbesWhileIdle(t *testing.T) {
	t.Parallel()
	pool := adoptedDB(t)
	_, in := newStore(t, pool, "n1")
	in.PollMin, in.PollMax, in.SweepEvery, in.ProbeEvery = time.Hour, time.Hour, time.Hour, 5*time.Millisecond
	var probes, pages atomic.Int64
	in.SetOnProbe(func(bool) { probes.Add(1) })
	in.SetAfterPage(func() { pages.Add(1) })
	runIntake(t, in)
	probed := func(n int64) {
		t.Helper()
		from := probes.Load()
		testkit.WaitFor(t, 10*time.Second, fmt.Sprintf("%d more probes", n), func() bool { return probes.Load() >= from+n })
	}
	probed(3) // the first sweep found the table empty
	now := time.Now()
	for i := range 2 {
		id := uuid.Must(uuid.NewV7())
		insert(t, pool, msg{id: id, corr: ptr(fmt.Sprintf("k%d", i)), at: now.Add(time.Duration(i) * time.Millisecond)})
		waitTakenIn(t, pool, id, "the new row taken in")
	}
	read := pages.Load()
	probed(5)
	if n := pages.Load(); n != read {
		t.Fatalf("probes that found nothing newer started passes (%d pages read, %d before)", n, read)
	}
}

// TestIntakeStartsSoonAfterItsLease: an intake whose node does not hold
// partition 0 yet, as when the node has just started and not claimed its
// leases, checks again after PollMin, doubling, not after PollMax: given
// the lease after its first check, it takes a pending row in although
// PollMax is an hour.
func TestIntakeStartsSoonAfterItsLease(t *testing.T) {
	t.Parallel()
	pool := adoptedDB(t) // every partition held by n1
	_, in := newStore(t, pool, "n2")
	in.PollMin, in.PollMax, in.SweepEvery = 5*time.Millisecond, time.Hour, time.Hour
	var refused atomic.Int64
	in.SetOnHolderCheck(func(held bool) {
		if !held {
			refused.Add(1)
		}
	})
	id := uuid.Must(uuid.NewV7())
	insert(t, pool, msg{id: id, corr: ptr("k"), at: time.Now()})
	runIntake(t, in)
	testkit.WaitFor(t, 10*time.Second, "a check that n2 does not hold partition 0", func() bool { return refused.Load() > 0 })
	holdAll(t, pool, "n2", 2)
	waitTakenIn(t, pool, id, "the row taken in by n2's intake")
}

// TestIntakeWithoutProbes: with ProbeEvery NoProbe the intake only
// passes: its passes go on (the pending row is read by each) and it
// never probes.
func TestIntakeWithoutProbes(t *testing.T) {
	t.Parallel()
	pool := adoptedDB(t)
	_, in := newStore(t, pool, "n1")
	in.PollMin, in.PollMax, in.SweepEvery, in.ProbeEvery = 40*time.Millisecond, 40*time.Millisecond, time.Hour, tablesource.NoProbe
	var probes, pages atomic.Int64
	in.SetOnProbe(func(bool) { probes.Add(1) })
	in.SetAfterPage(func() { pages.Add(1) })
	insert(t, pool, msg{id: uuid.Must(uuid.NewV7()), corr: ptr("k"), at: time.Now()})
	runIntake(t, in)
	testkit.WaitFor(t, 10*time.Second, "four passes over the pending row", func() bool { return pages.Load() >= 4 })
	if n := probes.Load(); n != 0 {
		t.Fatalf("%d probes with ProbeEvery NoProbe", n)
	}
}

// runIntake runs in.Run until the test ends, and fails the test if Run
// returns an error.
func runIntake(t *testing.T, in *tablesource.Intake) {
	t.Helper()
	ctx, cancel := context.WithCancel(testkit.Context(t, time.Minute))
	done := make(chan error, 1)
	go func() { done <- in.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
}

// waitTakenIn waits until the row id is in ordo_table_rows.
func waitTakenIn(t *testing.T, pool *pgxpool.Pool, id uuid.UUID, what string) {
	t.Helper()
	testkit.WaitFor(t, 10*time.Second, what, func() bool {
		var ok bool
		if err := pool.QueryRow(testkit.Context(t, 10*time.Second), `SELECT EXISTS (SELECT 1 FROM ordo_table_rows WHERE id = $1)`, id).Scan(&ok); err != nil {
			t.Fatal(err)
		}
		return ok
	})
}
