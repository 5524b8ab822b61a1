package consume

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"time"

	"github.com/ordo-relay/ordo/bench/internal/measure"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ordo-relay/ordo/bench/internal/harness"
	"github.com/ordo-relay/ordo/bench/internal/result"
	"github.com/ordo-relay/ordo/inbox"
	"github.com/ordo-relay/ordo/internal/testkit"
)

// consumeFlags are the consume scenario's knobs, its -consume-* flags
// (each also read from ORDO_BENCH_CONSUME_*, as before they were flags).
type consumeFlags struct {
	Instances []int         // instance counts, one run each (ORDO_BENCH_CONSUME_INSTANCES, default 1,2,3)
	Orders    int           // orders in the drained backlog, two messages each (ORDO_BENCH_CONSUME_ORDERS, default 1000)
	Rate      int           // orders per second of the latency phase (ORDO_BENCH_CONSUME_RATE, default 50)
	Latency   time.Duration // length of the latency phase (ORDO_BENCH_CONSUME_LATENCY, default 5s)
	Delay     time.Duration // simulated handler work per message (ORDO_BENCH_CONSUME_DELAY, default 20ms)
	Conns     int           // PostgreSQL connections per instance: its handler concurrency (ORDO_BENCH_CONSUME_CONNS, default 16)
	Lanes     int           // inbox.Config.Lanes: keys handled at once per shard (ORDO_BENCH_CONSUME_LANES, default inbox's)
	Batch     int           // inbox.Config.BatchSize: deliveries per transaction, 1 for none shared (ORDO_BENCH_CONSUME_BATCH, default inbox's)
	BatchTime time.Duration // inbox.Config.BatchTime (ORDO_BENCH_CONSUME_BATCH_TIME, default inbox's)
	Shards    int           // S (ORDO_BENCH_CONSUME_SHARDS, default 12)
	Queued    bool          // the handler queues its insert (inbox.NewQueued) instead of running it (ORDO_BENCH_CONSUME_QUEUED)
}

// Options are the consume scenario's: -workers and its -consume-*
// flags.
type Options struct {
	measure.Common
	Workers int          // producer goroutines, one connection each
	Consume consumeFlags // its -consume-* flags
}

func DefaultOptions() Options {
	return Options{Workers: 16, Consume: defaultConsumeFlags()}
}

func (o *Options) AddFlags(fs *flag.FlagSet) {
	measure.WorkersVar(fs, &o.Workers)
	addConsumeFlags(fs, &o.Consume)
}

func (o Options) Validate() error {
	return errors.Join(measure.CheckWorkers(o.Workers), o.Consume.Validate())
}

// defaultConsumeFlags returns the consume scenario's defaults.
func defaultConsumeFlags() consumeFlags {
	return consumeFlags{Instances: []int{1, 2, 3}, Orders: 1000, Rate: 50, Latency: 5 * time.Second,
		Delay: 20 * time.Millisecond, Conns: 16, Lanes: inbox.DefaultConfig("").Lanes,
		Batch: inbox.DefaultConfig("").BatchSize, BatchTime: inbox.DefaultConfig("").BatchTime, Shards: 12}
}

// addConsumeFlags registers the consume scenario's -consume-* flags on fs,
// with c's values as their defaults.
func addConsumeFlags(fs *flag.FlagSet, c *consumeFlags) {
	measure.CountsVar(fs, "consume-instances", &c.Instances, "comma-separated inbox consumer instance counts, one run each")
	fs.IntVar(&c.Orders, "consume-orders", c.Orders, "orders in the drained backlog, two messages each")
	fs.IntVar(&c.Rate, "consume-rate", c.Rate, "orders per second of the latency phase")
	fs.DurationVar(&c.Latency, "consume-latency", c.Latency, "length of the latency phase")
	fs.DurationVar(&c.Delay, "consume-delay", c.Delay, "simulated handler work per message")
	fs.IntVar(&c.Conns, "consume-conns", c.Conns, "PostgreSQL connections per instance: its handler concurrency")
	fs.IntVar(&c.Lanes, "consume-lanes", c.Lanes, "inbox.Config.Lanes: keys handled at once per shard")
	fs.IntVar(&c.Batch, "consume-batch", c.Batch, "inbox.Config.BatchSize: deliveries handled in one transaction (group commit); 1: a transaction each")
	fs.DurationVar(&c.BatchTime, "consume-batch-time", c.BatchTime, "inbox.Config.BatchTime: how long a batch's transaction takes in more messages")
	fs.IntVar(&c.Shards, "consume-shards", c.Shards, "inbox shards S")
	fs.BoolVar(&c.Queued, "consume-queued", c.Queued, "the handler queues its insert, sent with the inbox's advance (inbox.NewQueued), instead of running it")
}

func (c consumeFlags) Validate() error {
	if c.Orders < 1 || c.Rate < 1 || c.Latency <= 0 || c.Delay < 0 || c.Conns < 2 || c.Shards < 1 || c.Lanes < 1 || c.Batch < 1 || c.BatchTime <= 0 {
		return fmt.Errorf("consume options out of range: %+v", c)
	}
	return nil
}

// Run measures end-to-end ordered handling through the inbox: a
// producer commits orders (OrderPlaced, then OrderCancelled in a second
// transaction), one Ordo node relays them, and N inbox consumer instances
// (in this process, each with its own pool of Conns connections) handle
// them with a handler that sleeps Delay (a downstream call) and inserts a
// row, in the inbox's transaction. For each instance count it reports the
// rate at which a backlog of Orders orders is handled, and the latency from
// the producer's commit to the handler's insert (just before its commit)
// at Rate orders a second. Then it runs the same backlog through plain
// competing consumers on one queue and counts the orders they handled out
// of order.
func Run(ctx context.Context, o Options, emit func(*result.Result)) error {
	co := o.Consume
	for _, n := range co.Instances {
		res, err := consumeOnce(ctx, o, co, n)
		if err != nil {
			return fmt.Errorf("%d instances: %w", n, err)
		}
		emit(res)
	}
	res, err := competingOnce(ctx, o, co, co.Instances[len(co.Instances)-1])
	if err != nil {
		return fmt.Errorf("competing consumers: %w", err)
	}
	emit(res)
	return nil
}

// consumeRig is a rig plus the consume scenario's durable exchange and
// handled table.
type consumeRig struct {
	*harness.Rig
	o        Options
	exchange string
}

func newConsumeRig(ctx context.Context, o Options, label string) (*consumeRig, error) {
	r, err := harness.New(ctx, o.Harness(), "consume", int32(o.Workers+4))
	if err != nil {
		return nil, err
	}
	cr := &consumeRig{Rig: r, o: o, exchange: r.Name + ".orders"}
	err = testkit.UseChannel(ctx, o.AMQPURL, func(ch *amqp.Channel) error {
		return ch.ExchangeDeclare(cr.exchange, "topic", true, false, false, false, nil)
	})
	if err == nil {
		r.OnClose("delete exchange "+cr.exchange, func(ctx context.Context) error {
			return testkit.UseChannel(ctx, o.AMQPURL, func(ch *amqp.Channel) error { return ch.ExchangeDelete(cr.exchange, false, false) })
		})
		_, err = r.Pool.Exec(ctx, `CREATE TABLE bench_handled (
			n bigserial PRIMARY KEY, key text NOT NULL, seq bigint NOT NULL, message_id text NOT NULL,
			handled_at timestamptz NOT NULL DEFAULT clock_timestamp())`)
	}
	if err != nil {
		r.Close()
		return nil, fmt.Errorf("consume rig: %w", err)
	}
	return cr, nil
}

// load commits orders at full speed (Rate orders/s for latency) through
// the producer and waits until the node has published every row.
func (r *consumeRig) load(ctx context.Context, orders, rate int, sys *harness.Node) (*measure.Producer, error) {
	p, err := measure.NewProducer(measure.ProducerConfig{Rate: rate, Workers: r.o.Workers, Payload: 100, Exchange: r.exchange,
		Orders: true, Max: int64(orders)}, r.Pool, r.Config.Partitions)
	if err != nil {
		return nil, err
	}
	pctx, cancel := context.WithTimeout(ctx, r.Config.Timeout)
	defer cancel()
	if err := p.Run(pctx); err != nil {
		return nil, err
	}
	if _, err := r.WaitPending(ctx, sys.Failed, nil); err != nil {
		return nil, err
	}
	return p, nil
}

// handledStats reads bench_handled: rows, distinct messages, keys handled
// out of order (a key_seq other than the previous one's + 1), and the
// handled_at of each message.
func handledStats(ctx context.Context, pool *pgxpool.Pool) (total, distinct, outOfOrder int, at map[string]time.Time, err error) {
	err = pool.QueryRow(ctx, `
		SELECT count(*), count(DISTINCT message_id),
		       (SELECT count(DISTINCT key) FROM (
		            SELECT key, seq, lag(seq) OVER (PARTITION BY key ORDER BY n) AS prev FROM bench_handled) x
		        WHERE seq <> coalesce(prev, 0) + 1)
		FROM bench_handled`).Scan(&total, &distinct, &outOfOrder)
	if err != nil {
		return 0, 0, 0, nil, fmt.Errorf("read handled: %w", err)
	}
	rows, err := pool.Query(ctx, `SELECT message_id, min(handled_at) FROM bench_handled GROUP BY message_id`)
	if err != nil {
		return 0, 0, 0, nil, fmt.Errorf("read handled: %w", err)
	}
	at = map[string]time.Time{}
	var id string
	var t time.Time
	_, err = pgx.ForEachRow(rows, []any{&id, &t}, func() error { at[id] = t; return nil })
	return total, distinct, outOfOrder, at, err
}

// waitHandled waits until n distinct messages are in bench_handled and
// returns when the last was handled. It polls the highest n first (an
// index lookup, at least the rows inserted) and counts distinct messages
// only once that reaches n: a count every 20 ms would cost the measured
// database about 100 µs per handled message at 1,000 msg/s.
func waitHandled(ctx context.Context, o Options, pool *pgxpool.Pool, n int) (time.Time, error) {
	var last time.Time
	err := harness.WaitUntil(ctx, o.Timeout, 20*time.Millisecond, fmt.Sprintf("%d messages handled", n), func() (bool, error) {
		var top int
		if err := pool.QueryRow(ctx, `SELECT coalesce(max(n), 0) FROM bench_handled`).Scan(&top); err != nil || top < n {
			return false, err
		}
		var got int
		var at *time.Time
		if err := pool.QueryRow(ctx, `SELECT count(DISTINCT message_id), max(handled_at) FROM bench_handled`).Scan(&got, &at); err != nil {
			return false, err
		}
		if at != nil {
			last = *at
		}
		return got >= n, nil
	})
	return last, err
}

// benchQueueHandler is benchHandler as an inbox.QueueHandler: it sleeps
// delay, then queues the insert.
func benchQueueHandler(delay time.Duration) inbox.QueueHandler {
	return func(ctx context.Context, m *inbox.Message, b *pgx.Batch) error {
		if err := harness.Sleep(ctx, delay); err != nil {
			return err
		}
		b.Queue(`INSERT INTO bench_handled (key, seq, message_id) VALUES ($1, $2, $3)`, m.CorrelationID, m.KeySeq, m.ID)
		return nil
	}
}

// benchHandler sleeps delay (a downstream call), then inserts the
// message's row in the inbox's transaction.
func benchHandler(delay time.Duration) inbox.Handler {
	return func(ctx context.Context, tx pgx.Tx, m *inbox.Message) error {
		if err := harness.Sleep(ctx, delay); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO bench_handled (key, seq, message_id) VALUES ($1, $2, $3)`, m.CorrelationID, m.KeySeq, m.ID)
		return err
	}
}
