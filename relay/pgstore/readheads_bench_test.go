package pgstore_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/outbox"
	"github.com/ordo-relay/ordo/relay"
	"github.com/ordo-relay/ordo/relay/pgstore"
)

// BenchmarkReadPending is the relay's read against the real PostgreSQL:
// one page of every partition from a 100,000-row backlog over 10,000 keys.
func BenchmarkReadPending(b *testing.B) {
	_, pool := testkit.NewDatabasePool(b, 4)
	ctx := testkit.Context(b, 5*time.Minute)
	if err := outbox.Migrate(ctx, pool, 64); err != nil {
		b.Fatal(err)
	}
	prod, _ := outbox.NewProducer(64)
	payload := json.RawMessage(fmt.Sprintf(`{"pad":%q}`, strings.Repeat("x", 280)))
	for batch := range 100 {
		msgs := make([]outbox.Message, 1000)
		for i := range msgs {
			msgs[i] = outbox.Message{CorrelationID: fmt.Sprintf("key-%d", (batch*1000+i)%10000),
				Exchange: "x", RoutingKey: "r", Type: "t", Payload: payload}
		}
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { _, err := prod.Enqueue(ctx, tx, msgs...); return err }); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := pool.Exec(ctx, "ANALYZE outbox"); err != nil {
		b.Fatal(err)
	}
	store := pgstore.New(pool, "bench", nil)
	cursors := make([]relay.Cursor, 64)
	for i := range cursors {
		cursors[i] = relay.Cursor{Partition: i}
	}
	b.ResetTimer()
	for b.Loop() {
		// 64 partitions × 16 rows: one read of a relay holding them all.
		rows, err := store.ReadPending(ctx, cursors, 16)
		if err != nil || len(rows) != 1024 {
			b.Fatalf("%d rows, %v", len(rows), err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/1024, "µs/row")
}
