package nemesis

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ordo-relay/ordo/bench/internal/harness"
	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/outbox"
)

const (
	nemesisNodes    = 3
	nemesisRate     = 100 // order API requests a second, when -rate is 0
	nemesisWorkers  = 8
	nemesisWarmup   = 3 * time.Second
	recoveryTimeout = time.Minute     // a step not recovered by then is reported, and the run goes on
	drainTimeout    = 2 * time.Minute // after the last step, for every promise to arrive
	settleAfter     = 2 * time.Second // after the drain, for late publishes to show up
	healTimeout     = 3 * time.Minute // bounds one heal, on a context of its own
)

// nemesis is one run: the rig, the servers, the fleet, the load, the
// checker's consumer, and what the steps did.
type nemesis struct {
	o         Config
	r         *harness.Rig
	seed      int64
	plan      []plannedStep
	srv       *servers
	dbs       []*runDB // the sources: the rig's database first
	f         *fleet
	hist      *historian
	load      *orderLoad
	producer  *outbox.Producer
	probeKeys []string
	start     time.Time

	voidExchange    string // exists with no binding: the broker returns what is published to it
	missingExchange string // never declared

	active  healFunc // the heal of the fault in progress, if any
	skipped []skip
	windows []stepWindow
	results []stepResult
	steps   []stepReport
}

// stepReport is one step's line of the final table.
type stepReport struct {
	plannedStep
	desc      string
	window    int // index in windows
	recovered bool
	recovery  time.Duration
}

// Run runs the nemesis: see docs/reliability.md.
func Run(ctx context.Context, o Config) error {
	if err := o.Validate(); err != nil {
		return err
	}
	if o.Scenario == ScenarioConsumers {
		return runConsumers(ctx, o)
	}
	seed := o.Seed
	if seed == 0 {
		seed = rand.Int64N(1<<31) + 1
	}
	plan, err := planKinds(seed, o.Profile, nemesisNodes, o.scenarioKinds())
	if err != nil {
		return err
	}
	rerun := fmt.Sprintf("go run ./bench/cmd/nemesis -seed %d -profile %s -sources %d", seed, o.Profile, o.sourceCount())
	if len(o.Kinds) > 0 {
		plan = onlyKinds(plan, o.Kinds)
		rerun += " -kinds " + joinKinds(o.Kinds)
	}
	if o.Lean {
		rerun += " -lean"
	}
	fmt.Printf("nemesis: seed %d (rerun it with: %s)\n", seed, rerun)
	r, err := harness.New(ctx, o.harness(), "nemesis", 4)
	if err != nil {
		return err
	}
	defer r.Close()
	n := &nemesis{o: o, r: r, seed: seed, plan: plan, srv: probeServers(ctx, o), start: time.Now()}
	// Deferred, so run last-in first-out, whatever happens: the load and
	// the consumer stop, paused nodes continue, the fault in progress
	// heals, the servers are checked and brought back, and the rig closes
	// (nodes, order API, proxies, queue, exchanges, database).
	defer func() {
		if err := n.srv.restore(); err != nil {
			fmt.Fprintf(os.Stderr, "bench: nemesis: restore the servers: %v\n", err)
		}
	}()
	defer n.healActive()
	if err := n.setup(ctx); err != nil {
		return err
	}
	defer n.f.resumeAll()
	printPlan(os.Stdout, seed, o.Profile, plan, n.f.names())
	for _, k := range o.scenarioKinds() {
		if why := n.srv.can(k); why != "" {
			fmt.Printf("nemesis: %s cannot run on this machine and is SKIPPED: %s\n", k, why)
		}
	}

	histCtx, stopHist := context.WithCancel(context.Background())
	histDone := make(chan struct{})
	go func() { defer close(histDone); n.hist.run(histCtx) }()
	defer func() { stopHist(); <-histDone }()
	loadCtx, stopLoad := context.WithCancel(ctx)
	loadDone := make(chan struct{})
	go func() { defer close(loadDone); n.load.run(loadCtx) }()
	defer func() { stopLoad(); <-loadDone }()

	runErr := n.runSchedule(ctx)
	if runErr != nil {
		n.logf("schedule stopped: %v", runErr)
	}
	n.healActive()
	stopLoad()
	<-loadDone
	v, endErr := n.finish(ctx)
	stopHist()
	<-histDone
	if ctx.Err() != nil {
		n.logf("INTERRUPTED: the drain was cut short, so lost counts what had not arrived yet")
	}
	ok := n.report(v)
	switch {
	case runErr != nil || endErr != nil:
		return errors.Join(runErr, endErr)
	case !ok:
		return fmt.Errorf("the checker found lost=%d reorders=%d gaps=%d stale_over_bound=%d (seed %d)",
			v.Lost, v.Reorders, v.Gaps, v.OverBound, seed)
	}
	return nil
}

// setup creates the exchanges and the checker's queue, starts the nodes
// and the order API, and prepares the load.
func (n *nemesis) setup(ctx context.Context) error {
	r := n.r
	exchange := r.Name + "_events"
	n.voidExchange, n.missingExchange = r.Name+"_void", r.Name+"_missing"
	for _, ex := range []string{exchange, n.voidExchange} {
		err := testkit.UseChannel(ctx, n.o.AMQPURL, func(ch *amqp.Channel) error {
			return ch.ExchangeDeclare(ex, "topic", true, false, false, false, nil)
		})
		if err != nil {
			return fmt.Errorf("declare exchange %s: %w", ex, err)
		}
		r.OnClose("delete exchange "+ex, func(ctx context.Context) error {
			return testkit.UseChannel(ctx, n.o.AMQPURL, func(ch *amqp.Channel) error { return ch.ExchangeDelete(ex, false, false) })
		})
	}
	n.hist = newHistorian(n.o.AMQPURL, exchange, r.Name+"_checker")
	if err := n.hist.declare(ctx); err != nil {
		return err
	}
	r.OnClose("delete the checker's queue", n.hist.remove)
	var err error
	if n.producer, err = outbox.NewProducer(n.o.Partitions); err != nil {
		return err
	}
	n.probeKeys = probeKeys(n.o.Partitions)
	if n.dbs, err = openSources(ctx, r, n.o.sourceCount()); err != nil {
		return err
	}
	if n.f, err = newFleet(r, nemesisNodes, exchange, n.dbs); err != nil {
		return err
	}
	for i := range nemesisNodes {
		if err := n.f.start(ctx, i); err != nil {
			return err
		}
	}
	if err := n.f.waitConverged(ctx); err != nil {
		return err
	}
	if n.o.Lean {
		if err := n.dropKeySeqTriggers(ctx); err != nil {
			return err
		}
	}
	targets, err := n.f.startAPIs(ctx)
	if err != nil {
		return err
	}
	n.load = newOrderLoad(targets, n.o.rateOr(nemesisRate), nemesisWorkers, n.seed)
	return nil
}

// dropKeySeqTriggers drops the producers' key_seq trigger from every
// source, waiting until every node holding a lease there has recorded
// that it numbers rows (each does before its first read).
func (n *nemesis) dropKeySeqTriggers(ctx context.Context) error {
	for _, db := range n.dbs {
		var last error
		err := harness.WaitUntil(ctx, 30*time.Second, 100*time.Millisecond, "the key_seq trigger dropped from "+db.name, func() (bool, error) {
			last = outbox.DropKeySeqTrigger(ctx, db.pool)
			return last == nil, nil
		})
		if err != nil {
			return fmt.Errorf("%w (last: %v)", err, last)
		}
	}
	n.logf("lean: the key_seq trigger is dropped from %d source(s): the partition owners number the rows", len(n.dbs))
	return nil
}

// logf prints a line of the run, stamped with the time since the start.
func (n *nemesis) logf(format string, args ...any) {
	fmt.Printf("[%+8.2fs] %s\n", time.Since(n.start).Seconds(), fmt.Sprintf(format, args...))
}

// healActive heals the fault in progress, if any, on a context of its own.
func (n *nemesis) healActive() {
	if err := n.healNow(); err != nil {
		fmt.Fprintf(os.Stderr, "bench: nemesis: heal: %v\n", err)
	}
}

func (n *nemesis) healNow() error {
	h := n.active
	n.active = nil
	if h == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), healTimeout)
	defer cancel()
	return h(ctx)
}

// runSchedule runs the warm-up and every step of the plan.
func (n *nemesis) runSchedule(ctx context.Context) error {
	n.windows = []stepWindow{{Label: "warm-up", Start: time.Now(), Bound: n.o.ConfirmWindow * nemesisNodes}}
	n.logf("load: %d order API requests a second (new orders, and cancels of recent ones); warm-up %v", n.o.rateOr(nemesisRate), nemesisWarmup)
	if err := harness.Sleep(ctx, nemesisWarmup); err != nil {
		return err
	}
	for i, s := range n.plan {
		desc := s.describe(n.f.names())
		if why := n.srv.can(s.Kind); why != "" {
			n.logf("step %d (%d of %d): %s: SKIPPED (cannot run here: %s)", s.N, i+1, len(n.plan), desc, why)
			continue
		}
		n.logf("step %d (%d of %d): %s", s.N, i+1, len(n.plan), desc)
		if err := n.runStep(ctx, s, desc); err != nil {
			return fmt.Errorf("step %d (%s): %w", s.N, desc, err)
		}
	}
	return nil
}

// runStep runs one step: wait for a converged cluster, inject, hold, heal,
// measure the recovery, rest.
func (n *nemesis) runStep(ctx context.Context, s plannedStep, desc string) error {
	if err := n.f.waitConverged(ctx); err != nil {
		return err
	}
	w := stepWindow{Label: fmt.Sprintf("step %d: %s", s.N, desc), Kind: s.Kind, Start: time.Now(),
		Bound: n.o.ConfirmWindow * s.targets(nemesisNodes)}
	n.windows[len(n.windows)-1].End = w.Start
	n.windows = append(n.windows, w)
	rep := stepReport{plannedStep: s, desc: desc, window: len(n.windows) - 1}
	heal, err := n.inject(ctx, s)
	n.active = heal
	if err != nil {
		return err
	}
	if err := harness.Sleep(ctx, s.Hold); err != nil {
		return err
	}
	if err := n.healNow(); err != nil {
		return fmt.Errorf("heal: %w", err)
	}
	healAt := time.Now()
	n.logf("  healed")
	rec, err := n.recovery(ctx, s, healAt)
	res := stepResult{Kind: s.Kind}
	if err != nil {
		if ferr := n.f.failed(); ferr != nil || ctx.Err() != nil {
			return err
		}
		n.logf("  NOT RECOVERED: %v", err)
	} else {
		res.Recovered, res.Recovery = true, rec
		rep.recovered, rep.recovery = true, rec
		n.windows[rep.window].Quiet = healAt.Add(rec + quietSlack)
		n.logf("  recovered %v after the heal", rec.Round(time.Millisecond))
	}
	n.results = append(n.results, res)
	n.steps = append(n.steps, rep)
	return harness.Sleep(ctx, s.Quiet)
}

// recovery measures how long after healAt the system had delivered every
// message promised before the heal and a probe committed on every
// partition right after it (see docs/reliability.md).
func (n *nemesis) recovery(ctx context.Context, s plannedStep, healAt time.Time) (time.Duration, error) {
	pre := n.load.promisedBefore(healAt)
	probes, err := n.probe(ctx, s.N)
	if err != nil {
		return 0, err
	}
	latest, err := n.hist.waitArrived(ctx, append(pre, probes...), recoveryTimeout, n.f.failed)
	if err != nil {
		return 0, err
	}
	return latest.Sub(healAt), nil
}

// finish waits for every promise and for an empty outbox, stops the nodes
// and the consumer's input, and checks the history.
func (n *nemesis) finish(ctx context.Context) (historyVerdict, error) {
	var errs []error
	end := time.Now()
	n.windows[len(n.windows)-1].End = end.Add(24 * time.Hour)
	n.logf("drain: waiting for every promised message and an empty outbox")
	if _, err := n.hist.waitArrived(ctx, n.load.all(), drainTimeout, n.f.failed); err != nil {
		errs = append(errs, fmt.Errorf("drain: %w", err))
	}
	err := harness.WaitUntil(ctx, drainTimeout, 50*time.Millisecond, "an empty outbox", func() (bool, error) {
		if err := n.f.failed(); err != nil {
			return false, err
		}
		p, err := pending(ctx, n.dbs)
		return p == 0, err
	})
	if err != nil {
		var parked []string
		for _, db := range n.dbs {
			out, _ := n.f.admin(ctx, "parked", "-source", db.name)
			parked = append(parked, db.name+":\n"+out)
		}
		errs = append(errs, fmt.Errorf("drain: %w; node parked says, per source:\n%s", err, strings.Join(parked, "\n")))
	}
	_ = harness.Sleep(ctx, settleAfter)
	if err := n.f.stopNodes(); err != nil {
		errs = append(errs, err)
	}
	last, still := n.hist.count(), time.Now()
	_ = harness.WaitUntil(ctx, 10*time.Second, 100*time.Millisecond, "the queue to go quiet", func() (bool, error) {
		if c := n.hist.count(); c != last {
			last, still = c, time.Now()
		}
		return time.Since(still) > time.Second, nil
	})
	ds, connects := n.hist.history()
	n.logf("history: %d deliveries; the checker's consumer connected %d times", len(ds), connects)
	return checkHistory(ds, n.load.all(), n.skipped, n.windows, sourceNames[:len(n.dbs)]), errors.Join(errs...)
}
