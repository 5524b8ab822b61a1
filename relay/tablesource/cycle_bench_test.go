package tablesource_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/relay"
	"github.com/ordo-relay/ordo/relay/tablesource"
)

// The relay's PostgreSQL work per row of an adopted table, measured on
// one backend: the article's table with cycleRows pending rows over
// cycleKeys keys, taken in, read and marked a page at a time, each step
// its own transaction, after cycleWarmUp rows. The backend's CPU comes
// from /proc (PostgreSQL must run on this machine), WAL from
// pg_current_wal_lsn(). docs/adopt.md, "Not built yet", gives the
// figures. Run with -benchtime 1x: an iteration is a whole run.
const (
	cycleRows   = 30000
	cycleKeys   = 10000
	cycleWarmUp = 3000
)

var cyclePages = []int{1, 16, 64}

// cycleWrites are the write sets cycle.step knows: today's and the two
// prototypes'.
var cycleWrites = []string{"rows", "page-row", "partition-rows"}

// BenchmarkTakeIn: the intake's take alone (Intake.Take: the planner
// settings and the take statement in one pipeline), pages of 1, 16 and
// 64 rows.
func BenchmarkTakeIn(b *testing.B) {
	for _, page := range cyclePages {
		b.Run(fmt.Sprintf("page=%d", page), func(b *testing.B) {
			for range b.N {
				c := newCycle(b, cycleRows)
				c.run(b, page, func(rows []tablesource.Row) {
					if n, err := c.in.Take(c.ctx, rows); err != nil || n != len(rows) {
						b.Fatalf("took in %d of %d rows: %v", n, len(rows), err)
					}
				})
			}
		})
	}
}

// BenchmarkRelayCycle: each page taken in, read back by its partitions
// (Store.ReadPending) and marked (Store.MarkPublished): what the relay
// of an adopted table writes and reads per row today (write=rows). Beside
// it, two prototypes of the write set without a bookkeeping row per
// message, the page numbered by one upsert of its keys' counters and
// marked by setting the user's processed-at and deleting what the page
// wrote: write=page-row writes the page as one row of arrays and reads
// it back by that row (pageRow); write=partition-rows writes one such
// row a partition of the page and reads each partition above its cursor
// (partitionRows). The prototypes leave out failing and parked rows and
// the previous row's state: they bound what such a design could save,
// they are not one.
func BenchmarkRelayCycle(b *testing.B) {
	for _, write := range cycleWrites {
		for _, page := range cyclePages {
			b.Run(fmt.Sprintf("write=%s/page=%d", write, page), func(b *testing.B) {
				for range b.N {
					c := newCycle(b, cycleRows)
					step := c.step(b, write)
					c.run(b, page, step)
				}
			})
		}
	}
}

// cycle is one benchmark run's database: the article's table filled,
// Ordo's tables migrated, every lease held by n1 at epoch 1, and an
// intake and a store on a pool of one connection, whose backend pid is
// measured.
type cycle struct {
	ctx   context.Context
	pool  *pgxpool.Pool // for set-up and WAL positions
	one   *pgxpool.Pool // the measured connection
	pid   int
	in    *tablesource.Intake
	store *tablesource.Store
	rows  []tablesource.Row // every pending row, in read order
}

// TestRelayCycleSteps: the benchmarks' steps do what they stand for:
// after every page went through today's cycle or the prototype's, every
// user row is processed and no bookkeeping is left.
func TestRelayCycleSteps(t *testing.T) {
	t.Parallel()
	for _, write := range cycleWrites {
		t.Run(write, func(t *testing.T) {
			t.Parallel()
			c := newCycle(t, 160)
			step, left := c.step(t, write), `SELECT count(*) FROM bench_pages`
			if write == "rows" {
				left = `SELECT count(*) FROM ordo_table_rows`
			}
			for i := 0; i < len(c.rows); i += 16 {
				step(c.rows[i : i+16])
			}
			var pending, kept int
			if err := c.pool.QueryRow(c.ctx, `SELECT count(*) FROM "OutboxMessages" WHERE "ProcessedAt" IS NULL`).Scan(&pending); err != nil {
				t.Fatal(err)
			}
			if err := c.pool.QueryRow(c.ctx, left).Scan(&kept); err != nil {
				t.Fatal(err)
			}
			if pending != 0 || kept != 0 {
				t.Fatalf("after the cycle: %d user rows pending, %d bookkeeping rows left; want none", pending, kept)
			}
		})
	}
}

// newCycle returns a run's database with n pending rows (a benchmark's
// timer stopped).
func newCycle(tb testing.TB, n int) *cycle {
	if b, ok := tb.(*testing.B); ok {
		b.StopTimer()
	}
	pool := adoptedDB(tb)
	ctx := testkit.Context(tb, 5*time.Minute)
	cfg := pool.Config().Copy()
	cfg.MaxConns = 1
	one, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(one.Close)
	c := &cycle{ctx: ctx, pool: pool, one: one}
	if err := one.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&c.pid); err != nil {
		tb.Fatal(err)
	}
	if _, err := backendCPU(c.pid); err != nil {
		tb.Skipf("the backend's CPU is not readable here (PostgreSQL on another machine?): %v", err)
	}
	r, err := tablesource.NewReader(tablesource.Article(), storeParts)
	if err != nil {
		tb.Fatal(err)
	}
	c.in = tablesource.NewIntake(one, "n1", r, nil)
	if c.store, err = tablesource.NewStore(one, "n1", tablesource.Article(), "bookstore.ordering", nil); err != nil {
		tb.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `
INSERT INTO "OutboxMessages" ("Id", "Type", "RoutingKey", "Payload", "CorrelationId", "OccurredAt")
SELECT gen_random_uuid(), 'OrderPlaced', 'order.placed',
       jsonb_build_object('order', i, 'pad', repeat('x', 250)), 'k' || (i % $2),
       now() - interval '1 hour' + i * interval '1 ms'
FROM generate_series(1, $1) AS i`, n, cycleKeys); err != nil {
		tb.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `ANALYZE "OutboxMessages"`); err != nil {
		tb.Fatal(err)
	}
	if c.rows, err = r.Pending(ctx, pool, nil, n); err != nil || len(c.rows) != n {
		tb.Fatalf("read %d of %d rows: %v", len(c.rows), n, err)
	}
	return c
}

// run calls step on each page of c's rows, measures the pages after
// cycleWarmUp rows, and reports the backend's CPU per row and per page
// and the WAL per row.
func (c *cycle) run(b *testing.B, page int, step func([]tablesource.Row)) {
	i := 0
	for ; i < cycleWarmUp; i += page {
		step(c.rows[i : i+page])
	}
	wal0 := c.walPosition(b)
	cpu0, err := backendCPU(c.pid)
	if err != nil {
		b.Fatal(err)
	}
	b.StartTimer()
	pages := 0
	for ; i+page <= len(c.rows); i += page {
		step(c.rows[i : i+page])
		pages++
	}
	b.StopTimer()
	cpu1, err := backendCPU(c.pid)
	if err != nil {
		b.Fatal(err)
	}
	wal1 := c.walPosition(b)
	rows := float64(pages * page)
	b.ReportMetric((cpu1-cpu0).Seconds()*1e6/rows, "pg-µs/row")
	b.ReportMetric((cpu1-cpu0).Seconds()*1e6/float64(pages), "pg-µs/page")
	b.ReportMetric(float64(wal1-wal0)/rows, "wal-B/row")
}

func (c *cycle) walPosition(b *testing.B) int64 {
	var lsn int64
	if err := c.pool.QueryRow(c.ctx, `SELECT pg_current_wal_lsn() - '0/0'`).Scan(&lsn); err != nil {
		b.Fatal(err)
	}
	return lsn
}

// step returns the cycle of one page for write: "rows" (today),
// "page-row" or "partition-rows" (the prototypes).
func (c *cycle) step(b testing.TB, write string) func([]tablesource.Row) {
	switch write {
	case "page-row":
		return c.pageRow(b)
	case "partition-rows":
		return c.partitionRows(b)
	}
	return c.today(b)
}

// today is a page's take, read and mark as the relay does them.
func (c *cycle) today(b testing.TB) func([]tablesource.Row) {
	cursors := map[int]int64{}
	return func(rows []tablesource.Row) {
		if n, err := c.in.Take(c.ctx, rows); err != nil || n != len(rows) {
			b.Fatalf("took in %d of %d rows: %v", n, len(rows), err)
		}
		var cs []relay.Cursor
		seen := map[int]bool{}
		for _, r := range rows {
			if !seen[r.Partition] {
				seen[r.Partition] = true
				cs = append(cs, relay.Cursor{Partition: r.Partition, After: cursors[r.Partition]})
			}
		}
		read, err := c.store.ReadPending(c.ctx, cs, len(rows))
		if err != nil || len(read) != len(rows) {
			b.Fatalf("read %d of %d rows: %v", len(read), len(rows), err)
		}
		settled := make([]relay.Settled, len(read))
		for i, r := range read {
			cursors[r.Partition] = max(cursors[r.Partition], r.Seq)
			settled[i] = relay.Settled{ID: r.ID, Partition: r.Partition, Epoch: 1}
		}
		if marked, err := c.store.MarkPublished(c.ctx, settled); err != nil || len(marked) != len(rows) {
			b.Fatalf("marked %d of %d rows: %v", len(marked), len(rows), err)
		}
	}
}

// pageRow is the prototype's take, read and mark of a page (see
// BenchmarkRelayCycle), in statements shaped like today's: the lease
// rows locked FOR SHARE by the mark, a notification by the take.
func (c *cycle) pageRow(b testing.TB) func([]tablesource.Row) {
	if _, err := c.pool.Exec(c.ctx, `CREATE TABLE bench_pages (
    id bigserial PRIMARY KEY, ids uuid[] NOT NULL, key_seqs bigint[] NOT NULL, partitions int[] NOT NULL)`); err != nil {
		b.Fatal(err)
	}
	return func(rows []tablesource.Row) {
		args := numberingArgs(rows)
		ids, parts := args[0], args[2]
		var pageID int64
		bt := &pgx.Batch{}
		bt.Queue(`
WITH `+sqlBenchNumbering+`
INSERT INTO bench_pages (ids, key_seqs, partitions)
SELECT array_agg(p.id ORDER BY p.ord), array_agg(c.top - p.n + p.rn ORDER BY p.ord), array_agg(p.partition ORDER BY p.ord)
FROM p JOIN c ON c.key = p.key
RETURNING id, pg_notify('bench_pages', array_to_string($3::int[], ','))`, args...).
			QueryRow(func(row pgx.Row) error { return row.Scan(&pageID, nil) })
		if err := c.one.SendBatch(c.ctx, bt).Close(); err != nil {
			b.Fatal(err)
		}
		read, err := c.one.Query(c.ctx, `
SELECT x.id, x.key_seq, x.partition, m."Type"::text, m."RoutingKey"::text, m."Payload"::text, m."CorrelationId", m."ProcessedAt"
FROM bench_pages AS p CROSS JOIN LATERAL unnest(p.ids, p.key_seqs, p.partitions) AS x(id, key_seq, partition)
JOIN "OutboxMessages" AS m ON m."Id" = x.id
WHERE p.id = $1`, pageID)
		if err != nil {
			b.Fatal(err)
		}
		n := 0
		for read.Next() {
			n++
		}
		if read.Close(); read.Err() != nil || n != len(rows) {
			b.Fatalf("read %d of %d rows: %v", n, len(rows), read.Err())
		}
		c.markPages(b, ids, parts, []int64{pageID}, len(rows))
	}
}

// numberingArgs are sqlBenchNumbering's parameters for a page: its ids,
// keys and partitions in read order, and its distinct keys (in key
// order, as the take locks counters) with their partitions and row counts.
func numberingArgs(rows []tablesource.Row) []any {
	ids := make([][16]byte, len(rows))
	keys := make([]string, len(rows))
	parts := make([]int32, len(rows))
	perKey := map[string]int32{}
	partOf := map[string]int32{}
	for i, r := range rows {
		ids[i], keys[i], parts[i] = r.ID, r.Key, int32(r.Partition)
		perKey[r.Key]++
		partOf[r.Key] = int32(r.Partition)
	}
	distinct := make([]string, 0, len(perKey))
	for k := range perKey {
		distinct = append(distinct, k)
	}
	sort.Strings(distinct)
	kparts, counts := make([]int32, len(distinct)), make([]int32, len(distinct))
	for i, k := range distinct {
		kparts[i], counts[i] = partOf[k], perKey[k]
	}
	return []any{ids, keys, parts, distinct, kparts, counts}
}

// sqlBenchNumbering numbers a page (numberingArgs): c, each key's
// counter moved by its rows and returned (one upsert, no separate lock),
// and p, the page's rows with their place in their key (rn of n), so
// that a row's key_seq is c.top - p.n + p.rn.
const sqlBenchNumbering = `c AS (
    INSERT INTO ordo_table_keys AS k (key, partition, last_key_seq)
    SELECT u.key, u.partition, u.n FROM unnest($4::text[], $5::int[], $6::int[]) AS u(key, partition, n)
    ON CONFLICT (key) DO UPDATE SET last_key_seq = k.last_key_seq + EXCLUDED.last_key_seq
    RETURNING k.key, k.last_key_seq AS top
), p AS (
    SELECT u.id, u.key, u.partition, u.ord,
           row_number() OVER (PARTITION BY u.key ORDER BY u.ord) AS rn, count(*) OVER (PARTITION BY u.key) AS n
    FROM unnest($1::uuid[], $2::text[], $3::int[]) WITH ORDINALITY AS u(id, key, partition, ord)
)`

// partitionRows is the prototype with one row a page and partition
// (write=partition-rows): each partition's rows read above its cursor
// by its owner, as today's relay reads, and each page-partition row
// deleted by the mark of its rows.
func (c *cycle) partitionRows(b testing.TB) func([]tablesource.Row) {
	if _, err := c.pool.Exec(c.ctx, `CREATE TABLE bench_pages (
    id bigserial PRIMARY KEY, partition int NOT NULL, ids uuid[] NOT NULL, key_seqs bigint[] NOT NULL);
CREATE INDEX bench_pages_partition ON bench_pages (partition, id)`); err != nil {
		b.Fatal(err)
	}
	cursors := map[int32]int64{}
	return func(rows []tablesource.Row) {
		args := numberingArgs(rows)
		ids, parts := args[0], args[2]
		bt := &pgx.Batch{}
		bt.Queue(`
WITH `+sqlBenchNumbering+`,
ins AS (
    INSERT INTO bench_pages (partition, ids, key_seqs)
    SELECT p.partition, array_agg(p.id ORDER BY p.ord), array_agg(c.top - p.n + p.rn ORDER BY p.ord)
    FROM p JOIN c ON c.key = p.key GROUP BY p.partition
    RETURNING partition)
SELECT count(*), pg_notify('bench_pages', string_agg(partition::text, ',')) FROM ins`, args...).
			QueryRow(func(row pgx.Row) error { return row.Scan(nil, nil) })
		if err := c.one.SendBatch(c.ctx, bt).Close(); err != nil {
			b.Fatal(err)
		}
		var cp []int32
		var after []int64
		for _, p := range parts.([]int32) {
			if !slices.Contains(cp, p) {
				cp = append(cp, p)
				after = append(after, cursors[p])
			}
		}
		read, err := c.one.Query(c.ctx, `
SELECT p.id, p.partition, x.id, x.key_seq, m."Type"::text, m."RoutingKey"::text, m."Payload"::text, m."CorrelationId", m."ProcessedAt"
FROM unnest($1::int[], $2::bigint[]) AS cur(partition, after)
CROSS JOIN LATERAL (
    SELECT * FROM bench_pages AS p WHERE p.partition = cur.partition AND p.id > cur.after ORDER BY p.id) AS p
CROSS JOIN LATERAL unnest(p.ids, p.key_seqs) AS x(id, key_seq)
JOIN "OutboxMessages" AS m ON m."Id" = x.id`, cp, after)
		if err != nil {
			b.Fatal(err)
		}
		var pageIDs []int64
		n := 0
		for read.Next() {
			var id int64
			var part int32
			if err := read.Scan(&id, &part, nil, nil, nil, nil, nil, nil, nil); err != nil {
				b.Fatal(err)
			}
			cursors[part] = max(cursors[part], id)
			if !slices.Contains(pageIDs, id) {
				pageIDs = append(pageIDs, id)
			}
			n++
		}
		if read.Close(); read.Err() != nil || n != len(rows) {
			b.Fatalf("read %d of %d rows: %v", n, len(rows), read.Err())
		}
		c.markPages(b, ids, parts, pageIDs, len(rows))
	}
}

// markPages is the prototypes' mark: the user's rows ids set processed
// and the page rows pageIDs deleted, while n1 holds the rows' partitions
// parts (their lease rows locked FOR SHARE, as today's mark does); want
// rows must be marked.
func (c *cycle) markPages(b testing.TB, ids, parts any, pageIDs []int64, want int) {
	var marked int
	if err := c.one.QueryRow(c.ctx, `
WITH held AS (
    SELECT l.partition FROM ordo_leases AS l
    WHERE l.owner = 'n1' AND l.partition = ANY($3::int[])
    ORDER BY l.partition
    FOR SHARE),
u AS (
    UPDATE "OutboxMessages" AS m SET "ProcessedAt" = clock_timestamp()
    WHERE m."Id" = ANY($1::uuid[]) AND m."ProcessedAt" IS NULL AND (SELECT count(*) FROM held) > 0
    RETURNING 1),
d AS (DELETE FROM bench_pages WHERE id = ANY($2::bigint[]))
SELECT count(*) FROM u`, ids, pageIDs, parts).Scan(&marked); err != nil || marked != want {
		b.Fatalf("marked %d of %d rows: %v", marked, want, err)
	}
}

// backendCPU returns the CPU time the process pid has used (user and
// system), from /proc.
func backendCPU(pid int) (time.Duration, error) {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The fields after the command name, which is in parentheses and may
	// hold spaces: utime and stime are the 12th and 13th.
	s := string(stat)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(fields) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields after the name", pid, len(fields))
	}
	var ticks int64
	for _, f := range fields[11:13] {
		v, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
		}
		ticks += v
	}
	return time.Duration(ticks) * time.Second / clockTicks, nil
}

// clockTicks is USER_HZ, the unit of /proc's CPU times: 100 on Linux.
const clockTicks = 100
