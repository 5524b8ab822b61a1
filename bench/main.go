// Command bench measures Ordo end to end against the real PostgreSQL and
// RabbitMQ: the node binary relays outbox rows from a database of the
// bench's own to an exchange of its own, and a consumer checks every
// delivery for loss and per-key order while timing it.
//
//	go run ./bench [flags] scenario...
//
// Scenarios (see docs/bench.md for what each measures):
//
//	compare          all of the below that compare Ordo with the broker and the classic design, and a table of ratios (the default)
//	drain            a backlog of -rows pending rows, drained by -nodes Ordo nodes
//	outage           a steady producer while the node's broker link is cut and restored
//	latency          commit-to-delivery latency at a fixed commit rate
//	broker           a bare publisher with pipelined confirms: the broker's ceiling
//	classic          the article's relay (50 rows a second, one confirm at a time) draining the same backlog
//	classic-latency  the classic relay's commit-to-delivery latency
//	race             OrderPlaced then OrderCancelled: how many arrive reversed, classic vs Ordo
//	failover         kill -9 of one of 3 nodes under load: seconds until its partitions publish again
//	join             a 3rd node joins 2 under load: seconds until it publishes on all its partitions
//	produce          the producers' side: Ordo's outbox INSERT against a classic outbox table, tps, commit latency, PG CPU, WAL
//	nemesis          3 nodes and the order API under a seeded schedule of faults, checked from the deliveries (never in all or compare: it restarts the servers)
//
// Every flag also reads ORDO_BENCH_<FLAG> (e.g. ORDO_BENCH_ROWS) when not
// given. Each scenario prints a table, one "RESULT key=value ..." line and
// the checker's counts, and writes every figure to a JSON file under -out.
// The exit status is 1 when a scenario failed or the checker found a lost,
// reordered or skipped message (reorders of the classic baseline are
// expected and only reported).
//
// Each scenario creates and drops its own database (ordo_bench_*) and
// exchange and queue (ordo_bench_*). A bench killed with SIGKILL leaves its
// database behind; drop it by hand.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/ordo-relay/ordo/bench/internal/result"
	"github.com/ordo-relay/ordo/bench/nemesis"
	"github.com/ordo-relay/ordo/internal/envflag"
	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/partition"
)

// options are the bench's flags. Zero scenario-specific values mean "the
// scenario's default", which the scenario's doc states.
type options struct {
	PostgresURL   string        // admin URL: the bench creates its databases through it
	AMQPURL       string        // broker; the consumer always connects here directly
	Out           string        // directory for the JSON results
	Partitions    int           // P, given to the node and to outbox.Migrate
	ConfirmWindow int           // W, given to the node
	NodeBin       string        // a prebuilt node binary; empty builds ./cmd/node
	Timeout       time.Duration // bound on every wait of a scenario

	Rows     int           // drain, classic, broker: messages
	Keys     int           // distinct correlation ids (0: the scenario's default)
	Payload  int           // approximate payload size in bytes
	Analyze  bool          // drain, classic: ANALYZE the outbox after loading it
	Rate     int           // outage, latency, failover, join: commits per second; race: orders per second (0: the scenario's default)
	Workers  int           // producer goroutines (connections)
	Duration time.Duration // latency: how long producers run
	Warmup   time.Duration // latency: commits in this first part are not measured
	Before   time.Duration // outage: steady running before the cut
	Outage   time.Duration // outage: how long the broker link stays cut

	Nodes          []int         // drain: node counts, one run each
	Instances      []int         // classic: instance counts, one run each; classic-latency uses the first
	Reps           int           // failover, join: repetitions
	Orders         int           // race: orders
	RaceInstances  int           // race: classic instances
	RaceNodes      int           // race: Ordo nodes
	BrokerWindow   int           // broker: unconfirmed publishes in flight
	ClassicBatch   int           // classic: rows per batch
	ClassicEvery   time.Duration // classic: polling interval
	Quick          bool          // smaller defaults for a quick look
	FailoverTarget time.Duration // failover: the target the figures are judged against
	JoinTarget     time.Duration // join: the target the figures are judged against

	Shapes      []string      // shapes: the shapes to run (see shapeDefs)
	ShapeLimit  time.Duration // shapes: a drain not finished by then is reported as incomplete
	ShapeSteady time.Duration // shapes: the steady run per shape (commit latency); 0 skips it

	ScaleNodes  []int         // scaleout: node counts
	ScaleCap    float64       // scaleout: CPU cap per node, in cores
	ScaleShape  []string      // scaleout: many, hot
	ScaleRows   int           // scaleout: rows of the many-keys backlog
	ScaleHot    int           // scaleout: rows of the hot-key (10 keys) backlog
	Charts      string        // charts: the directory the PNGs go to
	ScalePeriod time.Duration // scaleout: CFS period

	Seed    int64          // nemesis: the schedule's seed (0: drawn and printed)
	Profile string         // nemesis: short (about 2 minutes) or long (10 minutes or more)
	Kinds   []nemesis.Kind // nemesis: the kinds of fault to run (the others' steps are left out of the plan)

	Produce produceOptions // produce: its flags (produce.go)
}

// scenario is one benchmark. run owns everything it creates and removes it
// before returning, on error and cancellation too. It hands every result
// to emit as soon as it has it (a scenario may produce several: one per
// node count, say) and returns the first error that stopped it.
type scenario struct {
	name    string
	summary string
	run     func(ctx context.Context, o options, emit func(*result.Result)) error
}

// scenarios is every scenario, in the order "all" runs them. compare is
// kept out of "all": it runs most of the others itself.
var scenarios = []scenario{
	{"drain", "a backlog of pending rows drained by -nodes Ordo nodes: msgs/s, node RSS", runDrain},
	{"outage", "broker link cut under a steady producer: seconds to resume and to drain the backlog", runOutage},
	{"latency", "commit-to-delivery latency at a fixed commit rate: p50, p99, max", runLatency},
	{"broker", "a bare publisher with pipelined confirms and no database: the broker's ceiling in msgs/s", runBroker},
	{"classic", "the article's relay (50 oldest rows a second, one confirm at a time) as -instances instances: msgs/s", runClassic},
	{"classic-latency", "the classic relay's commit-to-delivery latency at the latency scenario's rate", runClassicLatency},
	{"race", "OrderPlaced then OrderCancelled per order: reversed arrivals, classic (2 instances) vs Ordo (3 nodes)", runRace},
	{"failover", "kill -9 of one of 3 nodes under load: seconds until its partitions publish again", runFailover},
	{"join", "a 3rd node joins 2 under load: seconds until it publishes on each of its partitions", runJoin},
	{"shapes", "classic vs Ordo in every backlog shape, with and without ANALYZE: msgs/s, ratios, whole cost per message", runShapes},
	{"scaleout", "1..4 Ordo nodes, each capped to -scale-cap of a core in a CPU cgroup: msgs/s, efficiency, server busy", runScaleout},
	{"consume", "inbox consumers, 1..3 instances: ordered handling msgs/s and commit-to-handled latency, vs competing consumers", runConsume},
	{"produce", "producers' cost: Ordo's outbox INSERT (plain SQL, Enqueue) vs a classic outbox table and a trigger-less one: tps, commit p50/p99, PG CPU and WAL per message", runProduce},
	{"charts", "draw the PNG charts (scale-out, shapes, latency) from the newest results under -out into -charts", runCharts},
}

// nemesisScenario is run only by name: it restarts the shared servers, so
// neither all nor compare runs it. It is the nemesis command
// (bench/cmd/nemesis) under the bench's flags.
var nemesisScenario = scenario{"nemesis",
	"3 nodes and the order API under a seeded schedule of faults, checked from the deliveries (go run ./bench/cmd/nemesis)",
	func(ctx context.Context, o options, _ func(*result.Result)) error {
		return nemesis.Run(ctx, o.nemesis())
	}}

// nemesis returns the nemesis's settings from the bench's flags.
func (o options) nemesis() nemesis.Config {
	return nemesis.Config{PostgresURL: o.PostgresURL, AMQPURL: o.AMQPURL, Out: o.Out, Partitions: o.Partitions,
		ConfirmWindow: o.ConfirmWindow, NodeBin: o.NodeBin, Timeout: o.Timeout, Rate: o.Rate,
		Seed: o.Seed, Scenario: nemesis.ScenarioRelay, Profile: o.Profile, Kinds: o.Kinds}
}

// compareScenario is the default: see runCompare.
var compareScenario = scenario{"compare", "broker, classic, drain, latency, race, failover and join in one go, with a table of ratios", runCompare}

func parseOptions(args []string, lookup func(string) (string, bool), out io.Writer) (options, []string, error) {
	var o options
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.StringVar(&o.PostgresURL, "postgres-url", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable", "PostgreSQL admin URL (the bench creates and drops its own databases)")
	fs.StringVar(&o.AMQPURL, "amqp-url", "amqp://guest:guest@127.0.0.1:5672/", "RabbitMQ URL")
	fs.StringVar(&o.Out, "out", "bench/results", "directory for the JSON results")
	fs.IntVar(&o.Partitions, "partitions", partition.DefaultCount, "partition count P")
	fs.IntVar(&o.ConfirmWindow, "confirm-window", 512, "the node's confirm window W")
	fs.StringVar(&o.NodeBin, "node-bin", "", "prebuilt node binary (default: go build ./cmd/node)")
	fs.DurationVar(&o.Timeout, "timeout", 10*time.Minute, "bound on every wait")
	fs.IntVar(&o.Rows, "rows", 100000, "drain, classic, broker: messages")
	fs.IntVar(&o.Keys, "keys", 0, "distinct correlation ids (0: drain, classic, broker, latency 10000; outage, failover, join 1000)")
	fs.IntVar(&o.Payload, "payload", 300, "approximate JSON payload size in bytes")
	fs.BoolVar(&o.Analyze, "analyze", true, "drain, classic: ANALYZE the outbox after loading it, as autovacuum would soon")
	fs.IntVar(&o.Rate, "rate", 0, "commits per second (0: outage, failover, join 500, latency 1000); race: orders per second (0: 250)")
	fs.IntVar(&o.Workers, "workers", 16, "producer goroutines, one connection each")
	fs.DurationVar(&o.Duration, "duration", 30*time.Second, "latency: how long producers run")
	fs.DurationVar(&o.Warmup, "warmup", 2*time.Second, "latency: commits in this first part are not measured")
	fs.DurationVar(&o.Before, "before", 3*time.Second, "outage: steady running before the cut")
	fs.DurationVar(&o.Outage, "outage", 10*time.Second, "outage: how long the broker link stays cut")
	nodes := fs.String("nodes", "1", "drain: comma-separated Ordo node counts, one run each (compare: 1,2,3)")
	instances := fs.String("instances", "1,2", "classic: comma-separated instance counts, one run each; classic-latency uses the first")
	fs.IntVar(&o.Reps, "reps", 3, "failover, join: repetitions")
	fs.IntVar(&o.Orders, "orders", 5000, "race: orders (two messages each)")
	fs.IntVar(&o.RaceInstances, "race-instances", 2, "race: classic relay instances")
	fs.IntVar(&o.RaceNodes, "race-nodes", 3, "race: Ordo nodes")
	fs.IntVar(&o.BrokerWindow, "broker-window", 1024, "broker: most unconfirmed publishes in flight")
	fs.IntVar(&o.ClassicBatch, "classic-batch", 50, "classic: rows per batch")
	fs.DurationVar(&o.ClassicEvery, "classic-interval", time.Second, "classic: polling interval")
	fs.BoolVar(&o.Quick, "quick", false, "smaller defaults for a quick look: rows 20000, keys 2000, duration 10s, orders 1000, reps 1 (flags given win)")
	fs.DurationVar(&o.FailoverTarget, "failover-target", 3*time.Second, "failover: target")
	fs.DurationVar(&o.JoinTarget, "join-target", 5*time.Second, "join: target")
	shapes := fs.String("shapes", "all", "shapes: comma-separated shapes ("+strings.Join(shapeNames(), ", ")+") or all")
	fs.DurationVar(&o.ShapeLimit, "shape-limit", 5*time.Minute, "shapes: a drain not finished by then is reported as incomplete")
	fs.DurationVar(&o.ShapeSteady, "shape-steady", 10*time.Second, "shapes: steady run per shape for the producers' commit latency (0 skips it)")
	scaleNodes := fs.String("scale-nodes", "1,2,3,4", "scaleout: comma-separated node counts")
	fs.Float64Var(&o.ScaleCap, "scale-cap", 0.05, "scaleout: CPU cap per node, in cores")
	fs.DurationVar(&o.ScalePeriod, "scale-period", 10*time.Millisecond, "scaleout: CFS period of the caps (raised to fit the kernel's 1 ms minimum quota: 20ms for 0.05 core)")
	scaleShapes := fs.String("scale-shapes", "many,hot", "scaleout: many (many keys) and/or hot (10 keys)")
	fs.IntVar(&o.ScaleRows, "scale-rows", 40000, "scaleout: rows of the many-keys backlog (over rows/10 keys)")
	fs.IntVar(&o.ScaleHot, "scale-hot-rows", 5000, "scaleout: rows of the hot-key backlog (over 10 keys)")
	fs.StringVar(&o.Charts, "charts", "docs", "charts: directory for the PNGs")
	fs.Int64Var(&o.Seed, "seed", 0, "nemesis: seed of the fault schedule (0: draw one and print it)")
	fs.StringVar(&o.Profile, "profile", "short", "nemesis: short (about 2 minutes) or long (10 minutes or more)")
	kinds := fs.String("kinds", "all", "nemesis: comma-separated kinds of fault to run, or all")
	produceLists := addProduceFlags(fs, &o.Produce)

	var names []string
	for _, s := range append([]scenario{compareScenario, nemesisScenario}, scenarios...) {
		names = append(names, fmt.Sprintf("  %-16s %s", s.name, s.summary))
	}
	fs.Usage = envflag.Usage(fs, "ORDO_BENCH", "usage: go run ./bench [flags] [scenario... | all | compare]\n\nWithout a scenario, compare runs.\n\nScenarios:\n"+strings.Join(names, "\n"))
	if err := envflag.Parse(fs, "ORDO_BENCH", args, lookup); err != nil {
		return o, nil, err
	}
	var err error
	if o.Nodes, err = parseCounts("nodes", *nodes); err != nil {
		return o, nil, err
	}
	if o.Instances, err = parseCounts("instances", *instances); err != nil {
		return o, nil, err
	}
	if o.Shapes, err = parseShapes(*shapes); err != nil {
		return o, nil, err
	}
	if o.ScaleNodes, err = parseCounts("scale-nodes", *scaleNodes); err != nil {
		return o, nil, err
	}
	if o.ScaleShape, err = parseScaleShapes(*scaleShapes); err != nil {
		return o, nil, err
	}
	if o.Kinds, err = nemesis.ParseKinds(*kinds); err != nil {
		return o, nil, err
	}
	if err := produceLists(); err != nil {
		return o, nil, err
	}
	if o.Quick {
		given := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
		for _, q := range []struct {
			name string
			set  func()
		}{
			{"rows", func() { o.Rows = 20000 }},
			{"keys", func() { o.Keys = 2000 }},
			{"duration", func() { o.Duration = 10 * time.Second }},
			{"orders", func() { o.Orders = 1000 }},
			{"reps", func() { o.Reps = 1 }},
			{"scale-rows", func() { o.ScaleRows = 2000 }},
			{"scale-hot-rows", func() { o.ScaleHot = 500 }},
		} {
			if !given[q.name] {
				q.set()
			}
		}
	}
	var run []string
	args = fs.Args()
	if len(args) == 0 {
		args = []string{compareScenario.name}
	}
	for _, a := range args {
		if a == "all" {
			for _, s := range scenarios {
				run = append(run, s.name)
			}
			continue
		}
		if findScenario(a) == nil {
			return o, nil, fmt.Errorf("unknown scenario %q", a)
		}
		run = append(run, a)
	}
	return o, run, o.validate()
}

// parseCounts parses "1,2,3" into positive counts of at most 8.
func parseCounts(flagName, s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > 8 {
			return nil, fmt.Errorf("-%s %q: want comma-separated counts from 1 to 8", flagName, s)
		}
		out = append(out, n)
	}
	return out, nil
}

func (o options) validate() error {
	switch {
	case o.ConfirmWindow < 1 || o.ConfirmWindow > 65535:
		return fmt.Errorf("confirm-window %d out of range 1..65535", o.ConfirmWindow)
	case o.BrokerWindow < 1 || o.BrokerWindow > 65535:
		return fmt.Errorf("broker-window %d out of range 1..65535", o.BrokerWindow)
	case o.Rows < 1:
		return fmt.Errorf("rows %d must be positive", o.Rows)
	case o.Keys < 0 || o.Rate < 0:
		return errors.New("keys and rate must not be negative")
	case o.Payload < 0 || o.Payload > 1<<20:
		return fmt.Errorf("payload %d out of range 0..1MiB", o.Payload)
	case o.Workers < 1 || o.Workers > 32:
		return fmt.Errorf("workers %d out of range 1..32", o.Workers)
	case o.Timeout <= 0 || o.Duration <= 0 || o.Warmup < 0 || o.Before < 0 || o.Outage <= 0:
		return errors.New("timeout, duration and outage must be positive; warmup and before not negative")
	case o.Warmup >= o.Duration:
		return fmt.Errorf("warmup %v must be shorter than duration %v", o.Warmup, o.Duration)
	case o.Reps < 1 || o.Reps > 20:
		return fmt.Errorf("reps %d out of range 1..20", o.Reps)
	case o.Orders < 1:
		return fmt.Errorf("orders %d must be positive", o.Orders)
	case o.RaceInstances < 1 || o.RaceInstances > 8 || o.RaceNodes < 1 || o.RaceNodes > 8:
		return errors.New("race-instances and race-nodes must be 1..8")
	case o.ClassicBatch < 1 || o.ClassicEvery <= 0:
		return errors.New("classic-batch and classic-interval must be positive")
	case o.ShapeLimit < 0 || o.ShapeSteady < 0:
		return errors.New("shape-limit and shape-steady must not be negative")
	case o.ScaleCap <= 0 || o.ScaleCap > 2 || o.ScalePeriod < time.Millisecond || o.ScalePeriod > time.Second:
		return errors.New("scale-cap must be in (0, 2] cores and scale-period in [1ms, 1s]")
	case o.ScaleRows < 10 || o.ScaleHot < 10:
		return errors.New("scale-rows and scale-hot-rows must be at least 10")
	case o.Profile != nemesis.ProfileShort && o.Profile != nemesis.ProfileLong:
		return fmt.Errorf("profile %q: want %s or %s", o.Profile, nemesis.ProfileShort, nemesis.ProfileLong)
	}
	if err := o.Produce.validate(); err != nil {
		return err
	}
	return partition.ValidateCount(o.Partitions)
}

// keysOr returns -keys, or def when it was left at 0.
func (o options) keysOr(def int) int {
	if o.Keys > 0 {
		return o.Keys
	}
	return def
}

// rateOr returns -rate, or def when it was left at 0.
func (o options) rateOr(def int) int {
	if o.Rate > 0 {
		return o.Rate
	}
	return def
}

func findScenario(name string) *scenario {
	if name == compareScenario.name {
		return &compareScenario
	}
	if name == nemesisScenario.name {
		return &nemesisScenario
	}
	for i := range scenarios {
		if scenarios[i].name == name {
			return &scenarios[i]
		}
	}
	return nil
}

func main() {
	o, names, err := parseOptions(os.Args[1:], os.LookupEnv, os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	code := run(ctx, o, names)
	stop()
	testkit.RemoveBinaries()
	os.Exit(code)
}

// run runs the named scenarios in order and returns the exit status.
func run(ctx context.Context, o options, names []string) int {
	code := 0
	emit := func(res *result.Result) {
		if !report(res, o.Out) {
			code = 1
		}
	}
	for _, name := range names {
		if ctx.Err() != nil {
			fmt.Fprintln(os.Stderr, "bench: interrupted")
			return 1
		}
		s := findScenario(name)
		fmt.Printf("\n=== %s: %s\n", s.name, s.summary)
		if err := s.run(ctx, o, emit); err != nil {
			fmt.Fprintf(os.Stderr, "bench: %s: %v\n", s.name, err)
			code = 1
		}
	}
	return code
}

// report prints res and writes its JSON under dir. It reports false when
// the JSON could not be written or the checker found a problem the result
// does not expect.
func report(res *result.Result, dir string) bool {
	res.Print(os.Stdout)
	ok := res.Passed()
	path, err := res.WriteJSON(dir)
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench: %s: %v\n", res.Scenario, err)
		return false
	}
	fmt.Printf("results written to %s\n", path)
	return ok
}
