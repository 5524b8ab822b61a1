package node

import (
	"strings"
	"testing"
	"time"

	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/lease"
	"github.com/ordo-relay/ordo/outbox"
)

// explain returns the plan of q as text.
func explain(t *testing.T, q string) string {
	t.Helper()
	_, pool := testkit.NewTestDB(t, 2)
	ctx := testkit.Context(t, 60*time.Second)
	if err := outbox.Migrate(ctx, pool, 64); err != nil {
		t.Fatal(err)
	}
	if err := lease.Migrate(ctx, pool, 64); err != nil {
		t.Fatal(err)
	}
	// Statistics of an empty table, then a backlog: the case where plans
	// that depend on statistics go wrong.
	for _, s := range []string{`ANALYZE outbox`, `INSERT INTO outbox (id, partition, correlation_id, exchange, routing_key, type, payload)
		SELECT gen_random_uuid(), i % 64, 'k' || (i % 640), 'x', 'r', 't', '{}' FROM generate_series(1, 20000) AS i`} {
		if _, err := pool.Exec(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	rows, err := pool.Query(ctx, "EXPLAIN "+q)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var b strings.Builder
	for rows.Next() {
		var l string
		if err := rows.Scan(&l); err != nil {
			t.Fatal(err)
		}
		b.WriteString(l + "\n")
	}
	return b.String()
}

// TestBacklogPlan: the backlog query probes the pending-by-partition index
// per partition and never scans the outbox, on a table analyzed empty.
func TestBacklogPlan(t *testing.T) {
	testkit.RequirePostgres(t)
	plan := explain(t, sqlBacklog)
	if !strings.Contains(plan, "outbox_pending_by_partition") || strings.Contains(plan, "Seq Scan on outbox") {
		t.Errorf("backlog plan:\n%s", plan)
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
