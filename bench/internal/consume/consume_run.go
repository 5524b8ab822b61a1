package consume

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/ordo-relay/ordo/bench/internal/measure"

	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ordo-relay/ordo/bench/internal/harness"
	"github.com/ordo-relay/ordo/bench/internal/result"
	"github.com/ordo-relay/ordo/inbox"
	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/wire"
)

// consumeBase is the 1-instance rate the speedups are computed against.
var consumeBase float64

func consumeOnce(ctx context.Context, o Options, co consumeFlags, n int) (*result.Result, error) {
	r, err := newConsumeRig(ctx, o, "inbox")
	if err != nil {
		return nil, err
	}
	defer r.Close()
	res := result.New("consume")
	res.Label = fmt.Sprintf("%d-instances", n)
	res.Param("instances", n)
	addConsumeParams(res, o, co)
	cfg := inbox.DefaultConfig(r.Name)
	cfg.AMQPURL, cfg.Exchange, cfg.Shards, cfg.Partitions, cfg.Lanes = o.AMQPURL, r.exchange, co.Shards, o.Partitions, co.Lanes
	cfg.BatchSize, cfg.BatchTime = co.Batch, co.BatchTime
	cfg.LeaseTTL, cfg.Logger = 2*time.Second, slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if err := r.declareTopology(ctx, inbox.TopologyOf(cfg)); err != nil {
		return nil, err
	}
	node, err := r.StartNextNode(ctx, o.AMQPURL)
	if err != nil {
		return nil, err
	}
	if err := node.WaitReady(ctx, o.Timeout); err != nil {
		return nil, err
	}
	fmt.Printf("loading %d orders, then draining them with %d inbox instance(s)\n", co.Orders, n)
	if _, err := r.load(ctx, co.Orders, 5000, node); err != nil {
		return nil, err
	}
	start := time.Now()
	group, err := startInstances(ctx, r, cfg, co, n)
	if err != nil {
		return nil, err
	}
	defer group.Stop()
	settled, before, err := group.waitBalanced(ctx, o, r.Pool, co.Shards)
	if err != nil {
		return nil, err
	}
	res.Seconds("settle", settled.Sub(start))
	cpu0 := measure.SampleCPU()
	stmts0, trips0, commits0 := group.trace.counts()
	backends, err := measure.StartBackendCPU(ctx, r.Probe, r.Name)
	if err != nil {
		return nil, err
	}
	last, err := waitHandled(ctx, o, r.Pool, 2*co.Orders)
	if err != nil {
		_, _ = backends.Stop(ctx)
		return nil, err
	}
	rate := float64(2*co.Orders-before) / last.Sub(settled).Seconds()
	addDrainCPU(ctx, res, cpu0, backends, 2*co.Orders-before)
	stmts1, trips1, commits1 := group.trace.counts()
	drained := float64(max(2*co.Orders-before, 1))
	res.Figure("drain_statements_per_msg", float64(stmts1-stmts0)/drained, "")
	res.Figure("drain_round_trips_per_msg", float64(trips1-trips0)/drained, "")
	res.Figure("drain_commits_per_msg", float64(commits1-commits0)/drained, "")
	fmt.Printf("measuring latency at %d orders/s for %v\n", co.Rate, co.Latency)
	lat, err := r.latencyPhase(ctx, co, node, 2*co.Orders)
	if err != nil {
		return nil, err
	}
	return r.finishConsume(ctx, res, rate, n, lat, group.Stats())
}

// latencyPhase commits at co.Rate orders a second for co.Latency and
// returns, for each of those messages, producer commit to handler insert.
func (r *consumeRig) latencyPhase(ctx context.Context, co consumeFlags, node *harness.Node, already int) ([]time.Duration, error) {
	p, err := measure.NewProducer(measure.ProducerConfig{Rate: co.Rate, Workers: r.o.Workers, Payload: 100, Exchange: r.exchange,
		Orders: true}, r.Pool, r.Config.Partitions)
	if err != nil {
		return nil, err
	}
	pctx, cancel := context.WithTimeout(ctx, co.Latency)
	err = p.Run(pctx)
	cancel()
	if err != nil {
		return nil, err
	}
	ids, commits := p.Snapshot()
	if _, err := waitHandled(ctx, r.o, r.Pool, already+len(ids)); err != nil {
		return nil, err
	}
	_, _, _, at, err := handledStats(ctx, r.Pool)
	if err != nil {
		return nil, err
	}
	var lat []time.Duration
	for _, id := range ids {
		if t, ok := at[id]; ok {
			lat = append(lat, t.Sub(commits[id].Committed))
		}
	}
	return lat, nil
}

func (r *consumeRig) finishConsume(ctx context.Context, res *result.Result, rate float64, n int, lat []time.Duration, st inbox.Stats) (*result.Result, error) {
	total, distinct, ooo, _, err := handledStats(ctx, r.Pool)
	if err != nil {
		return nil, err
	}
	res.Figure("msgs_per_sec", rate, "msg/s")
	if n == 1 {
		consumeBase = rate
	} else if consumeBase > 0 {
		res.Figure("speedup_vs_1", rate/consumeBase, "x")
	}
	res.Figure("handled_out_of_order", float64(ooo), "orders")
	res.Figure("duplicates_handled", float64(total-distinct), "")
	measure.DistributionOf(lat).AddTo(res, "commit_to_handled")
	res.Figure("duplicates_dropped", float64(st.Duplicates), "")
	res.Figure("gaps_stored", float64(st.GapsStored), "")
	res.Figure("retries", float64(st.Retries), "")
	res.Check = result.Check{Total: total, Distinct: distinct, Duplicates: total - distinct, Reorders: ooo}
	res.Finished = time.Now()
	return res, nil
}

func addConsumeParams(res *result.Result, o Options, co consumeFlags) {
	res.Param("orders", co.Orders)
	res.Param("shards", co.Shards)
	res.Param("partitions", o.Partitions)
	res.Param("handler_delay", co.Delay)
	res.Param("conns_per_instance", co.Conns)
	res.Param("lanes", co.Lanes)
	res.Param("batch", co.Batch)
	res.Param("batch_time", co.BatchTime)
	res.Param("queued_handler", co.Queued)
	res.Param("latency_orders_per_sec", co.Rate)
}

// declareTopology declares topo and removes it at close.
func (r *consumeRig) declareTopology(ctx context.Context, topo inbox.Topology) error {
	if err := testkit.UseChannel(ctx, r.Config.AMQPURL, topo.Declare); err != nil {
		return fmt.Errorf("declare inbox topology: %w", err)
	}
	r.OnClose("delete inbox topology", func(ctx context.Context) error {
		return testkit.UseChannel(ctx, r.Config.AMQPURL, func(ch *amqp.Channel) error {
			var errs []error
			for i := range topo.Shards {
				_, err := ch.QueueDelete(topo.ShardQueue(i), false, false, false)
				errs = append(errs, err)
			}
			_, err := ch.QueueDelete(topo.DeadQueue(), false, false, false)
			return errors.Join(append(errs, err, ch.ExchangeDelete(topo.ShardsExchange(), false, false),
				ch.ExchangeDelete(topo.UnroutableExchange(), false, false))...)
		})
	})
	return nil
}

// instances are inbox consumers running in this process.
type instances struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	pools  []*pgxpool.Pool
	cs     []*inbox.Consumer
	trace  *stmtCounter // every instance's statements and round trips
}

func startInstances(ctx context.Context, r *consumeRig, cfg inbox.Config, co consumeFlags, n int) (*instances, error) {
	cctx, cancel := context.WithCancel(ctx)
	g := &instances{cancel: cancel, trace: &stmtCounter{}}
	for i := range n {
		pc, err := pgxpool.ParseConfig(r.DBURL)
		if err != nil {
			g.Stop()
			return nil, err
		}
		pc.MaxConns = int32(co.Conns)
		pc.ConnConfig.Tracer = g.trace
		pc.ConnConfig.RuntimeParams["application_name"] = measure.AppInbox
		pool, err := pgxpool.NewWithConfig(ctx, pc)
		if err != nil {
			g.Stop()
			return nil, fmt.Errorf("instance pool: %w", err)
		}
		g.pools = append(g.pools, pool)
		c := cfg
		c.Instance = fmt.Sprintf("i%d", i+1)
		var cons *inbox.Consumer
		if co.Queued {
			cons, err = inbox.NewQueued(c, pool, benchQueueHandler(co.Delay))
		} else {
			cons, err = inbox.New(c, pool, benchHandler(co.Delay))
		}
		if err != nil {
			g.Stop()
			return nil, err
		}
		g.cs = append(g.cs, cons)
		g.wg.Go(func() {
			if err := cons.Run(cctx); err != nil {
				fmt.Fprintf(os.Stderr, "bench: consume: instance %s: %v\n", c.Instance, err)
			}
		})
	}
	return g, nil
}

// waitBalanced waits until the instances own every shard, each its share,
// and returns when, with how many messages were handled by then: the rate
// is measured from there, leaving out the start-up handoffs.
func (g *instances) waitBalanced(ctx context.Context, o Options, pool *pgxpool.Pool, shards int) (time.Time, int, error) {
	n := len(g.cs)
	err := harness.WaitUntil(ctx, o.Timeout, 10*time.Millisecond, "shards balanced", func() (bool, error) {
		total := 0
		for _, c := range g.cs {
			k := len(c.Owned())
			if k < shards/n || k > (shards+n-1)/n {
				return false, nil
			}
			total += k
		}
		return total == shards, nil
	})
	if err != nil {
		return time.Time{}, 0, err
	}
	at := time.Now()
	var handled int
	err = pool.QueryRow(ctx, `SELECT count(DISTINCT message_id) FROM bench_handled`).Scan(&handled)
	return at, handled, err
}

func (g *instances) Stats() inbox.Stats {
	var s inbox.Stats
	for _, c := range g.cs {
		x := c.Stats()
		s.Duplicates += x.Duplicates
		s.GapsStored += x.GapsStored
		s.Retries += x.Retries
	}
	return s
}

func (g *instances) Stop() {
	g.cancel()
	g.wg.Wait()
	for _, p := range g.pools {
		p.Close()
	}
}

// competingOnce runs the same backlog through n plain competing consumers
// on one queue, each with co.Conns workers: the order-blind baseline.
func competingOnce(ctx context.Context, o Options, co consumeFlags, n int) (*result.Result, error) {
	r, err := newConsumeRig(ctx, o, "competing")
	if err != nil {
		return nil, err
	}
	defer r.Close()
	res := result.New("consume")
	res.Label = fmt.Sprintf("competing-%d", n)
	res.Baseline = true
	res.Param("instances", n)
	res.Param("consumers", "competing")
	addConsumeParams(res, o, co)
	queue := r.Name + ".competing"
	err = testkit.UseChannel(ctx, o.AMQPURL, func(ch *amqp.Channel) error {
		if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
			return err
		}
		return ch.QueueBind(queue, "#", r.exchange, false, nil)
	})
	if err != nil {
		return nil, fmt.Errorf("declare competing queue: %w", err)
	}
	r.OnClose("delete "+queue, func(ctx context.Context) error {
		return testkit.UseChannel(ctx, o.AMQPURL, func(ch *amqp.Channel) error { _, err := ch.QueueDelete(queue, false, false, false); return err })
	})
	node, err := r.StartNextNode(ctx, o.AMQPURL)
	if err != nil {
		return nil, err
	}
	if err := node.WaitReady(ctx, o.Timeout); err != nil {
		return nil, err
	}
	fmt.Printf("loading %d orders, then draining them with %d competing consumer(s)\n", co.Orders, n)
	if _, err := r.load(ctx, co.Orders, 5000, node); err != nil {
		return nil, err
	}
	start := time.Now()
	stop, err := startCompeting(ctx, r, queue, co, n)
	if err != nil {
		return nil, err
	}
	last, err := waitHandled(ctx, o, r.Pool, 2*co.Orders)
	stop()
	if err != nil {
		return nil, err
	}
	total, distinct, ooo, _, err := handledStats(ctx, r.Pool)
	if err != nil {
		return nil, err
	}
	res.Figure("msgs_per_sec", float64(2*co.Orders)/last.Sub(start).Seconds(), "msg/s")
	res.Figure("handled_out_of_order", float64(ooo), "orders")
	res.Figure("handled_out_of_order_percent", 100*float64(ooo)/float64(co.Orders), "%")
	res.Figure("duplicates_handled", float64(total-distinct), "")
	res.Check = result.Check{Total: total, Distinct: distinct, Duplicates: total - distinct, Reorders: ooo}
	res.Finished = time.Now()
	return res, nil
}

// startCompeting starts n consumers of queue, each a connection with
// co.Conns workers sharing its deliveries; stop ends them and waits.
func startCompeting(ctx context.Context, r *consumeRig, queue string, co consumeFlags, n int) (stop func(), err error) {
	var conns []io.Closer
	var wg sync.WaitGroup
	stop = func() {
		for _, c := range conns {
			_ = c.Close()
		}
		wg.Wait()
	}
	for range n {
		conn, err := amqp.Dial(r.Config.AMQPURL)
		if err != nil {
			stop()
			return nil, fmt.Errorf("competing consumer: %w", err)
		}
		conns = append(conns, conn)
		ch, err := conn.Channel()
		if err == nil {
			err = ch.Qos(32, 0, false)
		}
		var ds <-chan amqp.Delivery
		if err == nil {
			ds, err = ch.Consume(queue, "", false, false, false, false, nil)
		}
		if err != nil {
			stop()
			return nil, fmt.Errorf("competing consumer: %w", err)
		}
		for range co.Conns {
			wg.Go(func() {
				for d := range ds {
					_ = harness.Sleep(ctx, co.Delay)
					seq, _ := wire.Int(d.Headers, wire.HeaderKeySeq)
					_, _ = r.Pool.Exec(ctx, `INSERT INTO bench_handled (key, seq, message_id) VALUES ($1, $2, $3)`, d.CorrelationId, seq, d.MessageId)
					_ = d.Ack(false)
				}
			})
		}
	}
	return stop, nil
}

// addDrainCPU adds the CPU of the drain (from cpu0 and the start of
// backends until now): the machine's, the bench process's (the inbox
// instances run in it) and the PostgreSQL backends' of the bench's
// database (the instances' and the relay's; other databases' left out;
// the instances' alone as pg_inbox),
// each also per handled message in microseconds, so that one instance's
// run says how many messages a second the machine's cores could handle.
func addDrainCPU(ctx context.Context, res *result.Result, cpu0 measure.CPUSample, backends *measure.BackendCPU, msgs int) {
	totals, err := backends.Stop(ctx)
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench: consume: PostgreSQL backends' CPU: %v\n", err)
	}
	cpu1 := measure.SampleCPU()
	measure.AddCPU(res, cpu0, cpu1, "drain_")
	pg := totals[measure.GroupRelay] + totals[measure.GroupInbox]
	res.Seconds("drain_cpu_pg_db", pg)
	res.Figure("drain_us_per_msg_pg_inbox", measure.PerMsgMicros(totals[measure.GroupInbox], msgs), "us")
	bench := cpu1.Self - cpu0.Self
	res.Figure("drain_us_per_msg_bench", measure.PerMsgMicros(bench, msgs), "us")
	res.Figure("drain_us_per_msg_pg_db", measure.PerMsgMicros(pg, msgs), "us")
	res.Figure("drain_us_per_msg_machine", measure.PerMsgMicros(cpu1.Machine-cpu0.Machine, msgs), "us")
}
