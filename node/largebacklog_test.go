package node_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/node"
	"github.com/ordo-relay/ordo/partition"
)

// largeBacklog is a backlog on which a backlog query planned as a
// bitmap heap scan of every pending row of each partition (as PostgreSQL
// chooses on a table without statistics) ran past its 2 s timeout on every refresh
// while a node drained it, with a margin: alone on the table it took
// 2.0-3.2 s at 250,000 rows (4.2-5.5 s at 400,000, 1.6-1.8 s at 150,000).
// This test failed with it at 150,000 rows too, and passed at 100,000.
const largeBacklog = 250_000

// loadBacklog inserts rows pending rows of keys keys (rows/keys each, in
// key_seq order) into the outbox in one statement, as fast as the server
// can: with session_replication_role = replica the per-row trigger does
// not run, so the statement supplies key_seq, occurred_at and sequential
// ids itself (the key counters of outbox_keys are not written: nothing
// here produces more rows of these keys).
func loadBacklog(ctx context.Context, tb testing.TB, pool *pgxpool.Pool, partitions, rows, keys int, exchange string) {
	tb.Helper()
	names := make([]string, keys)
	parts := make([]int32, keys)
	for i := range names {
		names[i] = fmt.Sprintf("bulk-%06d", i)
		parts[i] = int32(partition.Of(names[i], partitions))
	}
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL session_replication_role = replica`); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `
			INSERT INTO outbox (id, partition, correlation_id, key_seq, exchange, routing_key, type, payload, occurred_at)
			SELECT ('00000000-0000-7000-8000-' || lpad(to_hex(row_number() OVER (ORDER BY s.n, k.key)), 12, '0'))::uuid,
			       k.p, k.key, s.n, $4, 'bulk', 't', '{}', clock_timestamp()
			FROM generate_series(1, $1::int) AS s(n) CROSS JOIN unnest($2::text[], $3::int[]) AS k(key, p)
			ORDER BY s.n, k.key`, rows/keys, names, parts, exchange)
		return err
	})
	if err != nil {
		tb.Fatalf("load %d rows: %v", rows, err)
	}
}

// scrapeMetrics reads a node's /metrics.
func scrapeMetrics(t *testing.T, addr string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	return fams
}

// metricSum sums a family's samples (-1 when it is absent) and counts them.
func metricSum(fams map[string]*dto.MetricFamily, name string) (sum float64, samples int) {
	f, ok := fams[name]
	if !ok {
		return -1, 0
	}
	for _, m := range f.GetMetric() {
		switch {
		case m.Counter != nil:
			sum += m.Counter.GetValue()
		case m.Gauge != nil:
			sum += m.Gauge.GetValue()
		}
	}
	return sum, len(f.GetMetric())
}

// TestBacklogMetricsDuringLargeDrain: while a node
// drains a large backlog from a table without statistics, /metrics keeps
// every partition's pending count and oldest age, fresh, and says the
// backlog is available. The backlog query used to be cancelled at its
// 2 s timeout on every refresh, for the whole drain: no pending count, no
// age, and the alerts on them could not fire.
func TestBacklogMetricsDuringLargeDrain(t *testing.T) {
	testkit.RequireRabbitMQ(t)
	const partitions = 64
	ob := testkit.NewOutbox(t, partitions, 2)
	dbURL, pool := ob.URL, ob.Pool
	ctx := testkit.Context(t, 2*time.Minute)
	// No statistics, whatever the server's autovacuum settings.
	if _, err := pool.Exec(ctx, `ALTER TABLE outbox SET (autovacuum_enabled = false)`); err != nil {
		t.Fatal(err)
	}
	ex := testkit.NewExchange(t)
	checker := testkit.NewChecker(t, testkit.AMQPURL(), ex)
	began := time.Now()
	loadBacklog(ctx, t, pool, partitions, largeBacklog, largeBacklog/10, ex)
	t.Logf("loaded %d rows in %v", largeBacklog, time.Since(began).Round(time.Millisecond))

	addr := startNode(t, dbURL, partitions, func(c *node.Config) { c.BacklogInterval = 500 * time.Millisecond })
	began = time.Now()
	deadline := began.Add(20 * time.Second)
	var good int // scrapes in a row with a fresh, complete backlog during the drain
	for good < 3 {
		fams := scrapeMetrics(t, addr)
		avail, _ := metricSum(fams, "ordo_backlog_available")
		pending, parts := metricSum(fams, "ordo_partition_pending")
		_, ages := metricSum(fams, "ordo_partition_oldest_pending_age_seconds")
		age, _ := metricSum(fams, "ordo_backlog_snapshot_age_seconds")
		marked, _ := metricSum(fams, "ordo_messages_marked_total")
		refreshes, _ := metricSum(fams, "ordo_backlog_refreshes_total")
		failures, _ := metricSum(fams, "ordo_backlog_refresh_failures_total")
		took, _ := metricSum(fams, "ordo_backlog_refresh_duration_seconds")
		switch {
		case avail == 1 && parts == partitions && ages == partitions && age >= 0 && age < 2 &&
			pending > largeBacklog/2 && marked > 0:
			good++
			t.Logf("after %v: %d marked, %.0f pending (estimated), snapshot %.2fs old, last refresh %.3fs, %v refreshes, %v failed",
				time.Since(began).Round(time.Millisecond), int(marked), pending, age, took, refreshes, failures)
		case time.Now().After(deadline):
			t.Fatalf("after %v of draining: backlog available %v, pending exported for %d partitions (sum %.0f), oldest age for %d, "+
				"snapshot age %v; %v refreshes, %v failed; %v marked",
				time.Since(began).Round(time.Millisecond), avail, parts, pending, ages, age, refreshes, failures, marked)
		default:
			good = 0
		}
		time.Sleep(500 * time.Millisecond) // one backlog refresh between scrapes
	}
	if rep := checker.Report(); rep.Reorders != 0 {
		t.Fatalf("checker: %v", rep)
	}
}
