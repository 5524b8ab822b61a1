package tablesource_test

import (
	"context"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/relay"
	"github.com/ordo-relay/ordo/relay/tablesource"
)

// explain runs EXPLAIN (ANALYZE, BUFFERS) of sql with args, as the Store
// runs it (each execution planned for its parameters), and returns the
// plan and its shared buffers.
func explain(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) (string, int) {
	t.Helper()
	return explainOn(t, pool, sql, args...)
}

// explainTx is explain inside tx.
func explainTx(t *testing.T, tx pgx.Tx, sql string, args ...any) (string, int) {
	t.Helper()
	return explainOn(t, tx, sql, args...)
}

type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

func explainOn(t *testing.T, q querier, sql string, args ...any) (string, int) {
	t.Helper()
	rows, err := q.Query(testkit.Context(t, time.Minute), "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF) "+sql,
		append([]any{pgx.QueryExecModeCacheDescribe}, args...)...)
	return planOf(t, rows, err)
}

// planOf collects an EXPLAIN's rows and returns the plan and its shared
// buffers.
func planOf(t *testing.T, rows pgx.Rows, err error) (string, int) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	plan := strings.Join(lines, "\n")
	return plan, topBuffers(plan)
}

// explainGeneric runs EXPLAIN (ANALYZE, BUFFERS) EXECUTE of sql prepared
// and planned as a generic plan (force_generic_plan: what PostgreSQL may
// keep for a prepared statement), with args as SQL literals, in a
// transaction it rolls back, and returns the plan and its shared buffers.
func explainGeneric(t *testing.T, pool *pgxpool.Pool, sql, args string) (string, int) {
	t.Helper()
	ctx := testkit.Context(t, time.Minute)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // EXPLAIN ANALYZE of a write: undone
	// PREPARE outlives the transaction: a name of its own each time.
	name := "generic_" + strings.ReplaceAll(uuid.NewString(), "-", "")
	for _, stmt := range []string{"SET LOCAL plan_cache_mode = force_generic_plan", "PREPARE " + name + " AS " + sql} {
		if _, err := tx.Exec(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	rows, err := tx.Query(ctx, "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF) EXECUTE "+name+"("+args+")")
	return planOf(t, rows, err)
}

// topBuffers returns the shared buffers of plan's first node.
func topBuffers(plan string) int {
	m := regexp.MustCompile(`Buffers: shared hit=(\d+)(?: read=(\d+))?`).FindStringSubmatch(plan)
	if m == nil {
		return 0
	}
	hit, _ := strconv.Atoi(m[1])
	read, _ := strconv.Atoi(m[2])
	return hit + read
}

const intakePage = 500

// seqScan reports whether plan scans a table whole, or collects every
// row of an index's range first (a bitmap scan): ordo_leases, one row per
// partition, may be.
func seqScan(plan string) bool {
	return regexp.MustCompile(`(Seq|Bitmap Heap) Scan on (ordo_table|"OutboxMessages")`).MatchString(plan)
}

// TestStorePlansWithoutStatistics: on 20,000 pending rows over 1,000
// keys, written and taken in since the last ANALYZE (autovacuum off), the
// key-head read, the mark and the intake of a page cost what they
// handle, not the backlog: index scans only, buffers bounded per row, and
// the intake probes the user's table by primary key, row by row, instead
// of matching the page against every pending row.
func TestStorePlansWithoutStatistics(t *testing.T) {
	t.Parallel()
	pool := adoptedDB(t)
	ctx := testkit.Context(t, 2*time.Minute)
	for _, tbl := range []string{`"OutboxMessages"`, `ordo_table_rows`, `ordo_table_keys`} {
		if _, err := pool.Exec(ctx, `ALTER TABLE `+tbl+` SET (autovacuum_enabled = off)`); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pool.Exec(ctx, `INSERT INTO "OutboxMessages" ("Id", "Type", "RoutingKey", "Payload", "CorrelationId", "OccurredAt")
		SELECT gen_random_uuid(), 'OrderPlaced', 'order.placed', jsonb_build_object('n', i, 'pad', repeat('x', 200)), 'k' || (i % 1000),
		       now() - interval '1 hour' + i * interval '1 ms'
		FROM generate_series(1, 20000) AS i`); err != nil {
		t.Fatal(err)
	}
	s, in := newStore(t, pool, "n1")
	began := time.Now()
	if n := take(t, in, true); n != 20000 {
		t.Fatalf("took in %d rows", n)
	}
	t.Logf("intake of 20,000 rows: %v", time.Since(began).Round(time.Millisecond))
	began = time.Now()
	rows := readAll(t, s)
	t.Logf("numbering and the first read: %v, %d rows", time.Since(began).Round(time.Millisecond), len(rows))

	const limit = 100
	plan, buffers := explain(t, pool, s.ReadSQL(), []int32{0, 1, 2, 3}, []int64{0, 0, 0, 0}, limit)
	t.Logf("key-head read of %d rows: %d buffers\n%s", 4*limit, buffers, plan)
	if seqScan(plan) || buffers > 4*limit*8 {
		t.Fatalf("the key-head read costs the backlog: %d buffers for %d rows\n%s", buffers, 4*limit, plan)
	}
	// The Store keeps the read's and the mark's plans (prepared
	// statements): their generic plans must cost the same.
	plan, buffers = explainGeneric(t, pool, s.ReadSQL(), "'{0,1,2,3}', '{0,0,0,0}', "+strconv.Itoa(limit))
	t.Logf("key-head read of %d rows, generic plan: %d buffers\n%s", 4*limit, buffers, plan)
	if seqScan(plan) || buffers > 4*limit*8 {
		t.Fatalf("the key-head read's generic plan costs the backlog: %d buffers for %d rows\n%s", buffers, 4*limit, plan)
	}
	var settle []relay.Settled
	for _, r := range rows[:limit] {
		settle = append(settle, relay.Settled{ID: r.ID, Partition: r.Partition, Epoch: 1})
	}
	ids, parts, epochs, _, _ := relay.SettledColumns(settle)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // EXPLAIN ANALYZE of a write: undone
	plan, buffers = explainTx(t, tx, s.MarkSQL(), "n1", ids, parts, epochs)
	t.Logf("mark of %d rows: %d buffers\n%s", limit, buffers, plan)
	if seqScan(plan) || buffers > limit*20 {
		t.Fatalf("the mark costs the backlog: %d buffers for %d rows\n%s", buffers, limit, plan)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	idText, partText, epochText := make([]string, len(ids)), make([]string, len(parts)), make([]string, len(epochs))
	for i := range ids {
		idText[i], partText[i], epochText[i] = uuid.UUID(ids[i]).String(), strconv.Itoa(int(parts[i])), strconv.FormatInt(epochs[i], 10)
	}
	plan, buffers = explainGeneric(t, pool, s.MarkSQL(), "'n1', '{"+strings.Join(idText, ",")+"}', '{"+strings.Join(partText, ",")+"}', '{"+strings.Join(epochText, ",")+"}'")
	t.Logf("mark of %d rows, generic plan: %d buffers\n%s", limit, buffers, plan)
	if seqScan(plan) || buffers > limit*20 {
		t.Fatalf("the mark's generic plan costs the backlog: %d buffers for %d rows\n%s", buffers, limit, plan)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO "OutboxMessages" ("Id", "Type", "RoutingKey", "Payload", "CorrelationId", "OccurredAt")
		SELECT gen_random_uuid(), 'OrderPlaced', 'order.placed', '{}', 'k' || (i % 1000), now() + i * interval '1 ms'
		FROM generate_series(1, $1::int) AS i`, intakePage); err != nil {
		t.Fatal(err)
	}
	r, err := tablesource.NewReader(tablesource.Article(), storeParts)
	if err != nil {
		t.Fatal(err)
	}
	// The intake numbers the page as it takes it in (ordo_table_take_in,
	// whose statements the function itself confines to index probes):
	// most of the buffers are the page's 500 key counters, each moved 20
	// times since the last vacuum (autovacuum is off here): 70-120 a row,
	// where taking rows in unnumbered cost 20.
	checkIntakePlan(t, "intake", in.ExplainTake, r, pool, time.Now().Add(-time.Second))
	// The intake statement is prepared once per connection: its generic
	// plan must cost the same. (The page above is taken in: a second
	// page of new rows.)
	if _, err := pool.Exec(ctx, `
		INSERT INTO "OutboxMessages" ("Id", "Type", "RoutingKey", "Payload", "CorrelationId", "OccurredAt")
		SELECT gen_random_uuid(), 'OrderPlaced', 'order.placed', '{}', 'k' || (i % 1000), now() + interval '1 hour' + i * interval '1 ms'
		FROM generate_series(1, $1::int) AS i`, intakePage); err != nil {
		t.Fatal(err)
	}
	checkIntakePlan(t, "intake, generic plan", in.ExplainTakeGeneric, r, pool, time.Now().Add(30*time.Minute))
}

// checkIntakePlan reads a page of intakePage pending rows after from,
// explains its take with explain, and fails t unless the plan probes each
// row by key and costs at most 160 buffers a row.
func checkIntakePlan(t *testing.T, what string, explain func(context.Context, []tablesource.Row) (string, error),
	r *tablesource.Reader, pool *pgxpool.Pool, from time.Time) {
	t.Helper()
	ctx := testkit.Context(t, time.Minute)
	page, err := r.Pending(ctx, pool, &tablesource.Position{OccurredAt: from}, intakePage)
	if err != nil || len(page) != intakePage {
		t.Fatalf("read %d new rows: %v", len(page), err)
	}
	plan, err := explain(ctx, page)
	if err != nil {
		t.Fatal(err)
	}
	buffers := topBuffers(plan)
	t.Logf("%s of %d rows: %d buffers\n%s", what, intakePage, buffers, plan)
	if seqScan(plan) || buffers > intakePage*160 || strings.Contains(plan, "IX_OutboxMessages_OccurredAt") || strings.Contains(plan, "Join Filter") ||
		!strings.Contains(plan, "ordo_table_take_in") {
		t.Fatalf("the %s costs the backlog: %d buffers for %d rows\n%s", what, buffers, intakePage, plan)
	}
}
