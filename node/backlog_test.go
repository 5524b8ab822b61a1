package node

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/lease"
)

// explain returns the plan of the backlog query, planned as
// queryBacklog plans it, on a backlog of 150,000 rows: with statistics of
// the empty table (ANALYZE before the rows came) when analyzed, else with
// none at all (never analyzed: a fresh table). Without sqlBacklogPlan the
// planner took bitmap heap scans here (it estimates from the table's
// pages: with 2-byte payloads it did not, with 100-byte ones from about
// 120,000 rows on). The rows are written without the outbox trigger, for
// speed.
func explain(t *testing.T, analyzed bool) string {
	t.Helper()
	pool := testkit.NewOutbox(t, 64, 2).Pool
	ctx := testkit.Context(t, 60*time.Second)
	if err := lease.Migrate(ctx, pool, 64); err != nil {
		t.Fatal(err)
	}
	stmts := []string{`ALTER TABLE outbox SET (autovacuum_enabled = false)`}
	if analyzed {
		stmts = append(stmts, `ANALYZE outbox`)
	}
	stmts = append(stmts, `SET session_replication_role = replica`,
		`INSERT INTO outbox (id, partition, correlation_id, key_seq, exchange, routing_key, type, payload, occurred_at)
		SELECT ('00000000-0000-7000-8000-' || lpad(to_hex(i), 12, '0'))::uuid, i % 64, 'k' || (i % 640), i / 640 + 1,
		       'x', 'r', 't', jsonb_build_object('pad', repeat('x', 100)), clock_timestamp()
		FROM generate_series(0, 149999) AS i`, `RESET session_replication_role`)
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for _, s := range stmts {
			if _, err := tx.Exec(ctx, s); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return planOf(t, pool, outboxBacklog.rows)
}

// planOf returns the plan of sql, planned as queryBacklog plans it.
func planOf(t *testing.T, pool *pgxpool.Pool, sql string) string {
	t.Helper()
	ctx := testkit.Context(t, 60*time.Second)
	var b strings.Builder
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, sqlBacklogPlan); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, "EXPLAIN "+sql)
		if err != nil {
			return err
		}
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		for _, l := range lines {
			b.WriteString(l + "\n")
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// TestBacklogPlan: the backlog query walks the ready-by-partition index
// of each partition in order (never outbox_pending_by_partition, which
// outbox.DropKeySeqTrigger may drop) and never scans the outbox nor sorts
// its rows, whether the table was analyzed empty or never analyzed
// (without statistics a looser query gets a bitmap heap scan and a sort
// of every pending row of each partition).
func TestBacklogPlan(t *testing.T) {
	testkit.RequirePostgres(t)
	for _, analyzed := range []bool{true, false} {
		t.Run(fmt.Sprintf("analyzed empty %v", analyzed), func(t *testing.T) {
			plan := explain(t, analyzed)
			for _, bad := range []string{"Seq Scan on outbox", "Bitmap Heap Scan on outbox", "Sort"} {
				if strings.Contains(plan, bad) {
					t.Errorf("%s in the backlog plan:\n%s", bad, plan)
				}
			}
			if !strings.Contains(plan, "outbox_ready_by_partition") || strings.Contains(plan, "outbox_pending_by_partition") {
				t.Errorf("the backlog plan does not walk outbox_ready_by_partition alone:\n%s", plan)
			}
		})
	}
}

func TestEstimatePending(t *testing.T) {
	for _, tc := range []struct {
		name                        string
		n, first, lastSampled, last int64
		want                        int64
		estimated                   bool
	}{
		{"all sampled", 10, 100, 190, 190, 10, false},
		{"dense beyond", BacklogSampleRows, 1, BacklogSampleRows, 2 * BacklogSampleRows, 2 * BacklogSampleRows, true},
		{"sparse beyond", BacklogSampleRows, 1, 4 * BacklogSampleRows, 8 * BacklogSampleRows, 2 * BacklogSampleRows, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, est := estimatePending(tc.n, tc.first, tc.lastSampled, tc.last)
			if got != tc.want || est != tc.estimated {
				t.Errorf("estimatePending = %d, %v; want %d, %v", got, est, tc.want, tc.estimated)
			}
		})
	}
}
