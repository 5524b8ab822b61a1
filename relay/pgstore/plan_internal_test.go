package pgstore

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/lease"
	"github.com/ordo-relay/ordo/outbox"
	"github.com/ordo-relay/ordo/relay"
)

// TestPlansFollowTheWork: the relay's read and mark cost about the same
// buffers per row with 10,000 and with 100,000 pending rows, on a table
// without statistics (autovacuum off, never analyzed), with a hot key and
// parked keys among the rows, planned for their parameters and as
// generic plans (force_generic_plan, which is what a cached prepared
// statement may fall back to). A test that only named an index would
// pass the old key-head read too: it walked one, for every row behind.
// Without the key_seq trigger too: the rows numbered by the owner into
// its journal (and so without parked keys, which the loader parks by
// their in-row key_seq), the read taking each number from the journal
// and the mark leaving it there.
func TestPlansFollowTheWork(t *testing.T) {
	testkit.RequirePostgres(t)
	for _, lean := range []bool{false, true} {
		for _, stats := range []string{"no statistics", "statistics of one hot key"} {
			name := stats
			if lean {
				name = "without the trigger, " + stats
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				plansFollowTheWork(t, stats != "no statistics", lean)
			})
		}
	}
}

// planDB returns a fresh database with the outbox and leases of 64
// partitions, every lease held by n1, and autovacuum off on the outbox,
// so that buffer counts follow the statements alone.
func planDB(t *testing.T) (*pgxpool.Pool, context.Context) {
	t.Helper()
	_, pool := testkit.NewDatabasePool(t, 2)
	ctx := testkit.Context(t, 5*time.Minute)
	if err := outbox.Migrate(ctx, pool, 64); err != nil {
		t.Fatal(err)
	}
	if err := lease.Migrate(ctx, pool, 64); err != nil {
		t.Fatal(err)
	}
	exec(t, pool, `ALTER TABLE outbox SET (autovacuum_enabled = off)`)
	exec(t, pool, `UPDATE ordo_leases SET owner = 'n1', epoch = 1, expires_at = clock_timestamp() + interval '1 hour'`)
	return pool, ctx
}

// bothPendingIndexes runs test as two subtests: with
// outbox_pending_by_partition kept (it stays until the trigger is dropped
// with it, and the numbering then joins) and dropped (the numbering walks
// each partition's range).
func bothPendingIndexes(t *testing.T, test func(t *testing.T, pendingIndex bool)) {
	t.Run("pending index kept", func(t *testing.T) { test(t, true) })
	t.Run("pending index dropped", func(t *testing.T) { test(t, false) })
}

// planDBPending is planDB, without outbox_pending_by_partition unless
// pendingIndex.
func planDBPending(t *testing.T, pendingIndex bool) (*pgxpool.Pool, context.Context) {
	t.Helper()
	pool, ctx := planDB(t)
	if !pendingIndex {
		exec(t, pool, `DROP INDEX outbox_pending_by_partition`)
	}
	return pool, ctx
}

func plansFollowTheWork(t *testing.T, hotStats, lean bool) {
	pool, _ := planDB(t)
	if lean {
		exec(t, pool, `DROP TRIGGER outbox_assign_key_seq ON outbox`)
	}
	if hotStats {
		// Statistics that say there is one key: the shape that once turned
		// the read's per-row probe into a hash of the key's whole backlog.
		load(t, pool, 3000)
		exec(t, pool, `DELETE FROM outbox WHERE correlation_id <> 'hot'`)
		exec(t, pool, `ANALYZE outbox`)
	}
	var at10k, at100k map[string]float64
	for _, total := range []int{10000, 100000} {
		load(t, pool, total)
		if lean {
			exec(t, pool, `SELECT outbox_journal_rows('n1', ARRAY(SELECT generate_series(0, 63)), NULL)`)
		}
		got := map[string]float64{}
		for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
			got["read "+mode] = readBuffersPerRow(t, pool, mode)
			got["mark "+mode] = markBuffersPerRow(t, pool, mode)
		}
		t.Logf("%d pending rows: buffers per row %v", total, got)
		if total == 10000 {
			at10k = got
		} else {
			at100k = got
		}
	}
	for what, small := range at10k {
		big := at100k[what]
		if big > 30 || big > 2*small+2 {
			t.Errorf("%s: %.1f buffers per row at 100,000 pending rows, %.1f at 10,000: cost grows with the backlog", what, big, small)
		}
	}
}

func exec(t *testing.T, pool *pgxpool.Pool, sql string) {
	t.Helper()
	if _, err := pool.Exec(testkit.Context(t, 3*time.Minute), sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// load brings the pending rows to total: a hot key with a third of them,
// 50 parked keys with followers, and the rest over 1,000 keys.
func load(t *testing.T, pool *pgxpool.Pool, total int) {
	t.Helper()
	var have int
	if err := pool.QueryRow(testkit.Context(t, 3*time.Minute), `SELECT coalesce(max(seq), 0) FROM outbox`).Scan(&have); err != nil {
		t.Fatal(err)
	}
	exec(t, pool, fmt.Sprintf(`
INSERT INTO outbox (id, partition, correlation_id, exchange, routing_key, type, payload)
SELECT gen_random_uuid(), abs(hashtext(k)) %% 64, k, 'ex', 'rk', 't', '{"pad": "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}'
FROM (SELECT CASE WHEN g %% 3 = 0 THEN 'hot'
                  WHEN g %% 20 = 1 THEN 'parked-' || (g %% 50)
                  ELSE 'key-' || (g %% 1000) END AS k
      FROM generate_series(%d, %d) AS g) AS s`, have+1, total))
	exec(t, pool, `
UPDATE outbox AS o SET parked_at = clock_timestamp(), attempts = 5, last_error = 'parked by the test'
FROM (SELECT correlation_id, min(key_seq) AS ks FROM outbox WHERE correlation_id LIKE 'parked-%' GROUP BY correlation_id) AS h
WHERE o.correlation_id = h.correlation_id AND o.key_seq = h.ks`)
}

type explained struct {
	Plan struct {
		Rows int     `json:"Actual Rows"`
		Hit  float64 `json:"Shared Hit Blocks"`
		Read float64 `json:"Shared Read Blocks"`
	} `json:"Plan"`
}

// explain runs sql (a statement with parameters $1..) as a prepared
// statement under plan_cache_mode, in a transaction it rolls back, and
// returns the rows and buffers of its top plan node.
func explain(t *testing.T, pool *pgxpool.Pool, mode, sql, args string) explained {
	t.Helper()
	ctx := testkit.Context(t, 3*time.Minute)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	name := "s" + strings.ReplaceAll(uuid.NewString(), "-", "")
	for _, stmt := range []string{"SET LOCAL plan_cache_mode = " + mode, "PREPARE " + name + " AS " + sql} {
		if _, err := tx.Exec(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	var out []byte
	if err := tx.QueryRow(ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE "+name+"("+args+")").Scan(&out); err != nil {
		t.Fatalf("explain: %v", err)
	}
	var e []explained
	if err := json.Unmarshal(out, &e); err != nil || len(e) != 1 {
		t.Fatalf("explain output: %v: %s", err, out)
	}
	return e[0]
}

func perRow(t *testing.T, what string, e explained) float64 {
	t.Helper()
	if e.Plan.Rows == 0 {
		t.Fatalf("%s returned no rows", what)
	}
	return (e.Plan.Hit + e.Plan.Read) / float64(e.Plan.Rows)
}

func readBuffersPerRow(t *testing.T, pool *pgxpool.Pool, mode string) float64 {
	parts := make([]string, 64)
	zeros := make([]string, 64)
	for i := range parts {
		parts[i], zeros[i] = fmt.Sprint(i), "0"
	}
	args := fmt.Sprintf("'{%s}', '{%s}', 16", strings.Join(parts, ","), strings.Join(zeros, ","))
	return perRow(t, "read", explain(t, pool, mode, sqlReadPending, args))
}

func markBuffersPerRow(t *testing.T, pool *pgxpool.Pool, mode string) float64 {
	var ids []string
	err := pool.QueryRow(testkit.Context(t, 3*time.Minute), `SELECT array_agg(id::text) FROM (
		SELECT id FROM outbox WHERE processed_at IS NULL ORDER BY random() LIMIT 512) AS x`).Scan(&ids)
	if err != nil {
		t.Fatal(err)
	}
	var parts []int
	err = pool.QueryRow(testkit.Context(t, 3*time.Minute), `SELECT array_agg(partition ORDER BY i) FROM
		unnest($1::uuid[]) WITH ORDINALITY AS u(id, i) JOIN outbox USING (id)`, ids).Scan(&parts)
	if err != nil {
		t.Fatal(err)
	}
	ps, es := make([]string, len(parts)), make([]string, len(parts))
	for i, p := range parts {
		ps[i], es[i] = fmt.Sprint(p), "1"
	}
	args := fmt.Sprintf("'n1', '{%s}', '{%s}', '{%s}'", strings.Join(ids, ","), strings.Join(ps, ","), strings.Join(es, ","))
	return perRow(t, "mark", explain(t, pool, mode, sqlMarkPublished, args))
}

// TestParkedKeysCostTheReadNoBuffers: a full read of every partition
// costs about the same buffers beside 20,000 parked keys (one row behind
// each) as without them, once a read has held their rows: the read's
// index leaves parked and held rows out. Without statistics and after
// ANALYZE, planned for its parameters and as a generic plan.
func TestParkedKeysCostTheReadNoBuffers(t *testing.T) {
	testkit.RequirePostgres(t)
	for _, stats := range []string{"no statistics", "ANALYZE"} {
		t.Run(stats, func(t *testing.T) {
			t.Parallel()
			parkedKeysCostNoBuffers(t, stats == "ANALYZE")
		})
	}
}

// insertKeys inserts a pending row for each key keys (a query of one
// column) yields, in its key's partition of 64.
func insertKeys(t *testing.T, pool *pgxpool.Pool, keys string) {
	t.Helper()
	exec(t, pool, `
INSERT INTO outbox (id, partition, correlation_id, exchange, routing_key, type, payload)
SELECT gen_random_uuid(), abs(hashtext(k)) % 64, k, 'ex', 'rk', 't', '{"pad": "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}'
FROM (`+keys+`) AS s(k)`)
}

func parkedKeysCostNoBuffers(t *testing.T, analyze bool) {
	const others, parkedKeys = 20000, 20000
	pool, ctx := planDB(t)
	insert := func(keys string) { insertKeys(t, pool, keys) }
	// As many rows as the parked keys will add, processed (as retention
	// keeps them for a while): alone and beside the parked keys, the
	// table and its indexes have the same size.
	insert(fmt.Sprintf(`SELECT 'done-' || (g %% %d) FROM generate_series(1, %d) AS g`, parkedKeys, 2*parkedKeys))
	exec(t, pool, `UPDATE outbox SET processed_at = clock_timestamp()`)
	insert(fmt.Sprintf(`SELECT 'key-' || (g %% 1000) FROM generate_series(1, %d) AS g`, others))
	parts, zeros := make([]string, 64), make([]string, 64)
	cursors := make([]relay.Cursor, 64)
	for i := range parts {
		parts[i], zeros[i], cursors[i] = fmt.Sprint(i), "0", relay.Cursor{Partition: i}
	}
	args := fmt.Sprintf("'{%s}', '{%s}', 100000", strings.Join(parts, ","), strings.Join(zeros, ","))
	measure := func(what string) map[string]explained {
		// Vacuumed, as autovacuum leaves the table: a row held (or
		// parked) leaves a dead entry in outbox_ready_by_partition
		// until then, which reads skip (after the first marks it dead,
		// once no older snapshot needs it).
		if analyze {
			exec(t, pool, `VACUUM ANALYZE outbox`)
		} else {
			exec(t, pool, `VACUUM outbox`)
		}
		got := map[string]explained{}
		for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
			e := explain(t, pool, mode, sqlReadPending, args)
			t.Logf("%s, %s: %d rows, %.0f buffers", what, mode, e.Plan.Rows, e.Plan.Hit+e.Plan.Read)
			got[mode] = e
		}
		return got
	}
	alone := measure("alone")

	// The parked keys: a head parked as the relay parks it, a row behind.
	insert(fmt.Sprintf(`SELECT 'parked-' || (g %% %d) FROM generate_series(1, %d) AS g`, parkedKeys, 2*parkedKeys))
	exec(t, pool, `UPDATE outbox SET parked_at = clock_timestamp(), attempts = 5, last_error = 'parked by the test'
		WHERE correlation_id LIKE 'parked-%' AND key_seq = 1`)
	s := New(pool, "n1", nil)
	rows, err := s.ReadPending(ctx, cursors, 100000) // the pass that holds the rows behind them
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the first read beside %d parked keys: %d rows", parkedKeys, len(rows))
	for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
		e := explain(t, pool, mode, sqlReadPending, args)
		t.Logf("beside parked keys, before VACUUM, %s: %d rows, %.0f buffers", mode, e.Plan.Rows, e.Plan.Hit+e.Plan.Read)
	}
	beside := measure("beside parked keys")
	for mode, a := range alone {
		b := beside[mode]
		cost, base := b.Plan.Hit+b.Plan.Read, a.Plan.Hit+a.Plan.Read
		if b.Plan.Rows != a.Plan.Rows || cost > 1.1*base+500 {
			t.Errorf("%s: a full read returns %d rows in %.0f buffers beside %d parked keys, %d rows in %.0f buffers alone",
				mode, b.Plan.Rows, cost, parkedKeys, a.Plan.Rows, base)
		}
	}
}

// TestLeanNumberingSkipsParkedKeys: without the key_seq trigger, the
// owner's numbering of a few new rows costs about the same buffers beside
// 20,000 parked keys (a held row behind each) as without them: it walks
// the rows the relay reads, not the partition's parked and held rows.
func TestLeanNumberingSkipsParkedKeys(t *testing.T) {
	testkit.RequirePostgres(t)
	bothPendingIndexes(t, leanNumberingSkipsParkedKeys)
}

func leanNumberingSkipsParkedKeys(t *testing.T, pendingIndex bool) {
	const parkedKeys, fresh = 20000, 10
	pool, ctx := planDBPending(t, pendingIndex)
	insert := func(keys string) { insertKeys(t, pool, keys) }
	parts, ids := make([]string, 64), make([]int32, 64)
	cursors := make([]relay.Cursor, 64)
	for i := range parts {
		parts[i], ids[i], cursors[i] = fmt.Sprint(i), int32(i), relay.Cursor{Partition: i}
	}
	args := fmt.Sprintf("'n1', '{%s}', NULL", strings.Join(parts, ","))
	// The parked keys, numbered by the trigger: a head parked as the
	// relay parks it and a row behind, which the first read holds.
	insert(fmt.Sprintf(`SELECT 'parked-' || (g %% %d) FROM generate_series(1, %d) AS g`, parkedKeys, 2*parkedKeys))
	exec(t, pool, `UPDATE outbox SET parked_at = clock_timestamp(), attempts = 5, last_error = 'parked by the test'
		WHERE correlation_id LIKE 'parked-%' AND key_seq = 1`)
	if _, err := New(pool, "n1", nil).ReadPending(ctx, cursors, 100000); err != nil {
		t.Fatal(err)
	}
	var held int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE held_behind IS NOT NULL`).Scan(&held); err != nil || held != parkedKeys {
		t.Fatalf("%d rows held behind the parked keys (%v), want %d", held, err, parkedKeys)
	}
	exec(t, pool, `DROP TRIGGER outbox_assign_key_seq ON outbox`)
	insert(fmt.Sprintf(`SELECT 'fresh-' || g FROM generate_series(1, %d) AS g`, fresh))
	exec(t, pool, `VACUUM outbox`)
	buffers := func(what string) float64 {
		least := numberingBuffers(t, pool, args)
		t.Logf("numbering %d rows %s: %.0f buffers", fresh, what, least)
		return least
	}
	cost := buffers(fmt.Sprintf("beside %d parked keys", parkedKeys))

	// The same numbering with the parked keys gone.
	exec(t, pool, `DELETE FROM outbox WHERE correlation_id LIKE 'parked-%'`)
	exec(t, pool, `VACUUM outbox`)
	if base := buffers("alone"); cost > 1.5*base+50 {
		t.Errorf("numbering %d rows costs %.0f buffers beside %d parked keys, %.0f alone", fresh, cost, parkedKeys, base)
	}
	var numbered int64
	if err := pool.QueryRow(ctx, `SELECT outbox_number_rows($1, $2::int[], NULL)`, "n1", ids).Scan(&numbered); err != nil || numbered != fresh {
		t.Fatalf("outbox_number_rows numbered %d rows (%v), want %d", numbered, err, fresh)
	}
}

// TestNumberingFindsAParkedRowInOneStep: the numbering's look for a
// known key's parked row (to hold the key's new rows behind it) is one
// step down the (correlation_id, key_seq) index, however many rows of
// the key have their number in the row (a key the trigger numbered for
// a long time, its published rows kept by retention), and its lock of a
// parked row one probe of the same index, however many rows are parked
// (with statistics taken before any was). Numbering 10 rows of such a
// key, or of a parked key beside 5,000 others, costs about what
// numbering 10 rows of a new key costs.
func TestNumberingFindsAParkedRowInOneStep(t *testing.T) {
	testkit.RequirePostgres(t)
	const history, parked, fresh = 20000, 5000, 10
	pool, _ := planDBPending(t, false)
	insertKeys(t, pool, fmt.Sprintf(`SELECT 'hot' FROM generate_series(1, %d)
		UNION ALL SELECT 'parked-' || g FROM generate_series(1, %d) AS g`, history, parked))
	exec(t, pool, `UPDATE outbox SET processed_at = clock_timestamp() WHERE correlation_id = 'hot'`)
	exec(t, pool, `ANALYZE outbox`)
	exec(t, pool, `UPDATE outbox SET parked_at = clock_timestamp(), attempts = 5, last_error = 'parked by the test' WHERE processed_at IS NULL`)
	exec(t, pool, `DROP TRIGGER outbox_assign_key_seq ON outbox`)
	exec(t, pool, `VACUUM outbox`)
	parts := make([]string, 64)
	for i := range parts {
		parts[i] = fmt.Sprint(i)
	}
	args := fmt.Sprintf("'n1', '{%s}', NULL", strings.Join(parts, ","))
	// The fewest buffers of a few numberings of fresh new rows of key,
	// each rolled back; the rows are deleted after.
	buffers := func(key string) float64 {
		insertKeys(t, pool, fmt.Sprintf(`SELECT '%s' FROM generate_series(1, %d)`, key, fresh))
		least := numberingBuffers(t, pool, args)
		exec(t, pool, `DELETE FROM outbox WHERE processed_at IS NULL AND parked_at IS NULL`)
		t.Logf("numbering %d rows of %s: %.0f buffers", fresh, key, least)
		return least
	}
	base := buffers("new")
	for key, what := range map[string]string{"hot": fmt.Sprintf("a key with %d numbered rows", history), "parked-1": fmt.Sprintf("a key parked beside %d others", parked-1)} {
		if b := buffers(key); b > 1.5*base+50 {
			t.Errorf("numbering %d rows of %s costs %.0f buffers; of a new key %.0f", fresh, what, b, base)
		}
	}
}

// numberingBuffers returns the fewest buffers of four numberings
// (sqlJournalRows with args), each explained and rolled back: a
// connection's first call of the function also reads the catalog.
func numberingBuffers(t *testing.T, pool *pgxpool.Pool, args string) float64 {
	t.Helper()
	least := -1.0
	for range 4 {
		e := explain(t, pool, "force_custom_plan", sqlJournalRows, args)
		if b := e.Plan.Hit + e.Plan.Read; least < 0 || b < least {
			least = b
		}
	}
	return least
}

// TestJournalNeverJoinsItsSetsRowByRow: the owner's numbering
// (outbox_journal_rows) of 13,600 rows over 4,000 keys, on a table
// without statistics, joins none of its intermediate sets by a nested
// loop that filters row by row, also when 200 of the keys are parked
// and a third of the rows are held behind them. The planner estimates
// one row for each of them, and a version that joined them nested-looped
// 4,000 keys over 13,600 rows (54 million rows removed by a join filter,
// 9-23 s); one that joined the parked keys so cost 30,000 rows times 200
// keys (about 0.5 s a call). Nor does it look up by id any outbox row but
// those it holds (one that did probed every row it numbered). The plans
// of the function's statements come from auto_explain, sent to this
// connection as notices.
func TestJournalNeverJoinsItsSetsRowByRow(t *testing.T) {
	testkit.RequirePostgres(t)
	for _, parked := range []int{0, 200} {
		t.Run(fmt.Sprintf("%d parked keys", parked), func(t *testing.T) {
			t.Parallel()
			journalNeverJoinsRowByRow(t, parked)
		})
	}
}

func journalNeverJoinsRowByRow(t *testing.T, parked int) {
	const rows = 13600
	pool, ctx := planDB(t)
	if parked > 0 {
		// Parked as the relay parks them, each with its number in the row.
		insertKeys(t, pool, fmt.Sprintf(`SELECT 'k' || g FROM generate_series(0, %d) AS g`, parked-1))
		exec(t, pool, `UPDATE outbox SET parked_at = clock_timestamp(), attempts = 5, last_error = 'parked by the test'`)
	}
	exec(t, pool, `DROP TRIGGER outbox_assign_key_seq ON outbox`)
	exec(t, pool, fmt.Sprintf(`INSERT INTO outbox (id, partition, correlation_id, exchange, routing_key, type, payload)
SELECT gen_random_uuid(), abs(hashtext(k)) %% 64, k, 'ex', 'rk', 't', '{}'
FROM (SELECT CASE WHEN g %% 3 = 0 AND %[1]d > 0 THEN 'k' || (g %% %[1]d) ELSE 'k' || (g %% 4000) END AS k
      FROM generate_series(1, %[2]d) AS g) AS s`, max(parked, 1), rows))

	conn, notices := explainingConn(t, ctx, pool)
	parts := make([]int32, 64)
	for i := range parts {
		parts[i] = int32(i)
	}
	var numbered int64
	if err := conn.QueryRow(ctx, `SELECT outbox_journal_rows('n1', $1::int[], NULL)`, parts).Scan(&numbered); err != nil || numbered != rows {
		t.Fatalf("outbox_journal_rows numbered %d rows (%v), want %d", numbered, err, rows)
	}
	var held int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE held_behind IS NOT NULL`).Scan(&held); err != nil {
		t.Fatal(err)
	}
	if parked > 0 && held < rows/3 {
		t.Fatalf("%d rows held behind the %d parked keys, want at least %d", held, parked, rows/3)
	}
	plans := notices()
	removed := regexp.MustCompile(`Rows Removed by Join Filter: (\d+)`)
	// The rows held are found by id; no other row numbered is. And no
	// scan of the outbox runs more times than there are rows to number
	// (one that probed outbox_parked for every row and partition ran
	// 64 times as often).
	byID := regexp.MustCompile(`Index Scan using outbox_pkey on outbox \w+ +\(cost=[^)]*\) \(actual rows=\d+ loops=(\d+)\)`)
	scans := regexp.MustCompile(`Scan[^\n]* on outbox \w+ +\(cost=[^)]*\) \(actual rows=\d+ loops=(\d+)\)`)
	seen, probes := false, 0
	for _, plan := range plans {
		if !strings.Contains(plan, "outbox_numbers") {
			continue
		}
		seen = true
		for _, m := range removed.FindAllStringSubmatch(plan, -1) {
			if n, _ := strconv.Atoi(m[1]); n > rows {
				t.Fatalf("the numbering filtered %d rows in a join (more than the %d it numbers):\n%s", n, rows, plan)
			}
		}
		for _, m := range byID.FindAllStringSubmatch(plan, -1) {
			n, _ := strconv.Atoi(m[1])
			probes += n
		}
		for _, m := range scans.FindAllStringSubmatch(plan, -1) {
			if n, _ := strconv.Atoi(m[1]); n > rows {
				t.Fatalf("a scan of the outbox ran %d times in the numbering of %d rows:\n%s", n, rows, plan)
			}
		}
	}
	if probes > held {
		t.Errorf("the numbering probed %d outbox rows by id; it held %d", probes, held)
	}
	if !seen {
		t.Fatalf("no plan of the numbering among %d notices", len(plans))
	}
}

// explainingConn returns a connection to pool's database on which auto_explain sends
// the plan of every statement, nested ones included (with actual rows,
// without timing), as a notice, and a function that returns the plans
// received so far. It skips the test where auto_explain is missing.
func explainingConn(t *testing.T, ctx context.Context, pool *pgxpool.Pool) (*pgx.Conn, func() []string) {
	t.Helper()
	cfg, err := pgx.ParseConfig(pool.Config().ConnConfig.ConnString())
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var plans []string
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		mu.Lock()
		defer mu.Unlock()
		plans = append(plans, n.Message)
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	for _, stmt := range []string{`LOAD 'auto_explain'`, `SET auto_explain.log_min_duration = 0`,
		`SET auto_explain.log_nested_statements = on`, `SET auto_explain.log_analyze = on`,
		`SET auto_explain.log_timing = off`, `SET auto_explain.log_level = notice`} {
		if _, err := conn.Exec(ctx, stmt); err != nil {
			t.Skipf("auto_explain is not available here (%s: %v)", stmt, err)
		}
	}
	return conn, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), plans...)
	}
}

// hotKeyBacklog is planDBPending without the key_seq trigger, holding
// 20,000 pending rows of one key in partition 1, analyzed; it returns
// their first seq.
func hotKeyBacklog(t *testing.T, pendingIndex bool) (*pgxpool.Pool, context.Context, int64) {
	t.Helper()
	pool, ctx := planDBPending(t, pendingIndex)
	exec(t, pool, `DROP TRIGGER outbox_assign_key_seq ON outbox`)
	exec(t, pool, `INSERT INTO outbox (id, partition, correlation_id, exchange, routing_key, type, payload)
SELECT gen_random_uuid(), 1, 'hot', 'ex', 'rk', 't', jsonb_build_object('pad', repeat('x', 250)) FROM generate_series(1, 20000)`)
	exec(t, pool, `ANALYZE outbox`)
	var first int64
	if err := pool.QueryRow(ctx, `SELECT min(seq) FROM outbox`).Scan(&first); err != nil {
		t.Fatal(err)
	}
	return pool, ctx, first
}

// numberTo numbers partition 1's rows up to seq top on q and checks that
// it numbered want.
func numberTo(t *testing.T, ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, top, want int64) {
	t.Helper()
	var n int64
	if err := q.QueryRow(ctx, sqlJournalRows, "n1", []int32{1}, []int64{top}).Scan(&n); err != nil || n != want {
		t.Fatalf("numbered %d rows (%v), want %d", n, err, want)
	}
}

// TestNumberingReadsOnlyWhatItWalks: the owner's numbering of a page of
// one key's backlog reads, from the outbox and from the journal, the rows
// it walks (the partition's ready rows up to the page) and no others,
// beside 100,000 processed rows of other partitions whose numbers are in
// the journal (where the mark leaves them), on a table analyzed while
// that key's backlog was all it held, and again analyzed with them.
// Statistics that promise many ready rows made a numbering free to do so
// hash join what it walked with the whole outbox (to find the rows to
// park) and with the whole journal (to skip the rows numbered before):
// every call read the tables.
func TestNumberingReadsOnlyWhatItWalks(t *testing.T) {
	testkit.RequirePostgres(t)
	bothPendingIndexes(t, numberingReadsOnlyWhatItWalks)
}

func numberingReadsOnlyWhatItWalks(t *testing.T, pendingIndex bool) {
	const numbered, page = 5000, 512
	pool, ctx, first := hotKeyBacklog(t, pendingIndex)
	// The rows a relay has read ahead: numbered, not yet marked.
	numberTo(t, ctx, pool, first+numbered-1, numbered)
	exec(t, pool, `ANALYZE outbox, outbox_numbers`) // as autovacuum would, in a drain
	exec(t, pool, `WITH done AS (
    INSERT INTO outbox (id, partition, correlation_id, exchange, routing_key, type, payload, processed_at)
    SELECT gen_random_uuid(), 2 + g % 60, 'done-' || g, 'ex', 'rk', 't', '{}', clock_timestamp() FROM generate_series(1, 100000) AS g
    RETURNING id, partition, correlation_id)
INSERT INTO outbox_numbers (id, partition, correlation_id, key_seq) SELECT id, partition, correlation_id, 1 FROM done`)

	walked := int64(numbered)
	for _, analyzed := range []bool{false, true} {
		if analyzed {
			exec(t, pool, `ANALYZE outbox, outbox_numbers`)
		}
		conn, notices := explainingConn(t, ctx, pool)
		walked += page
		numberTo(t, ctx, conn, first+walked-1, page)
		if wrong := widestScan(notices(), walked); wrong != "" {
			t.Fatalf("analyzed %v: the numbering of %d rows (it walks %d): %s", analyzed, page, walked, wrong)
		}
	}
}

// TestNumberingWalksFromItsMark: once the owner's numbering has walked a
// key's first 5,000 rows (and sampled the outbox's writers: none) and
// then the next 512 (moving the partition's mark), the numbering of the
// next 512 reads that page's rows and no others from the outbox and the
// journal: it walks from the mark (docs/outbox-table.md, "Where the walk
// starts"). From the first row, it walked the read-ahead again in every
// call.
func TestNumberingWalksFromItsMark(t *testing.T) {
	testkit.RequirePostgres(t)
	bothPendingIndexes(t, numberingWalksFromItsMark)
}

func numberingWalksFromItsMark(t *testing.T, pendingIndex bool) {
	const numbered, page = 5000, 512
	pool, ctx, first := hotKeyBacklog(t, pendingIndex)
	numberTo(t, ctx, pool, first+numbered-1, numbered)
	numberTo(t, ctx, pool, first+numbered+page-1, page)
	conn, notices := explainingConn(t, ctx, pool)
	numberTo(t, ctx, conn, first+numbered+2*page-1, page)
	if wrong := widestScan(notices(), page); wrong != "" {
		t.Fatalf("the numbering of the %d rows after %d numbered: %s", page, numbered+page, wrong)
	}
}

// TestNumberingWithoutStatistics: on an outbox never analyzed (a burst
// into a fresh table), the owner's numbering of a page of every partition
// reads each partition's rows up to its page and no others. Joined with
// the partitions plainly, PostgreSQL guessed one ready row and hashed the
// whole backlog in every call.
func TestNumberingWithoutStatistics(t *testing.T) {
	testkit.RequirePostgres(t)
	bothPendingIndexes(t, numberingWithoutStatistics)
}

func numberingWithoutStatistics(t *testing.T, pendingIndex bool) {
	const rows, keys, perPartition = 20000, 2000, 8
	pool, ctx := planDBPending(t, pendingIndex)
	exec(t, pool, `DROP TRIGGER outbox_assign_key_seq ON outbox`)
	exec(t, pool, fmt.Sprintf(`INSERT INTO outbox (id, partition, correlation_id, exchange, routing_key, type, payload)
SELECT gen_random_uuid(), (g %% %[2]d) %% 64, 'k-' || (g %% %[2]d), 'ex', 'rk', 't', jsonb_build_object('pad', repeat('x', 250))
FROM generate_series(1, %[1]d) AS g`, rows, keys))
	var analyzed bool
	if err := pool.QueryRow(ctx, `SELECT reltuples >= 0 FROM pg_class WHERE oid = 'outbox'::regclass`).Scan(&analyzed); err != nil || analyzed {
		t.Fatalf("the outbox has statistics (%v): this test needs a table never analyzed", err)
	}
	// Each partition's page: its first perPartition rows.
	var parts []int32
	var tops []int64
	if err := pool.QueryRow(ctx, fmt.Sprintf(`SELECT array_agg(partition ORDER BY partition), array_agg(seq ORDER BY partition)
FROM (SELECT partition, seq, row_number() OVER (PARTITION BY partition ORDER BY seq) AS rn FROM outbox) AS o
WHERE rn = %d`, perPartition)).Scan(&parts, &tops); err != nil {
		t.Fatal(err)
	}
	walked := int64(len(parts) * perPartition)
	conn, notices := explainingConn(t, ctx, pool)
	var n int64
	if err := conn.QueryRow(ctx, sqlJournalRows, "n1", parts, tops).Scan(&n); err != nil || n != walked {
		t.Fatalf("numbered %d rows (%v), want %d", n, err, walked)
	}
	if wrong := widestScan(notices(), walked); wrong != "" {
		t.Fatalf("the numbering of %d rows of a table never analyzed: %s", walked, wrong)
	}
}

// numberingScan is a scan of the outbox or the journal in an auto_explain
// plan with ANALYZE and without timing: the table, rows and loops.
var numberingScan = regexp.MustCompile(`(?m)^.*Scan[^\n]* on (outbox|outbox_numbers) [^\n]*rows=(\d+) loops=(\d+)\)$`)

// widestScan looks at every scan of the outbox or the journal in the
// numbering's plans (those of the statement that names outbox_numbers),
// rows times loops, and says which reads more than walked rows, with its
// plan, or that the plans hold no scan of the outbox at all; "" if
// neither.
func widestScan(plans []string, walked int64) string {
	seen := false
	for _, p := range plans {
		if !strings.Contains(p, "outbox_numbers") {
			continue
		}
		for _, m := range numberingScan.FindAllStringSubmatch(p, -1) {
			seen = seen || m[1] == "outbox"
			rows, _ := strconv.ParseInt(m[2], 10, 64)
			loops, _ := strconv.ParseInt(m[3], 10, 64)
			if rows*loops > walked {
				return fmt.Sprintf("read %d rows of %s in one scan:\n%s", rows*loops, m[1], p)
			}
		}
	}
	if !seen {
		return "no scan of the outbox in the numbering's plans"
	}
	return ""
}
