package node

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/lease"
	"github.com/ordo-relay/ordo/relay/tablesource"
)

// tableRows returns a database with Ordo's bookkeeping for an adopted
// table and the leases of 4 partitions, ordo_table_rows never analyzed.
func tableRows(t *testing.T) *pgxpool.Pool {
	t.Helper()
	_, pool := testkit.NewDatabasePool(t, 2)
	ctx := testkit.Context(t, 60*time.Second)
	if err := lease.Migrate(ctx, pool, 4); err != nil {
		t.Fatal(err)
	}
	if err := tablesource.Migrate(ctx, pool, 4); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `ALTER TABLE ordo_table_rows SET (autovacuum_enabled = false)`); err != nil {
		t.Fatal(err)
	}
	return pool
}

// TestTableBacklogCounts: for a source relaying an adopted table, the
// backlog counts the rows its intake took in (ordo_table_rows), by
// partition: pending with parked among them, the oldest pending age,
// and neither dead rows nor other partitions' rows.
func TestTableBacklogCounts(t *testing.T) {
	testkit.RequirePostgres(t)
	pool := tableRows(t)
	ctx := testkit.Context(t, 60*time.Second)
	// Partition 1: 3 rows that can go (the first a minute old), 2 parked,
	// 1 dead. Partition 2: 300 rows, more than a sample.
	if _, err := pool.Exec(ctx, `
INSERT INTO ordo_table_rows (id, partition, key, occurred_at, key_seq, parked_at, dead_at)
SELECT gen_random_uuid(), p, k, now() - make_interval(secs => age), ks, parked, dead
FROM (VALUES (1, 'a', 60, 1, NULL::timestamptz, NULL::timestamptz), (1, 'a', 5, 2, NULL, NULL), (1, 'b', 5, NULL, NULL, NULL),
             (1, 'c', 5, 1, now(), NULL), (1, 'd', 5, 1, now(), NULL), (1, 'e', 5, 1, now(), now())) AS v(p, k, age, ks, parked, dead)`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `
INSERT INTO ordo_table_rows (id, partition, key, occurred_at)
SELECT gen_random_uuid(), 2, 'k' || i, now() FROM generate_series(1, 300) AS i`); err != nil {
		t.Fatal(err)
	}
	parts, err := queryBacklog(ctx, pool, tableBacklog.rows)
	if err != nil {
		t.Fatal(err)
	}
	if len(parts) != 4 {
		t.Fatalf("%d partitions, want 4", len(parts))
	}
	p1, p2 := parts[1], parts[2]
	if p1.Pending != 5 || p1.Parked != 2 || p1.OldestPendingSeconds < 59 || p1.OldestPendingSeconds > 120 {
		t.Errorf("partition 1: pending %d parked %d oldest %.1f s, want 5, 2 and about 60 s", p1.Pending, p1.Parked, p1.OldestPendingSeconds)
	}
	if p2.Pending != 300 || p2.Parked != 0 {
		t.Errorf("partition 2: pending %d parked %d, want 300 and 0", p2.Pending, p2.Parked)
	}
	if parts[0].Pending != 0 || parts[3].Pending != 0 {
		t.Errorf("partitions 0 and 3: pending %d and %d, want none", parts[0].Pending, parts[3].Pending)
	}
	var produced int64
	if err := pool.QueryRow(context.Background(), tableBacklog.produced).Scan(&produced); err != nil || produced != 306 {
		t.Errorf("produced %d (%v), want 306", produced, err)
	}
}

// TestTableBacklogPlan: the adopted table's backlog query walks the
// ready and parked indexes of ordo_table_rows, and neither scans nor
// sorts its rows, on a table never analyzed.
func TestTableBacklogPlan(t *testing.T) {
	testkit.RequirePostgres(t)
	pool := tableRows(t)
	ctx := testkit.Context(t, 60*time.Second)
	if _, err := pool.Exec(ctx, `
INSERT INTO ordo_table_rows (id, partition, key, occurred_at, key_seq, parked_at)
SELECT gen_random_uuid(), i % 4, 'k' || (i % 400), now(), i / 400 + 1, CASE WHEN i % 97 = 0 THEN now() END
FROM generate_series(0, 99999) AS i`); err != nil {
		t.Fatal(err)
	}
	plan := planOf(t, pool, tableBacklog.rows)
	for _, bad := range []string{"Seq Scan on ordo_table_rows", "Bitmap Heap Scan on ordo_table_rows", "Sort"} {
		if strings.Contains(plan, bad) {
			t.Errorf("%s in the backlog plan:\n%s", bad, plan)
		}
	}
	for _, index := range []string{"ordo_table_rows_ready", "ordo_table_rows_parked"} {
		if !strings.Contains(plan, index) {
			t.Errorf("the backlog plan does not walk %s:\n%s", index, plan)
		}
	}
}
