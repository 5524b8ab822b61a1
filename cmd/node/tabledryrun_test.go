package main

import (
	"bytes"
	"encoding/json"
	"io"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/node"
	"github.com/ordo-relay/ordo/relay/tablesource"
)

// TestTableDryRun: `node -table-layout article -table-dry-run` prints
// the article's table's pending rows, keys and bad rows as JSON and
// exits, having created, published and marked nothing.
func TestTableDryRun(t *testing.T) {
	t.Parallel()
	dbURL, pool := testkit.NewDatabasePool(t, 2)
	ctx := testkit.Context(t, 30*time.Second)
	if _, err := pool.Exec(ctx, tablesource.ArticleDDL); err != nil {
		t.Fatal(err)
	}
	for i, payload := range []string{`{"a": 1}`, `{"a": 2}`, `{"a": 3}`, `[1]`} {
		if _, err := pool.Exec(ctx, `INSERT INTO "OutboxMessages" ("Id", "Type", "RoutingKey", "Payload", "CorrelationId", "OccurredAt")
			VALUES ($1, 'OrderPlaced', 'order.placed', $2, $3, now())`, uuid.Must(uuid.NewV7()), payload, []string{"a", "b", "a", "c"}[i]); err != nil {
			t.Fatal(err)
		}
	}
	var out bytes.Buffer
	err := cli{lookup: env(), stdout: &out, stderr: io.Discard}.run(ctx,
		[]string{"-postgres-url", dbURL, "-table-layout", "article", "-table-dry-run", "-partitions", "8"})
	if err != nil {
		t.Fatal(err)
	}
	var got node.SourceDryRun
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatalf("%v: %s", err, out.String())
	}
	if got.Source != "default" || got.Pending != 4 || got.Keys != 3 || len(got.Bad) != 1 || len(got.PerPartition) != 8 || len(got.Samples["a"]) != 2 {
		t.Fatalf("report: %s", out.String())
	}
	var created bool
	var processed int
	if err := pool.QueryRow(ctx, `SELECT to_regclass('ordo_table_rows') IS NOT NULL OR to_regclass('ordo_leases') IS NOT NULL,
		(SELECT count(*) FROM "OutboxMessages" WHERE "ProcessedAt" IS NOT NULL)`).Scan(&created, &processed); err != nil {
		t.Fatal(err)
	}
	if created || processed != 0 {
		t.Fatalf("the dry run created Ordo's tables (%v) or marked %d row(s)", created, processed)
	}
	err = cli{lookup: env(), stdout: io.Discard, stderr: io.Discard}.run(ctx, []string{"-postgres-url", dbURL, "-table-dry-run"})
	if err == nil {
		t.Fatal("a dry run without -table-layout succeeded")
	}
}
