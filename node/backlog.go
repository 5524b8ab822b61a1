package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ordo-relay/ordo/internal/outage"
)

const (
	// BacklogSampleRows is how many pending rows of one partition a
	// snapshot counts at most. A partition with more is estimated from the
	// seq density of those rows (see estimatePending).
	BacklogSampleRows = 256
	// BacklogParkedCap is the most parked rows counted per partition.
	BacklogParkedCap = 10000
)

// backlogQuery is what a Backlog runs: the backlog of every partition
// (one row each, scanned by scanBacklog) and the count of rows ever
// written.
type backlogQuery struct {
	rows, produced string
}

// outboxBacklog counts Ordo's own outbox. Every part is a bounded probe
// of one partial index (outbox_ready_by_partition, the rows that can go,
// and outbox_parked), so its cost is O(partitions), whatever the backlog,
// as long as the planner walks those indexes in order (sqlBacklogPlan).
// Rows held behind a parked row are in neither: they wait for an operator
// with the parked row, and are not counted.
var outboxBacklog = backlogQuery{
	rows: backlogSQL("outbox", "processed_at IS NULL AND parked_at IS NULL AND held_behind IS NULL",
		"parked_at IS NOT NULL AND processed_at IS NULL"),
	produced: producedSQL("outbox"),
}

// tableBacklog counts an adopted table's rows that Ordo's intake took in
// (ordo_table_rows, docs/adopt.md): its ordo_table_rows_ready and
// ordo_table_rows_parked indexes, probed as outboxBacklog probes the
// outbox's. Rows of the user's table not yet taken in are not counted,
// nor, as in the outbox, rows held behind a parked row.
var tableBacklog = backlogQuery{
	rows: backlogSQL("ordo_table_rows", "parked_at IS NULL AND dead_at IS NULL AND held_behind IS NULL",
		"parked_at IS NOT NULL AND dead_at IS NULL"),
	produced: producedSQL("ordo_table_rows"),
}

// producedSQL reads how many rows table ever had: its seq identity's last
// value, one probe of a sequence.
func producedSQL(table string) string {
	return `SELECT coalesce(pg_sequence_last_value(pg_get_serial_sequence('` + table + `', 'seq')::regclass), 0)`
}

// backlogSQL is one row per partition: its lease and the backlog of
// table, whose rows that can go match ready (the predicate of an index on
// (partition, seq)) and whose parked rows match parked (that of an index
// on partition).
func backlogSQL(table, ready, parked string) string {
	return strings.NewReplacer("$table", table, "$ready", ready, "$parkedcap", strconv.Itoa(BacklogParkedCap),
		"$parked", parked, "$sample", strconv.Itoa(BacklogSampleRows)).Replace(`
SELECT l.partition, coalesce(l.owner, ''), l.epoch, nullif(l.expires_at, '-infinity'),
       l.owner IS NOT NULL AND l.expires_at > clock_timestamp(),
       h.n, h.first_seq, h.last_sampled, t.seq,
       extract(epoch FROM clock_timestamp() - o.occurred_at)::float8,
       k.n
FROM ordo_leases AS l
CROSS JOIN LATERAL (
    SELECT count(*) AS n, min(seq) AS first_seq, max(seq) AS last_sampled FROM (
        SELECT seq FROM $table
        WHERE partition = l.partition AND $ready
        ORDER BY seq LIMIT $sample) AS s
) AS h
LEFT JOIN LATERAL (
    SELECT seq FROM $table
    WHERE partition = l.partition AND $ready
    ORDER BY seq DESC LIMIT 1
) AS t ON true
LEFT JOIN LATERAL (
    SELECT occurred_at FROM $table
    WHERE partition = l.partition AND $ready
    ORDER BY seq LIMIT 1
) AS o ON true
CROSS JOIN LATERAL (
    SELECT count(*) AS n FROM (
        SELECT 1 FROM $table
        WHERE partition = l.partition AND $parked
        LIMIT $parkedcap) AS s
) AS k
ORDER BY l.partition`)
}

// sqlBacklogPlan confines the planner, for the backlog query's own
// transaction, to the plan backlogSQL is written for: ordered scans of
// the indexes, each stopping at its LIMIT. On a table without statistics
// (a fresh backlog, before autovacuum's ANALYZE) PostgreSQL estimated 14
// pending rows per partition and chose a bitmap heap scan and a sort of
// every pending row of each partition, twice: 4.2-5.5 s at
// 400,000 rows and 13.7 s at 1,000,000, past the refresh timeout on every
// refresh of a whole drain. Without bitmap and sequential scans the only
// plans left are the index walks: 38-90 ms at 1,000,000 rows, half of
// them drained. JIT compilation, which the inflated cost estimates
// trigger, would cost more than the query.
const sqlBacklogPlan = `SELECT set_config('enable_bitmapscan', 'off', true), set_config('enable_seqscan', 'off', true),
       set_config('jit', 'off', true)`

// backlogTimeout bounds one refresh (both queries): the index probes take
// well under 0.1 s per 64 partitions, whatever the backlog, so this is
// room for a loaded database, and it stays under the staleness limit of
// the views (3 intervals + 2 s) so one slow refresh alone does not make
// the snapshot stale.
func backlogTimeout(every time.Duration) time.Duration { return max(every, 2*time.Second) }

// historyWindow is how far back Backlog.History reaches.
const historyWindow = 10 * time.Minute

// Sample is the cluster's flow at one backlog refresh, for the cluster
// page's charts.
type Sample struct {
	// At is the refresh time in Unix milliseconds.
	At int64 `json:"at"`
	// Pending and Parked sum every partition; MaxAgeSeconds is the oldest
	// pending (not parked) age of any partition.
	Pending       int64   `json:"pending"`
	Parked        int64   `json:"parked"`
	MaxAgeSeconds float64 `json:"maxAgeSeconds"`
	// ProducedPerSecond is the insert rate since the previous sample (from
	// the seq identity), ProcessedPerSecond the rate at which rows left
	// the backlog: produced minus the change in Pending (approximate when
	// pending counts are estimated).
	ProducedPerSecond  float64 `json:"producedPerSecond"`
	ProcessedPerSecond float64 `json:"processedPerSecond"`

	produced int64
}

// estimatePending returns a partition's pending count from a sample of
// its first n pending rows (seq first..lastSampled) and its last pending
// seq: exact when the sample holds every pending row, else the sample's
// density (rows per seq) times the seq span of the whole backlog.
func estimatePending(n, first, lastSampled, last int64) (count int64, estimated bool) {
	if n < BacklogSampleRows || last <= lastSampled {
		return n, false
	}
	span := float64(last - first + 1)
	density := float64(n) / float64(lastSampled-first+1)
	return max(n, int64(span*density)), true
}

// BacklogSnapshot is every partition's lease and backlog at one instant.
type BacklogSnapshot struct {
	// Taken is when the last successful refresh finished; zero before it.
	Taken      time.Time
	Partitions []PartitionStatus
	// Err is the last refresh's error, nil when it succeeded.
	Err error
}

// Fresh reports whether the snapshot was taken within maxAge of now.
func (s BacklogSnapshot) Fresh(now time.Time, maxAge time.Duration) bool {
	return !s.Taken.IsZero() && now.Sub(s.Taken) <= maxAge
}

// Backlog keeps a snapshot of every partition's lease and backlog, taken
// with one query every Every. /status, the cluster page and /metrics all
// read the same snapshot, so the database does O(partitions) work per
// interval per node however often they are asked. Safe for concurrent
// use; Run refreshes it.
type Backlog struct {
	pool   *pgxpool.Pool
	q      backlogQuery
	every  time.Duration
	logger *slog.Logger
	down   *outage.Log

	mu        sync.Mutex
	started   time.Time // when Run began: the age of a snapshot not yet taken
	snap      BacklogSnapshot
	history   []Sample // oldest first, at most historyWindow long
	refreshes int64
	failures  int64
	took      time.Duration
}

// NewBacklog returns a Backlog of pool's outbox refreshed every `every`.
func NewBacklog(pool *pgxpool.Pool, every time.Duration, logger *slog.Logger) *Backlog {
	return newBacklog(pool, outboxBacklog, every, logger)
}

func newBacklog(pool *pgxpool.Pool, q backlogQuery, every time.Duration, logger *slog.Logger) *Backlog {
	return &Backlog{pool: pool, q: q, every: every, logger: logger, down: outage.New(logger, "backlog query")}
}

// Run refreshes the snapshot every interval until ctx ends, then returns
// nil. Failures are logged once per outage (internal/outage) and kept in
// the snapshot's Err.
func (b *Backlog) Run(ctx context.Context) error {
	b.mu.Lock()
	b.started = time.Now()
	b.mu.Unlock()
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		b.refresh(ctx)
		t.Reset(b.every)
	}
}

// refresh runs the backlog query once and stores its result or error.
func (b *Backlog) refresh(ctx context.Context) {
	qctx, cancel := context.WithTimeout(ctx, backlogTimeout(b.every))
	defer cancel()
	start := time.Now()
	parts, err := queryBacklog(qctx, b.pool, b.q.rows)
	var produced int64
	if err == nil {
		err = b.pool.QueryRow(qctx, b.q.produced, pgx.QueryExecModeSimpleProtocol).Scan(&produced)
	}
	took := time.Since(start)
	if ctx.Err() != nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.refreshes++
	b.took = took
	if err != nil {
		b.failures++
		b.snap.Err = err
		b.down.Fail(err)
		return
	}
	b.down.OK()
	b.snap = BacklogSnapshot{Taken: time.Now(), Partitions: parts}
	b.record(b.snap.Taken, parts, produced)
}

// record appends a history sample and drops those past historyWindow.
func (b *Backlog) record(now time.Time, parts []PartitionStatus, produced int64) {
	x := Sample{At: now.UnixMilli(), produced: produced}
	for _, p := range parts {
		x.Pending += p.Pending
		x.Parked += p.Parked
		x.MaxAgeSeconds = max(x.MaxAgeSeconds, p.OldestPendingSeconds)
	}
	if n := len(b.history); n > 0 {
		prev := b.history[n-1]
		if dt := float64(x.At-prev.At) / 1000; dt > 0 {
			x.ProducedPerSecond = max(float64(x.produced-prev.produced)/dt, 0)
			x.ProcessedPerSecond = max(float64(x.produced-prev.produced-(x.Pending-prev.Pending))/dt, 0)
		}
	}
	b.history = append(b.history, x)
	cut := 0
	for cut < len(b.history) && now.Sub(time.UnixMilli(b.history[cut].At)) > historyWindow {
		cut++
	}
	b.history = b.history[cut:]
}

// History returns a copy of the samples of the last historyWindow, oldest
// first.
func (b *Backlog) History() []Sample {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.history)
}

// Snapshot returns the latest snapshot. Its Partitions slice is shared:
// do not modify it.
func (b *Backlog) Snapshot() BacklogSnapshot {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.snap
}

// BacklogStats are the refresher's own counters, for /metrics.
type BacklogStats struct {
	Refreshes, Failures int64
	LastDuration        time.Duration
	// Started is when Run began (zero before): a snapshot not yet taken
	// has been missing since then.
	Started time.Time
}

// Stats returns the refresher's counters.
func (b *Backlog) Stats() BacklogStats {
	b.mu.Lock()
	defer b.mu.Unlock()
	return BacklogStats{Refreshes: b.refreshes, Failures: b.failures, LastDuration: b.took, Started: b.started}
}

// queryBacklog runs sql, a backlogQuery's rows, in a read-only
// transaction of its own, planned under sqlBacklogPlan. The simple
// protocol keeps PostgreSQL from caching a generic plan: each run is
// planned for the table as it is.
func queryBacklog(ctx context.Context, pool *pgxpool.Pool, sql string) ([]PartitionStatus, error) {
	var out []PartitionStatus
	err := pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, sqlBacklogPlan, pgx.QueryExecModeSimpleProtocol); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, sql, pgx.QueryExecModeSimpleProtocol)
		if err != nil {
			return err
		}
		out, err = pgx.CollectRows(rows, scanBacklog)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("backlog: %w", err)
	}
	if len(out) == 0 {
		return nil, errors.New("backlog: ordo_leases has no rows")
	}
	return out, nil
}

func scanBacklog(r pgx.CollectableRow) (PartitionStatus, error) {
	var x PartitionStatus
	var n int64
	var first, lastSampled, last *int64
	var age *float64
	err := r.Scan(&x.Partition, &x.Owner, &x.Epoch, &x.Expires, &x.LeaseLive,
		&n, &first, &lastSampled, &last, &age, &x.Parked)
	if err != nil {
		return x, err
	}
	if first != nil && lastSampled != nil && last != nil {
		x.Pending, x.PendingEstimated = estimatePending(n, *first, *lastSampled, *last)
	} else {
		x.Pending = n
	}
	x.Pending += x.Parked
	if age != nil {
		x.OldestPendingSeconds = max(*age, 0)
	}
	return x, nil
}
