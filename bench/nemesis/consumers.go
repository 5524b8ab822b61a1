package nemesis

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ordo-relay/ordo/bench/internal/harness"
	"github.com/ordo-relay/ordo/inbox"
	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/orderapi"
	"github.com/ordo-relay/ordo/outbox"
	"github.com/ordo-relay/ordo/wire"
)

const (
	// consumerRate is the order API requests a second of the consumer
	// scenario when Config.Rate is 0.
	consumerRate = 50
	// consumerWorkers are the load's workers.
	consumerWorkers = 4
	// shippingBindings is what cmd/shipping binds by default.
	shippingBindings = "order.*"
	// deadTimeout bounds the wait for a poison order's dead letter.
	deadTimeout = time.Minute
)

// consumerRun is one run of the consumer scenario: the relay (one node)
// and the order API feed three shipping instances while the plan's faults
// hit the instances, the broker and the database; the checker judges from
// the shipping database and the outbox. See docs/reliability.md.
type consumerRun struct {
	o         Config
	r         *harness.Rig
	seed      int64
	plan      []plannedStep
	srv       *servers
	relay     *harness.Cluster
	sh        *shippingFleet
	ship      *pgxpool.Pool // the checker's pool on the shipping database
	load      *orderLoad
	producer  *outbox.Producer
	probeKeys []string
	exchange  string
	start     time.Time

	active  healFunc
	poison  map[string]int64 // poison key -> the poison row's key_seq
	doneSeq int64            // outbox rows up to this seq are known handled (but the poison keys')
	results []stepResult
	steps   []stepReport
}

// runConsumers runs the consumer scenario.
func runConsumers(ctx context.Context, o Config) error {
	seed := o.Seed
	if seed == 0 {
		seed = rand.Int64N(1<<31) + 1
	}
	plan, err := planKinds(seed, o.Profile, shippingInstances, consumerKinds)
	if err != nil {
		return err
	}
	rerun := fmt.Sprintf("go run ./bench/cmd/nemesis -scenario consumers -seed %d -profile %s", seed, o.Profile)
	if len(o.Kinds) > 0 {
		plan = onlyKinds(plan, o.Kinds)
		rerun += " -kinds " + joinKinds(o.Kinds)
	}
	fmt.Printf("nemesis consumers: seed %d (rerun it with: %s)\n", seed, rerun)
	r, err := harness.New(ctx, o.harness(), "nemesisc", 4)
	if err != nil {
		return err
	}
	defer r.Close()
	c := &consumerRun{o: o, r: r, seed: seed, plan: plan, srv: probeServers(ctx, o), start: time.Now(),
		poison: map[string]int64{}}
	defer func() {
		if err := c.srv.restore(); err != nil {
			fmt.Fprintf(os.Stderr, "bench: nemesis: restore the servers: %v\n", err)
		}
	}()
	defer c.healActive()
	if err := c.setup(ctx); err != nil {
		return err
	}
	defer c.sh.resumeAll()
	printPlan(os.Stdout, seed, o.Profile, plan, c.sh.names)
	for _, k := range consumerKinds {
		if why := c.srv.can(k); why != "" {
			fmt.Printf("nemesis: %s cannot run on this machine and is SKIPPED: %s\n", k, why)
		}
	}
	loadCtx, stopLoad := context.WithCancel(ctx)
	loadDone := make(chan struct{})
	go func() { defer close(loadDone); c.load.run(loadCtx) }()
	defer func() { stopLoad(); <-loadDone }()

	runErr := c.runSchedule(ctx)
	if runErr != nil {
		c.logf("schedule stopped: %v", runErr)
	}
	c.healActive()
	stopLoad()
	<-loadDone
	v, endErr := c.finish(ctx)
	if ctx.Err() != nil {
		c.logf("INTERRUPTED: the drain was cut short, so lost counts what had not been handled yet")
	}
	ok := c.report(v)
	switch {
	case runErr != nil || endErr != nil:
		return errors.Join(runErr, endErr)
	case !ok:
		return fmt.Errorf("the checker found handled_twice=%d lost=%d out_of_order=%d unexpected_dead=%d poison_unheld=%d stuck=%d (seed %d)",
			v.HandledTwice, v.Lost, v.OutOfOrder, v.UnexpectedDead, v.PoisonUnheld, v.Stuck, seed)
	}
	return nil
}

func (c *consumerRun) logf(format string, args ...any) {
	fmt.Printf("[%+8.2fs] %s\n", time.Since(c.start).Seconds(), fmt.Sprintf(format, args...))
}

// setup creates the exchange and the shipping database, starts the relay,
// the shipping instances and the order API, and prepares the load.
func (c *consumerRun) setup(ctx context.Context) error {
	r, o := c.r, c.o
	c.exchange = r.Name + "_events"
	err := testkit.UseChannel(ctx, o.AMQPURL, func(ch *amqp.Channel) error {
		return ch.ExchangeDeclare(c.exchange, "topic", true, false, false, false, nil)
	})
	if err != nil {
		return fmt.Errorf("declare exchange %s: %w", c.exchange, err)
	}
	r.OnClose("delete exchange "+c.exchange, func(ctx context.Context) error {
		return testkit.UseChannel(ctx, o.AMQPURL, func(ch *amqp.Channel) error { return ch.ExchangeDelete(c.exchange, false, false) })
	})
	group := "nemesis-" + r.Name[len(r.Name)-8:]
	if err := c.shippingDatabase(ctx, group); err != nil {
		return err
	}
	if c.producer, err = outbox.NewProducer(o.Partitions); err != nil {
		return err
	}
	c.probeKeys = probeKeys(o.Partitions)
	if c.relay, err = harness.NewCluster(r, o.AMQPURL, 1, false); err != nil {
		return err
	}
	c.relay.Env = []string{"ORDO_DB_MAX_CONNS=4"}
	if _, err := c.relay.Start(ctx, 0); err != nil {
		return err
	}
	if _, _, err := c.relay.WaitConverged(ctx, []int{0}, harness.ConvergeTimeout); err != nil {
		return err
	}
	for i := range shippingInstances {
		if err := c.sh.start(ctx, i); err != nil {
			return err
		}
	}
	if err := c.sh.waitBalanced(ctx, c.ship); err != nil {
		return err
	}
	api, err := r.StartOrderAPI(ctx, "orderapi", r.DBURL, c.exchange)
	if err != nil {
		return err
	}
	c.load = newOrderLoad([]loadTarget{{source: wire.DefaultSource, addr: api.HTTPAddr}}, o.rateOr(consumerRate), consumerWorkers, c.seed)
	return nil
}

// shippingDatabase creates the shipping database, the checker's pool on
// it and the fleet (not started), and registers the removal of the
// database and of the group's broker objects.
func (c *consumerRun) shippingDatabase(ctx context.Context, group string) error {
	r, o := c.r, c.o
	dbURL, drop, err := testkit.CreateDatabase(ctx, o.PostgresURL, r.Name+"_shipping")
	if err != nil {
		return err
	}
	r.OnClose("drop the shipping database", drop)
	icfg := inbox.DefaultConfig(group)
	icfg.Exchange, icfg.Bindings, icfg.Shards, icfg.Partitions = c.exchange, []string{shippingBindings}, shippingShards, o.Partitions
	topo := inbox.TopologyOf(icfg)
	r.OnClose("delete the shipping topology", func(ctx context.Context) error {
		return testkit.UseChannel(ctx, o.AMQPURL, func(ch *amqp.Channel) error {
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
	pc, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return err
	}
	pc.MaxConns = 3
	pc.ConnConfig.RuntimeParams["application_name"] = "ordo_bench_nemesis_checker"
	if c.ship, err = pgxpool.NewWithConfig(ctx, pc); err != nil {
		return fmt.Errorf("open the checker's pool on the shipping database: %w", err)
	}
	r.OnClose("close the checker's pool", func(context.Context) error { c.ship.Close(); return nil })
	c.sh, err = newShippingFleet(ctx, r, dbURL, group, c.exchange, shippingInstances)
	return err
}

// healActive heals the fault in progress, if any, on a context of its own.
func (c *consumerRun) healActive() {
	h := c.active
	c.active = nil
	if h == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), healTimeout)
	defer cancel()
	if err := h(ctx); err != nil {
		fmt.Fprintf(os.Stderr, "bench: nemesis: heal: %v\n", err)
	}
}

// failed returns the first error of a process that exited on its own.
func (c *consumerRun) failed() error {
	if err := c.relay.Failed(); err != nil {
		return err
	}
	return c.sh.failed()
}

// runSchedule runs the warm-up and every step of the plan.
func (c *consumerRun) runSchedule(ctx context.Context) error {
	c.logf("load: %d order API requests a second; handler faults: %.0f%% errors, %.0f%% panics of every attempt; warm-up %v",
		c.o.rateOr(consumerRate), 100*shippingErrorRate, 100*shippingPanicRate, nemesisWarmup)
	if err := harness.Sleep(ctx, nemesisWarmup); err != nil {
		return err
	}
	for i, s := range c.plan {
		desc := s.describe(c.sh.names)
		if why := c.srv.can(s.Kind); why != "" {
			c.logf("step %d (%d of %d): %s: SKIPPED (cannot run here: %s)", s.N, i+1, len(c.plan), desc, why)
			continue
		}
		c.logf("step %d (%d of %d): %s", s.N, i+1, len(c.plan), desc)
		if err := c.runStep(ctx, s, desc); err != nil {
			return fmt.Errorf("step %d (%s): %w", s.N, desc, err)
		}
	}
	return nil
}

// runStep runs one step: wait for balanced shards, inject, hold, heal,
// measure the recovery, rest.
func (c *consumerRun) runStep(ctx context.Context, s plannedStep, desc string) error {
	if err := c.sh.waitBalanced(ctx, c.ship); err != nil {
		return err
	}
	heal, err := c.inject(ctx, s)
	c.active = heal
	if err != nil {
		return err
	}
	if err := harness.Sleep(ctx, s.Hold); err != nil {
		return err
	}
	h := c.active
	c.active = nil
	hctx, cancel := context.WithTimeout(ctx, healTimeout)
	err = h(hctx)
	cancel()
	if err != nil {
		return fmt.Errorf("heal: %w", err)
	}
	healAt := time.Now()
	c.logf("  healed")
	rep := stepReport{plannedStep: s, desc: desc}
	res := stepResult{Kind: s.Kind}
	rec, err := c.recovery(ctx, s.N, healAt)
	if err != nil {
		if ferr := c.failed(); ferr != nil || ctx.Err() != nil {
			return err
		}
		c.logf("  NOT RECOVERED: %v", err)
	} else {
		res.Recovered, res.Recovery = true, rec
		rep.recovered, rep.recovery = true, rec
		c.logf("  recovered %v after the heal", rec.Round(time.Millisecond))
	}
	c.results = append(c.results, res)
	c.steps = append(c.steps, rep)
	return harness.Sleep(ctx, s.Quiet)
}

// slots returns the instance slots step s acts on.
func (c *consumerRun) slots(s plannedStep) []int {
	if s.Target < 0 {
		return c.sh.all()
	}
	return []int{s.Target}
}

// inject starts step s's fault and returns what heals it.
func (c *consumerRun) inject(ctx context.Context, s plannedStep) (healFunc, error) {
	sh, srv, t := c.sh, c.srv, s.Target
	switch s.Kind {
	case kindKill:
		sh.kill(t)
		return once(func(ctx context.Context) error { return sh.start(ctx, t) }), nil
	case kindPause:
		if err := sh.signal(t, syscall.SIGSTOP); err != nil {
			return nil, err
		}
		return once(func(context.Context) error { return sh.signal(t, syscall.SIGCONT) }), nil
	case kindRebalance:
		if err := sh.leave(t); err != nil {
			return nil, err
		}
		c.logf("  %s left the group", sh.names[t])
		return once(func(ctx context.Context) error { return sh.start(ctx, t) }), nil
	case kindBrokerRestart:
		heal := once(srv.startBroker)
		return heal, srv.stopBroker(ctx)
	case kindBrokerClose:
		k, err := srv.closeConnections(ctx, sh.apps(c.slots(s)...))
		c.logf("  closed %d broker connections", k)
		return noHeal, err
	case kindPGRestart:
		heal := once(srv.startPostgres)
		return heal, srv.stopPostgres(ctx)
	case kindPGLink:
		p := sh.pg[t]
		if s.Variant == variantStall {
			p.Stall()
		} else {
			p.Cut()
		}
		return once(func(context.Context) error { p.Resume(); p.Restore(); return nil }), nil
	case kindPoisonOrder:
		return noHeal, c.plantPoison(ctx, s.N)
	case kindRedeliver:
		return noHeal, c.redeliverHandled(ctx)
	}
	return nil, fmt.Errorf("kind %q is not one of the consumer scenario's", s.Kind)
}

// plantPoison commits a poison order (its OrderPlaced fails on every
// attempt: cmd/shipping's -fault-poison-prefix) and its OrderCancelled,
// and waits until the inbox lists the first as dead-lettered.
func (c *consumerRun) plantPoison(ctx context.Context, step int) error {
	key := fmt.Sprintf("%s%d-%s", poisonPrefix, step, harness.RandomHex(4))
	placed, _ := json.Marshal(map[string]any{"orderId": key, "customerId": "nemesis", "currency": "EUR", "total": "1.00"})
	cancelled, _ := json.Marshal(map[string]any{"orderId": key})
	var ids []string
	err := pgx.BeginFunc(ctx, c.r.Pool, func(tx pgx.Tx) error {
		got, err := c.producer.Enqueue(ctx, tx,
			outbox.Message{CorrelationID: key, Exchange: c.exchange, RoutingKey: orderapi.RoutingKeyOrderPlaced,
				Type: orderapi.TypeOrderPlaced, Payload: placed},
			outbox.Message{CorrelationID: key, Exchange: c.exchange, RoutingKey: orderapi.RoutingKeyOrderCancelled,
				Type: orderapi.TypeOrderCancelled, Payload: cancelled})
		for _, id := range got {
			ids = append(ids, id.String())
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("plant a poison order: %w", err)
	}
	c.poison[key] = 1
	c.logf("  planted poison order %s (OrderPlaced %s, then OrderCancelled %s)", key, ids[0], ids[1])
	start := time.Now()
	err = harness.WaitUntil(ctx, deadTimeout, 100*time.Millisecond, "the poison order's dead letter", func() (bool, error) {
		if err := c.failed(); err != nil {
			return false, err
		}
		dead, err := inbox.Dead(ctx, c.ship, c.sh.group)
		if err != nil {
			return false, nil
		}
		for _, d := range dead {
			if d.Key == key {
				return true, nil
			}
		}
		return false, nil
	})
	if err == nil {
		c.logf("  dead-lettered after %v", time.Since(start).Round(time.Millisecond))
	}
	return err
}
