package tablesource_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/partition"
	"github.com/ordo-relay/ordo/relay/tablesource"
)

// TestDryRunBesideTheOldRelay: the dry run reports the pending rows (all
// pages, keys, partitions, the oldest age, the bad rows, each sampled
// key's order) while the article's relay holds some of them with FOR
// UPDATE SKIP LOCKED, and it neither waits for that relay nor writes.
func TestDryRunBesideTheOldRelay(t *testing.T) {
	testkit.RequirePostgres(t)
	pool := articleDB(t)
	ctx := context.Background()
	base := time.Now().Add(-time.Minute).UTC().Truncate(time.Microsecond)
	id := func(n byte) uuid.UUID { return uuid.UUID{15: n} }
	insert(t, pool,
		msg{id: id(1), corr: ptr("order-1"), at: base},
		msg{id: id(2), corr: ptr("order-2"), at: base.Add(time.Second)},
		msg{id: id(3), corr: ptr("order-1"), at: base.Add(2 * time.Second)},
		msg{id: id(4), at: base.Add(3 * time.Second)},
		msg{id: id(5), corr: ptr("order-3"), at: base.Add(4 * time.Second), payload: `[]`},
		msg{id: id(6), corr: ptr("order-1"), at: base.Add(-time.Hour), processed: true},
	)

	// The article's relay: takes the oldest rows for its batch and holds
	// them while it publishes.
	old, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = old.Rollback(context.Background()) }()
	if _, err := old.Exec(ctx, `SELECT "Id" FROM "OutboxMessages" WHERE "ProcessedAt" IS NULL
		ORDER BY "OccurredAt" LIMIT 2 FOR UPDATE SKIP LOCKED`); err != nil {
		t.Fatalf("the old relay's batch: %v", err)
	}

	const partitions = 8
	r, err := tablesource.NewReader(tablesource.Article(), partitions)
	if err != nil {
		t.Fatal(err)
	}
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	rep, err := r.DryRun(dctx, pool, 2, 2) // pages of 2: three pages
	if err != nil {
		t.Fatalf("DryRun beside the old relay: %v", err)
	}
	if rep.Pending != 5 || rep.Keys != 4 || rep.KeysWithoutCorrelationID != 1 {
		t.Errorf("pending %d, keys %d, keyed by id %d; want 5, 4, 1", rep.Pending, rep.Keys, rep.KeysWithoutCorrelationID)
	}
	want := make([]int, partitions)
	for _, k := range []string{"order-1", "order-2", "order-1", id(4).String(), "order-3"} {
		want[partition.Of(k, partitions)]++
	}
	for p := range want {
		if rep.PerPartition[p] != want[p] {
			t.Errorf("partition %d: %d rows, want %d", p, rep.PerPartition[p], want[p])
		}
	}
	if !rep.OldestOccurredAt.Equal(base) || rep.OldestAge < time.Minute-time.Second || rep.OldestAge > 5*time.Minute {
		t.Errorf("oldest %v (age %v), want %v, about a minute old", rep.OldestOccurredAt, rep.OldestAge, base)
	}
	if len(rep.Bad) != 1 || rep.Bad[0].Row.ID != id(5) || !strings.Contains(rep.Bad[0].Reason, "not a JSON object") {
		t.Errorf("bad rows %+v, want row 5 (payload not an object)", rep.Bad)
	}
	if len(rep.Samples) != 2 || strings.Join(rep.Samples["order-1"], ",") != id(1).String()+","+id(3).String() ||
		strings.Join(rep.Samples["order-2"], ",") != id(2).String() {
		t.Errorf("samples %v, want order-1 [1 3] and order-2 [2]", rep.Samples)
	}

	// Nothing written: no row marked, and the transaction was read-only.
	var processed int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM "OutboxMessages" WHERE "ProcessedAt" IS NOT NULL`).Scan(&processed); err != nil {
		t.Fatal(err)
	}
	if processed != 1 {
		t.Errorf("%d rows processed after the dry run, want the 1 processed before", processed)
	}
	if _, err := r.DryRun(ctx, pool, 0, 1); err == nil {
		t.Error("DryRun(page 0): nil error")
	}
}
