package outbox_test

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/outbox"
)

// BenchmarkEnqueueTrigger measures what the key-partition check of
// migration 0007 adds to a producer's insert: the same Enqueue load with
// the key_seq trigger of migration 0006 (no check) and of 0007, each on a
// fresh database. Each op is one transaction of 1 or 100 messages over
// 1,000 keys that already have counter rows (the common case: the counter
// is updated, not inserted), committed without waiting for the WAL flush
// so that the insert's own cost is what is timed. Compare rows/s:
//
//	go test -run - -bench EnqueueTrigger -count 5 ./outbox
func BenchmarkEnqueueTrigger(b *testing.B) {
	for _, batch := range []int{1, 100} {
		for _, migration := range []string{"0006_insert_retry.sql", "0007_key_partition.sql"} {
			b.Run(fmt.Sprintf("batch=%d/trigger=%s", batch, migration[:4]), func(b *testing.B) {
				benchEnqueue(b, migration, batch)
			})
		}
	}
}

func benchEnqueue(b *testing.B, migration string, batch int) {
	_, pool := testkit.NewDatabasePool(b, 2)
	ctx := testkit.Context(b, 10*time.Minute)
	if err := outbox.Migrate(ctx, pool, 64); err != nil {
		b.Fatal(err)
	}
	sql, err := os.ReadFile("migrations/" + migration)
	if err != nil {
		b.Fatal(err)
	}
	// Only the trigger function (0007 also adds and backfills a column).
	fn := string(sql)[strings.Index(string(sql), "CREATE OR REPLACE FUNCTION"):]
	if _, err := pool.Exec(ctx, fn); err != nil {
		b.Fatal(err)
	}
	prod, _ := outbox.NewProducer(64)
	enqueue := func(msgs []outbox.Message) {
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			// Without the WAL flush the insert's own cost is what is timed.
			if _, err := tx.Exec(ctx, "SET LOCAL synchronous_commit = off"); err != nil {
				return err
			}
			_, err := prod.Enqueue(ctx, tx, msgs...)
			return err
		}); err != nil {
			b.Fatal(err)
		}
	}
	const keys = 1000
	warm := make([]outbox.Message, keys)
	for i := range warm {
		warm[i] = msg(fmt.Sprintf("bench-key-%d", i))
	}
	enqueue(warm)
	msgs := make([]outbox.Message, batch)
	n := 0
	for b.Loop() {
		for i := range msgs {
			msgs[i] = msg(fmt.Sprintf("bench-key-%d", n%keys))
			n++
		}
		enqueue(msgs)
	}
	b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "rows/s")
}
