package node_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/ordo-relay/ordo/internal/nodehook"
	"github.com/ordo-relay/ordo/internal/nodetest"
	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/node"
	"github.com/ordo-relay/ordo/relay/tablesource"
)

// BenchmarkAdoptedTableDrain: one node with -table-layout article drains
// 20,000 rows over 1,000 keys of the article's table, written before it
// starts (~250-byte payloads, one INSERT), until every row's
// "ProcessedAt" is set; it reports rows a second (msg/s), the whole drain
// included: the intake, numbering, publishing and marking.
func BenchmarkAdoptedTableDrain(b *testing.B) {
	testkit.RequireRabbitMQ(b)
	const rows, keys, partitions = 20000, 1000, 64
	for range b.N {
		b.StopTimer()
		dbURL, pool := testkit.NewTestDB(b, 8)
		ctx := testkit.Context(b, 3*time.Minute)
		if _, err := pool.Exec(ctx, tablesource.ArticleDDL); err != nil {
			b.Fatal(err)
		}
		if _, err := pool.Exec(ctx, `INSERT INTO "OutboxMessages" ("Id", "Type", "RoutingKey", "Payload", "CorrelationId", "OccurredAt")
			SELECT gen_random_uuid(), 'OrderPlaced', 'order.placed', jsonb_build_object('n', i, 'pad', repeat('x', 220)),
			       'order-' || (i % $2), now() - interval '1 hour' + i * interval '1 ms'
			FROM generate_series(1, $1::int) AS i`, rows, keys); err != nil {
			b.Fatal(err)
		}
		ex := testkit.NewExchange(b)
		testkit.NewChecker(b, testkit.AMQPURL(), ex) // a bound queue: unroutable messages fail
		cfg := node.DefaultConfig()
		cfg.PostgresURL, cfg.AMQP.URL, cfg.NodeName = dbURL, testkit.AMQPURL(), "drain"
		cfg.HTTPAddr, cfg.Partitions = "127.0.0.1:0", partitions
		cfg.TableLayout, cfg.TableExchange = "article", ex
		b.StartTimer()
		began := time.Now()
		_, stop := nodetest.Run(b, cfg, node.Options{Logger: testkit.Logger(b, slog.LevelWarn)}, nodehook.Hooks{})
		testkit.WaitFor(b, 2*time.Minute, "the drain", func() bool {
			var pending int
			err := pool.QueryRow(context.Background(), `SELECT count(*) FROM "OutboxMessages" WHERE "ProcessedAt" IS NULL`).Scan(&pending)
			return err == nil && pending == 0
		})
		took := time.Since(began)
		b.StopTimer()
		stop()
		b.ReportMetric(rows/took.Seconds(), "msg/s")
	}
}
