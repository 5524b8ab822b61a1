package outbox_test

import (
	"context"
	"fmt"
	"maps"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/outbox"
	"github.com/ordo-relay/ordo/partition"
)

// TestNotifyChannelIsTheTriggers: the trigger functions the migrations
// install notify on outbox.NotifyChannel, the channel relays LISTEN on and
// operators' actions notify (the SQL cannot import the Go constant).
// TestNotifyPerPartition checks the same by listening.
func TestNotifyChannelIsTheTriggers(t *testing.T) {
	t.Parallel()
	pool, _ := setup(t, 1)
	ctx := testkit.Context(t, 30*time.Second)
	rows, err := pool.Query(ctx, `
SELECT p.proname, p.prosrc FROM pg_proc AS p
JOIN pg_namespace AS n ON n.oid = p.pronamespace
WHERE n.nspname = current_schema() AND p.prosrc LIKE '%pg_notify%'`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	calls := regexp.MustCompile(`pg_notify\s*\(`)
	literal := regexp.MustCompile(`pg_notify\s*\(\s*'([^']*)'`)
	var funcs, notifies int
	for rows.Next() {
		var name, src string
		if err := rows.Scan(&name, &src); err != nil {
			t.Fatal(err)
		}
		funcs++
		all, lits := calls.FindAllStringIndex(src, -1), literal.FindAllStringSubmatch(src, -1)
		if len(lits) != len(all) {
			t.Errorf("%s: %d pg_notify calls, %d with a literal channel: cannot check them", name, len(all), len(lits))
		}
		for _, m := range lits {
			notifies++
			if m[1] != outbox.NotifyChannel {
				t.Errorf("%s notifies channel %q, outbox.NotifyChannel is %q", name, m[1], outbox.NotifyChannel)
			}
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if funcs == 0 || notifies == 0 {
		t.Fatalf("found %d functions and %d pg_notify calls: the notify trigger is missing", funcs, notifies)
	}
	t.Logf("%d function(s), %d pg_notify call(s), all on %q", funcs, notifies, outbox.NotifyChannel)
}

// arm takes the wake lock of partitions on conn, as a relay arms them.
func arm(t *testing.T, conn *pgxpool.Conn, partitions ...int) {
	t.Helper()
	for _, p := range partitions {
		var ok bool
		if err := conn.QueryRow(testkit.Context(t, 10*time.Second), `SELECT pg_try_advisory_lock($1::int, $2::int)`,
			outbox.WakeLockClass, p).Scan(&ok); err != nil || !ok {
			t.Fatalf("arm partition %d: %v, %v", p, ok, err)
		}
	}
}

// notifications collects what conn receives until 500 ms pass quietly.
func notifications(ctx context.Context, conn *pgxpool.Conn) map[string]int {
	got := map[string]int{}
	for {
		wctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		n, err := conn.Conn().WaitForNotification(wctx)
		cancel()
		if err != nil {
			return got
		}
		got[n.Payload]++
	}
}

// TestNotifyPerPartition: a transaction notifies each armed partition it
// wrote to once, however many statements and rows, and no partition that
// is not armed (migration 10: NOTIFY serialises commits, so producers
// notify only a relay that waits).
func TestNotifyPerPartition(t *testing.T) {
	t.Parallel()
	pool, p := setup(t, 3)
	ctx := testkit.Context(t, 30*time.Second)
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{outbox.NotifyChannel}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	same, other, quiet := partition.Of("same", 64), partition.Of("order-42", 64), partition.Of("quiet", 64)
	if same == other || quiet == same || quiet == other {
		t.Fatal("pick keys of three partitions")
	}
	arm(t, conn, same, other)
	// 20 messages of one key plus one of another, over two statements,
	// and one of a partition nobody armed.
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		batch := make([]outbox.Message, 20)
		for i := range batch {
			batch[i] = msg("same")
		}
		if _, err := p.Enqueue(ctx, tx, batch...); err != nil {
			return err
		}
		_, err := p.Enqueue(ctx, tx, msg("same"), msg("order-42"), msg("quiet"))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	got := notifications(ctx, conn)
	want := map[string]int{itoa(same): 1, itoa(other): 1}
	if !maps.Equal(got, want) {
		t.Fatalf("notifications %v, want %v (partition %d was not armed)", got, want, quiet)
	}
}

// TestArmWaitsForProducers: a relay cannot arm a partition while a
// producer's transaction that wrote to it without notifying is open, and
// can once it commits; so a relay that reads after arming misses no
// commit that did not notify. A statement over more than 16 partitions
// notifies them all, armed or not, and takes no lock.
func TestArmWaitsForProducers(t *testing.T) {
	t.Parallel()
	pool, p := setup(t, 3)
	ctx := testkit.Context(t, 30*time.Second)
	relay, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer relay.Release()
	if _, err := relay.Exec(ctx, "LISTEN "+pgx.Identifier{outbox.NotifyChannel}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	tryArm := func(part int) bool {
		var ok bool
		if err := relay.QueryRow(ctx, `SELECT pg_try_advisory_lock($1::int, $2::int)`, outbox.WakeLockClass, part).Scan(&ok); err != nil {
			t.Fatal(err)
		}
		return ok
	}
	part := partition.Of("open", 64)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := p.Enqueue(ctx, tx, msg("open")); err != nil {
		t.Fatal(err)
	}
	if tryArm(part) {
		t.Fatalf("partition %d armed while a producer that did not notify is open", part)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if !tryArm(part) {
		t.Fatalf("partition %d not armed after the producer committed", part)
	}
	if got := notifications(ctx, relay); len(got) != 0 {
		t.Fatalf("the producer notified %v, but nothing was armed when it wrote", got)
	}
	// A transaction over every partition holds 16 wake locks, no more (the
	// lock table stays small), and notifies the partitions past those 16
	// (migration 12; before, a statement over more than 16 partitions
	// notified all of them and took no lock).
	if _, err := relay.Exec(ctx, `SELECT pg_advisory_unlock($1::int, $2::int)`, outbox.WakeLockClass, part); err != nil {
		t.Fatal(err)
	}
	var msgs []outbox.Message
	distinct := map[int]bool{}
	for i := range 200 {
		msgs = append(msgs, msg(fmt.Sprintf("wide-%d", i)))
		distinct[partition.Of(fmt.Sprintf("wide-%d", i), 64)] = true
	}
	tx, err = pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := p.Enqueue(ctx, tx, msgs[:100]...); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Enqueue(ctx, tx, msgs[100:]...); err != nil {
		t.Fatal(err)
	}
	var held int
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM pg_locks
		WHERE locktype = 'advisory' AND classid = $1::int::oid AND pid = pg_backend_pid()`, outbox.WakeLockClass).Scan(&held); err != nil {
		t.Fatal(err)
	}
	if held != 16 {
		t.Fatalf("a transaction over %d partitions holds %d wake locks, want 16", len(distinct), held)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if got := notifications(ctx, relay); len(got) != len(distinct)-16 {
		t.Fatalf("a transaction over %d partitions notified %d of them, want all but the 16 it locked: %v", len(distinct), len(got), got)
	}
}

// TestWakeLockClassIsTheTriggers: the key_seq trigger tests the lock
// class relays arm with (outbox.WakeLockClass; the SQL cannot import it).
func TestWakeLockClassIsTheTriggers(t *testing.T) {
	t.Parallel()
	pool, _ := setup(t, 1)
	ctx := testkit.Context(t, 30*time.Second)
	var src string
	if err := pool.QueryRow(ctx, `SELECT prosrc FROM pg_proc WHERE proname = 'outbox_assign_key_seq'`).Scan(&src); err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("pg_try_advisory_xact_lock_shared(%d, NEW.partition)", outbox.WakeLockClass)
	if !strings.Contains(src, want) {
		t.Fatalf("outbox_assign_key_seq does not call %s:\n%s", want, src)
	}
}
