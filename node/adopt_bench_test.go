package node_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ordo-relay/ordo/internal/nodehook"
	"github.com/ordo-relay/ordo/internal/nodetest"
	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/node"
	"github.com/ordo-relay/ordo/relay/tablesource"
)

// The adopted-table drain, side by side with the article's own relay on
// the same table: 20,000 rows over 1,000 keys (~250-byte payloads, one
// INSERT), written before the relay starts, drained until every row's
// "ProcessedAt" is set. Each reports rows a second (msg/s), the whole
// drain included, and reorders: deliveries that reached a queue bound to
// the exchange after a later row of their key (the rows of a key carry n
// in "OccurredAt" order).
const adoptRows = 20000

// The two layouts of the rows: spread, key i % 1,000 (a key's rows 1,000
// apart), and runs, key i / 20 (a key's 20 rows one after another, as an
// aggregate's events of a burst): two article relays split the runs
// between their batches.
var adoptLayouts = []struct{ name, key string }{
	{"spread", "'order-' || (i % 1000)"},
	{"runs", "'order-' || (i / 20)"},
}

// BenchmarkAdoptedTableDrain: one node with -table-layout article (the
// intake, numbering, publishing and marking).
func BenchmarkAdoptedTableDrain(b *testing.B) {
	testkit.RequireRabbitMQ(b)
	for _, l := range adoptLayouts {
		b.Run(l.name, func(b *testing.B) { adoptedDrain(b, l.key) })
	}
}

func adoptedDrain(b *testing.B, key string) {
	for range b.N {
		b.StopTimer()
		dbURL, pool, ex, order := articleTable(b, key)
		cfg := node.DefaultConfig()
		cfg.PostgresURL, cfg.AMQP.URL, cfg.NodeName = dbURL, testkit.AMQPURL(), "drain"
		cfg.HTTPAddr, cfg.Partitions = "127.0.0.1:0", 64
		cfg.TableLayout, cfg.TableExchange = "article", ex
		b.StartTimer()
		began := time.Now()
		_, stop := nodetest.Run(b, cfg, node.Options{Logger: testkit.Logger(b, slog.LevelWarn)}, nodehook.Hooks{})
		took := waitProcessed(b, pool, began)
		b.StopTimer()
		stop()
		reportDrain(b, began, took, order)
	}
}

// BenchmarkArticleRelayDrain: the article's relay, 1 and 2 instances, as
// its BackgroundService runs it: the oldest 50 pending rows FOR UPDATE
// SKIP LOCKED, each published (persistent, mandatory) and confirmed in
// turn, "ProcessedAt" set, commit; again at once while batches come back
// full, else after a second (the bench's classic relay, docs/bench.md,
// over the article's table).
func BenchmarkArticleRelayDrain(b *testing.B) {
	testkit.RequireRabbitMQ(b)
	for _, l := range adoptLayouts {
		for _, n := range []int{1, 2} {
			b.Run(fmt.Sprintf("%s/instances=%d", l.name, n), func(b *testing.B) { articleDrain(b, l.key, n) })
		}
	}
}

func articleDrain(b *testing.B, key string, n int) {
	for range b.N {
		b.StopTimer()
		dbURL, pool, ex, order := articleTable(b, key)
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		errs := make(chan error, n)
		b.StartTimer()
		began := time.Now()
		for range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := articleRelay(ctx, dbURL, ex); err != nil && ctx.Err() == nil {
					errs <- err
				}
			}()
		}
		took := waitProcessed(b, pool, began)
		b.StopTimer()
		cancel()
		wg.Wait()
		close(errs)
		for err := range errs {
			b.Fatal(err)
		}
		reportDrain(b, began, took, order)
	}
}

// articleTable creates a database with the article's table and its
// adoptRows rows, an exchange, and a queue bound to it whose deliveries
// order counts. key is the rows' "CorrelationId", an SQL expression of i;
// "" writes no rows.
func articleTable(b *testing.B, key string) (string, *pgxpool.Pool, string, *keyOrder) {
	dbURL, pool := testkit.NewDatabasePool(b, 8)
	ctx := testkit.Context(b, 3*time.Minute)
	if _, err := pool.Exec(ctx, tablesource.ArticleDDL); err != nil {
		b.Fatal(err)
	}
	if key == "" {
		ex := testkit.NewExchange(b)
		return dbURL, pool, ex, watchOrder(b, ex)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO "OutboxMessages" ("Id", "Type", "RoutingKey", "Payload", "CorrelationId", "OccurredAt")
		SELECT gen_random_uuid(), 'OrderPlaced', 'order.placed', jsonb_build_object('n', i, 'pad', repeat('x', 220)),
		       `+key+`, now() - interval '1 hour' + i * interval '1 ms'
		FROM generate_series(1, $1::int) AS i`, adoptRows); err != nil {
		b.Fatal(err)
	}
	ex := testkit.NewExchange(b)
	return dbURL, pool, ex, watchOrder(b, ex)
}

// waitProcessed waits until every row's "ProcessedAt" is set and returns
// the time since began.
func waitProcessed(b *testing.B, pool *pgxpool.Pool, began time.Time) time.Duration {
	testkit.WaitFor(b, 3*time.Minute, "the drain", func() bool {
		var pending int
		err := pool.QueryRow(context.Background(), `SELECT count(*) FROM "OutboxMessages" WHERE "ProcessedAt" IS NULL`).Scan(&pending)
		return err == nil && pending == 0
	})
	return time.Since(began)
}

func reportDrain(b *testing.B, began time.Time, took time.Duration, order *keyOrder) {
	got, reorders := order.wait(b, adoptRows)
	order.mu.Lock()
	var first, last time.Time
	for _, at := range order.recv {
		if first.IsZero() || at.Before(first) {
			first = at
		}
		if at.After(last) {
			last = at
		}
	}
	order.mu.Unlock()
	b.ReportMetric(adoptRows/took.Seconds(), "msg/s")
	b.ReportMetric(adoptRows/last.Sub(first).Seconds(), "msg/s-deliveries")
	b.ReportMetric(first.Sub(began).Seconds(), "s-to-first")
	b.ReportMetric(float64(reorders), "reorders")
	b.Logf("%d rows in %v (first delivery after %v, deliveries over %v), %d delivered, %d out of their key's order",
		adoptRows, took, first.Sub(began), last.Sub(first), got, reorders)
}

// keyOrder counts the deliveries of a queue and those that came after a
// later row of their key.
type keyOrder struct {
	mu       sync.Mutex
	last     map[string]int64
	recv     map[string]time.Time // message id -> first delivery
	got      int
	reorders int
}

func watchOrder(b *testing.B, ex string) *keyOrder {
	conn, err := amqp.Dial(testkit.AMQPURL())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		b.Fatal(err)
	}
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		b.Fatal(err)
	}
	if err := ch.QueueBind(q.Name, "#", ex, false, nil); err != nil {
		b.Fatal(err)
	}
	ds, err := ch.Consume(q.Name, "", true, true, false, false, nil)
	if err != nil {
		b.Fatal(err)
	}
	o := &keyOrder{last: map[string]int64{}, recv: map[string]time.Time{}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for d := range ds {
			var p struct{ N int64 }
			_ = json.Unmarshal(d.Body, &p)
			o.mu.Lock()
			if _, ok := o.recv[d.MessageId]; !ok {
				o.recv[d.MessageId] = time.Now()
			}
			o.got++
			if p.N < o.last[d.CorrelationId] {
				o.reorders++
			}
			o.last[d.CorrelationId] = max(o.last[d.CorrelationId], p.N)
			o.mu.Unlock()
		}
	}()
	b.Cleanup(func() {
		_ = conn.Close()
		<-done
	})
	return o
}

// wait waits until n deliveries arrived and returns them and the
// reorders.
func (o *keyOrder) wait(b *testing.B, n int) (got, reorders int) {
	testkit.WaitFor(b, time.Minute, "every delivery", func() bool {
		o.mu.Lock()
		defer o.mu.Unlock()
		return o.got >= n
	})
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.got, o.reorders
}

// articleRelay is one instance of the article's relay, until ctx ends.
func articleRelay(ctx context.Context, dbURL, ex string) error {
	db, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return err
	}
	defer db.Close(context.Background())
	conn, err := amqp.Dial(testkit.AMQPURL())
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	if err := ch.Confirm(false); err != nil {
		return err
	}
	returned := ch.NotifyReturn(make(chan amqp.Return, 1))
	const batch = 50
	for {
		n, err := articleBatch(ctx, db, ch, returned, ex, batch)
		if err != nil {
			return err
		}
		if n == batch {
			continue
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(time.Second):
		}
	}
}

// articleBatch publishes and marks one batch, and returns its size.
func articleBatch(ctx context.Context, db *pgx.Conn, ch *amqp.Channel, returned <-chan amqp.Return, ex string, batch int) (int, error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback(context.Background())
	rows, err := tx.Query(ctx, `SELECT "Id", "Type", "RoutingKey", "Payload", "CorrelationId" FROM "OutboxMessages"
		WHERE "ProcessedAt" IS NULL ORDER BY "OccurredAt" LIMIT $1 FOR UPDATE SKIP LOCKED`, batch)
	if err != nil {
		return 0, err
	}
	type row struct {
		id             uuid.UUID
		typ, key, corr string
		payload        []byte
	}
	got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (row, error) {
		var x row
		var corr *string
		err := r.Scan(&x.id, &x.typ, &x.key, &x.payload, &corr)
		if corr != nil {
			x.corr = *corr
		}
		return x, err
	})
	if err != nil {
		return 0, err
	}
	ids := make([]uuid.UUID, len(got))
	for i, x := range got {
		c, err := ch.PublishWithDeferredConfirmWithContext(ctx, ex, x.key, true, false, amqp.Publishing{
			MessageId: x.id.String(), CorrelationId: x.corr, Type: x.typ, ContentType: "application/json",
			DeliveryMode: amqp.Persistent, Body: x.payload,
		})
		if err != nil {
			return 0, err
		}
		if ok, err := c.WaitContext(ctx); err != nil || !ok {
			return 0, errors.Join(errors.New("not confirmed"), err)
		}
		select {
		case r := <-returned:
			return 0, fmt.Errorf("returned: %s", r.ReplyText)
		default:
		}
		ids[i] = x.id
	}
	if _, err := tx.Exec(ctx, `UPDATE "OutboxMessages" SET "ProcessedAt" = now() WHERE "Id" = ANY($1)`, ids); err != nil {
		return 0, err
	}
	return len(got), tx.Commit(ctx)
}

// The commit-to-delivery latency of a steady producer on the article's
// table: each of adoptLatencyRates rows a second over 1,000 keys for
// adoptLatencyFor, each INSERT its own transaction (as the article's
// endpoint commits one), relayed by one node with -table-layout article
// at its defaults, or by one instance of the article's relay. Each
// reports p50, p99 and max from the INSERT's return to the delivery at a
// queue bound to the exchange. 10 rows a second is a quiet table: the
// relay idles between rows.
var adoptLatencyRates = []int{200, 10}

const adoptLatencyFor = 10 * time.Second

// BenchmarkAdoptedTableLatency: one node relaying the article's table.
func BenchmarkAdoptedTableLatency(b *testing.B) {
	testkit.RequireRabbitMQ(b)
	for _, rate := range adoptLatencyRates {
		b.Run(fmt.Sprintf("rate=%d", rate), func(b *testing.B) {
			for range b.N {
				b.StopTimer()
				dbURL, pool, ex, order := articleTable(b, "")
				cfg := node.DefaultConfig()
				cfg.PostgresURL, cfg.AMQP.URL, cfg.NodeName = dbURL, testkit.AMQPURL(), "latency"
				cfg.HTTPAddr, cfg.Partitions = "127.0.0.1:0", 64
				cfg.TableLayout, cfg.TableExchange = "article", ex
				_, stop := nodetest.Run(b, cfg, node.Options{Logger: testkit.Logger(b, slog.LevelWarn)}, nodehook.Hooks{})
				b.StartTimer()
				commits := produceSteadily(b, pool, rate)
				b.StopTimer()
				reportLatency(b, commits, order, rate)
				stop()
			}
		})
	}
}

// BenchmarkArticleRelayLatency: one instance of the article's relay on
// the same table (articleRelay: a batch at once while they come back
// full, else after a second).
func BenchmarkArticleRelayLatency(b *testing.B) {
	testkit.RequireRabbitMQ(b)
	for _, rate := range adoptLatencyRates {
		b.Run(fmt.Sprintf("rate=%d", rate), func(b *testing.B) {
			for range b.N {
				b.StopTimer()
				dbURL, pool, ex, order := articleTable(b, "")
				ctx, cancel := context.WithCancel(context.Background())
				errc := make(chan error, 1)
				go func() { errc <- articleRelay(ctx, dbURL, ex) }()
				b.StartTimer()
				commits := produceSteadily(b, pool, rate)
				b.StopTimer()
				reportLatency(b, commits, order, rate)
				cancel()
				if err := <-errc; err != nil && !errors.Is(err, context.Canceled) {
					b.Fatal(err)
				}
			}
		})
	}
}

// produceSteadily inserts rate rows a second into the article's table
// for adoptLatencyFor, one transaction each, and returns when each
// INSERT returned, by message id.
func produceSteadily(b *testing.B, pool *pgxpool.Pool, rate int) map[string]time.Time {
	ctx := testkit.Context(b, time.Minute)
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	commits := map[string]time.Time{}
	end := time.Now().Add(adoptLatencyFor)
	for i := 0; time.Now().Before(end); i++ {
		<-tick.C
		id := uuid.Must(uuid.NewV7())
		if _, err := pool.Exec(ctx, `INSERT INTO "OutboxMessages" ("Id", "Type", "RoutingKey", "Payload", "CorrelationId", "OccurredAt")
			VALUES ($1, 'OrderPlaced', 'order.placed', jsonb_build_object('n', $2::int, 'pad', repeat('x', 220)), $3, now())`,
			id, i, fmt.Sprintf("order-%d", i%1000)); err != nil {
			b.Fatal(err)
		}
		commits[id.String()] = time.Now()
	}
	return commits
}

// reportLatency waits for every row of commits to arrive and reports the
// commit-to-delivery latency's p50, p99 and max, and the reorders.
func reportLatency(b *testing.B, commits map[string]time.Time, order *keyOrder, rate int) {
	_, reorders := order.wait(b, len(commits))
	first := time.Time{}
	for _, at := range commits {
		if first.IsZero() || at.Before(first) {
			first = at
		}
	}
	order.mu.Lock()
	// lat: every row's; steady: those committed a second or more after
	// the first, when the relay is no longer waking from idle.
	lat := make([]time.Duration, 0, len(commits))
	var steady []time.Duration
	for id, at := range commits {
		if got, ok := order.recv[id]; ok {
			lat = append(lat, got.Sub(at))
			if at.Sub(first) >= time.Second {
				steady = append(steady, got.Sub(at))
			}
		}
	}
	order.mu.Unlock()
	if len(lat) != len(commits) {
		b.Fatalf("%d of %d rows delivered", len(lat), len(commits))
	}
	slices.Sort(lat)
	slices.Sort(steady)
	pct := func(lat []time.Duration, q float64) float64 {
		if len(lat) == 0 {
			return 0
		}
		return float64(lat[int(q*float64(len(lat)-1))]) / float64(time.Millisecond)
	}
	b.ReportMetric(pct(lat, 0.5), "p50-ms")
	b.ReportMetric(pct(lat, 0.99), "p99-ms")
	b.ReportMetric(pct(lat, 1), "max-ms")
	b.ReportMetric(pct(steady, 0.99), "steady-p99-ms")
	b.ReportMetric(float64(reorders), "reorders")
	b.Logf("%d rows at %d/s: p50 %.1f ms, p99 %.1f ms, max %.1f ms; after the first second p99 %.1f ms, max %.1f ms",
		len(lat), rate, pct(lat, 0.5), pct(lat, 0.99), pct(lat, 1), pct(steady, 0.99), pct(steady, 1))
}
