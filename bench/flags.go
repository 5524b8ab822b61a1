package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ordo-relay/ordo/bench/nemesis"
	"github.com/ordo-relay/ordo/internal/envflag"
	"github.com/ordo-relay/ordo/partition"
)

// envPrefix is the prefix of every flag's environment variable:
// ORDO_BENCH_ROWS for -rows.
const envPrefix = "ORDO_BENCH"

// common are the flags every scenario shares. They come before the first
// scenario's name: go run ./bench -quick -node-bin /tmp/node drain.
type common struct {
	PostgresURL   string        // admin URL: the bench creates its databases through it
	AMQPURL       string        // broker; the consumer always connects here directly
	Out           string        // directory for the JSON results
	Partitions    int           // P, given to the node and to outbox.Migrate
	ConfirmWindow int           // W, given to the node
	NodeBin       string        // a prebuilt node binary; empty builds ./cmd/node
	Timeout       time.Duration // bound on every wait of a scenario
	Quick         bool          // smaller defaults for a quick look (quickDefaults)
}

// options are what one scenario runs with: the common flags, and the
// scenario's own, which follow its name on the command line. Each scenario
// registers only the flags it reads (scenario.flags names them, flagDefs
// defines them); a field whose flag it does not register keeps its
// default. Zero scenario-specific values mean "the scenario's default",
// which the scenario's doc states.
type options struct {
	common

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
	ScalePeriod time.Duration // scaleout: CFS period
	Charts      string        // charts: the directory the PNGs go to

	Seed    int64          // nemesis: the schedule's seed (0: drawn and printed)
	Profile string         // nemesis: short (about 2 minutes) or long (10 minutes or more)
	Kinds   []nemesis.Kind // nemesis: the kinds of fault to run (the others' steps are left out of the plan)

	Produce produceOptions // produce: its -produce-* flags (produce.go)
	Consume consumeOptions // consume: its -consume-* flags (consume.go)
	Sources sourcesOptions // sources: its -sources-* flags (sources.go)
}

// defaultOptions returns every default; the flags are registered with
// these values.
func defaultOptions() options {
	return options{
		common: common{
			PostgresURL: "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable",
			AMQPURL:     "amqp://guest:guest@127.0.0.1:5672/", Out: "bench/results",
			Partitions: partition.DefaultCount, ConfirmWindow: 512, Timeout: 10 * time.Minute,
		},
		Rows: 100000, Payload: 300, Analyze: true, Workers: 16,
		Duration: 30 * time.Second, Warmup: 2 * time.Second, Before: 3 * time.Second, Outage: 10 * time.Second,
		Nodes: []int{1}, Instances: []int{1, 2}, Reps: 3, Orders: 5000, RaceInstances: 2, RaceNodes: 3,
		BrokerWindow: 1024, ClassicBatch: 50, ClassicEvery: time.Second,
		FailoverTarget: 3 * time.Second, JoinTarget: 5 * time.Second,
		Shapes: shapeNames(), ShapeLimit: 5 * time.Minute, ShapeSteady: 10 * time.Second,
		ScaleNodes: []int{1, 2, 3, 4}, ScaleCap: 0.05, ScaleShape: []string{"many", "hot"},
		ScaleRows: 40000, ScaleHot: 5000, ScalePeriod: 10 * time.Millisecond, Charts: "docs",
		Profile: nemesis.ProfileShort,
		Produce: defaultProduceOptions(), Consume: defaultConsumeOptions(), Sources: defaultSourcesOptions(),
	}
}

// addCommonFlags registers the common flags on fs.
func addCommonFlags(fs *flag.FlagSet, c *common) {
	fs.StringVar(&c.PostgresURL, "postgres-url", c.PostgresURL, "PostgreSQL admin URL (the bench creates and drops its own databases)")
	fs.StringVar(&c.AMQPURL, "amqp-url", c.AMQPURL, "RabbitMQ URL")
	fs.StringVar(&c.Out, "out", c.Out, "directory for the JSON results")
	fs.IntVar(&c.Partitions, "partitions", c.Partitions, "partition count P")
	fs.IntVar(&c.ConfirmWindow, "confirm-window", c.ConfirmWindow, "the node's confirm window W")
	fs.StringVar(&c.NodeBin, "node-bin", c.NodeBin, "prebuilt node binary (default: go build ./cmd/node)")
	fs.DurationVar(&c.Timeout, "timeout", c.Timeout, "bound on every wait")
	fs.BoolVar(&c.Quick, "quick", c.Quick, "smaller defaults for a quick look: rows 20000, keys 2000, duration 10s, orders 1000, reps 1, "+
		"scale-rows 2000, scale-hot-rows 500, consume-orders 300, consume-latency 3s (a scenario's flags given win)")
}

// listFlag is a flag whose text set parses into a field of options.
type listFlag struct {
	text string
	set  func(string) error
}

func (f *listFlag) String() string {
	if f == nil {
		return ""
	}
	return f.text
}

func (f *listFlag) Set(s string) error {
	if err := f.set(s); err != nil {
		return err
	}
	f.text = s
	return nil
}

// listVar registers a list flag whose default text is def.
func listVar(fs *flag.FlagSet, name, def, usage string, set func(string) error) {
	fs.Var(&listFlag{text: def, set: set}, name, usage)
}

// countsVar registers a flag of comma-separated counts from 1 to 8
// (parseCounts) bound to p, with *p as its default.
func countsVar(fs *flag.FlagSet, name string, p *[]int, usage string) {
	listVar(fs, name, joinInts(*p), usage, func(s string) (err error) {
		*p, err = parseCounts(name, s)
		return err
	})
}

// joinInts is "1,2,3".
func joinInts(ns []int) string {
	s := make([]string, len(ns))
	for i, n := range ns {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ",")
}

// flagDefs defines every scenario flag by name: each registers its flag on
// fs, bound to o's field, with o's value as the default. A scenario's
// flags list names the ones it reads.
var flagDefs = map[string]func(fs *flag.FlagSet, o *options, name string){
	"rows": func(fs *flag.FlagSet, o *options, n string) { fs.IntVar(&o.Rows, n, o.Rows, "messages") },
	"keys": func(fs *flag.FlagSet, o *options, n string) {
		fs.IntVar(&o.Keys, n, o.Keys, "distinct correlation ids (0: the scenario's default)")
	},
	"payload": func(fs *flag.FlagSet, o *options, n string) {
		fs.IntVar(&o.Payload, n, o.Payload, "approximate JSON payload size in bytes")
	},
	"analyze": func(fs *flag.FlagSet, o *options, n string) {
		fs.BoolVar(&o.Analyze, n, o.Analyze, "ANALYZE the outbox after loading it, as autovacuum would soon")
	},
	"rate": func(fs *flag.FlagSet, o *options, n string) {
		fs.IntVar(&o.Rate, n, o.Rate, "commits per second, orders per second in race (0: the scenario's default)")
	},
	"workers": func(fs *flag.FlagSet, o *options, n string) {
		fs.IntVar(&o.Workers, n, o.Workers, "producer goroutines, one connection each")
	},
	"duration": func(fs *flag.FlagSet, o *options, n string) {
		fs.DurationVar(&o.Duration, n, o.Duration, "how long producers run")
	},
	"warmup": func(fs *flag.FlagSet, o *options, n string) {
		fs.DurationVar(&o.Warmup, n, o.Warmup, "commits in this first part of a run are not measured")
	},
	"before": func(fs *flag.FlagSet, o *options, n string) {
		fs.DurationVar(&o.Before, n, o.Before, "steady running before the cut")
	},
	"outage": func(fs *flag.FlagSet, o *options, n string) {
		fs.DurationVar(&o.Outage, n, o.Outage, "how long the broker link stays cut")
	},
	"nodes": func(fs *flag.FlagSet, o *options, n string) {
		countsVar(fs, n, &o.Nodes, "comma-separated Ordo node counts, one run each")
	},
	"instances": func(fs *flag.FlagSet, o *options, n string) {
		countsVar(fs, n, &o.Instances, "comma-separated classic instance counts, one run each; classic-latency uses the first")
	},
	"reps": func(fs *flag.FlagSet, o *options, n string) { fs.IntVar(&o.Reps, n, o.Reps, "repetitions") },
	"orders": func(fs *flag.FlagSet, o *options, n string) {
		fs.IntVar(&o.Orders, n, o.Orders, "orders (two messages each)")
	},
	"race-instances": func(fs *flag.FlagSet, o *options, n string) {
		fs.IntVar(&o.RaceInstances, n, o.RaceInstances, "classic relay instances")
	},
	"race-nodes": func(fs *flag.FlagSet, o *options, n string) { fs.IntVar(&o.RaceNodes, n, o.RaceNodes, "Ordo nodes") },
	"broker-window": func(fs *flag.FlagSet, o *options, n string) {
		fs.IntVar(&o.BrokerWindow, n, o.BrokerWindow, "most unconfirmed publishes in flight")
	},
	"classic-batch": func(fs *flag.FlagSet, o *options, n string) {
		fs.IntVar(&o.ClassicBatch, n, o.ClassicBatch, "classic relay: rows per batch")
	},
	"classic-interval": func(fs *flag.FlagSet, o *options, n string) {
		fs.DurationVar(&o.ClassicEvery, n, o.ClassicEvery, "classic relay: polling interval")
	},
	"failover-target": func(fs *flag.FlagSet, o *options, n string) {
		fs.DurationVar(&o.FailoverTarget, n, o.FailoverTarget, "target")
	},
	"join-target": func(fs *flag.FlagSet, o *options, n string) { fs.DurationVar(&o.JoinTarget, n, o.JoinTarget, "target") },
	"shapes": func(fs *flag.FlagSet, o *options, n string) {
		listVar(fs, n, "all", "comma-separated shapes ("+strings.Join(shapeNames(), ", ")+") or all", func(s string) (err error) {
			o.Shapes, err = parseShapes(s)
			return err
		})
	},
	"shape-limit": func(fs *flag.FlagSet, o *options, n string) {
		fs.DurationVar(&o.ShapeLimit, n, o.ShapeLimit, "a drain not finished by then is reported as incomplete")
	},
	"shape-steady": func(fs *flag.FlagSet, o *options, n string) {
		fs.DurationVar(&o.ShapeSteady, n, o.ShapeSteady, "steady run per shape for the producers' commit latency (0 skips it)")
	},
	"scale-nodes": func(fs *flag.FlagSet, o *options, n string) {
		countsVar(fs, n, &o.ScaleNodes, "comma-separated node counts")
	},
	"scale-cap": func(fs *flag.FlagSet, o *options, n string) {
		fs.Float64Var(&o.ScaleCap, n, o.ScaleCap, "CPU cap per node, in cores")
	},
	"scale-period": func(fs *flag.FlagSet, o *options, n string) {
		fs.DurationVar(&o.ScalePeriod, n, o.ScalePeriod, "CFS period of the caps (raised to fit the kernel's 1 ms minimum quota: 20ms for 0.05 core)")
	},
	"scale-shapes": func(fs *flag.FlagSet, o *options, n string) {
		listVar(fs, n, strings.Join(o.ScaleShape, ","), "many (many keys) and/or hot (10 keys)", func(s string) (err error) {
			o.ScaleShape, err = parseScaleShapes(s)
			return err
		})
	},
	"scale-rows": func(fs *flag.FlagSet, o *options, n string) {
		fs.IntVar(&o.ScaleRows, n, o.ScaleRows, "rows of the many-keys backlog (over rows/10 keys)")
	},
	"scale-hot-rows": func(fs *flag.FlagSet, o *options, n string) {
		fs.IntVar(&o.ScaleHot, n, o.ScaleHot, "rows of the hot-key backlog (over 10 keys)")
	},
	"charts": func(fs *flag.FlagSet, o *options, n string) {
		fs.StringVar(&o.Charts, n, o.Charts, "directory for the PNGs")
	},
	"seed": func(fs *flag.FlagSet, o *options, n string) {
		fs.Int64Var(&o.Seed, n, o.Seed, "seed of the fault schedule (0: draw one and print it)")
	},
	"profile": func(fs *flag.FlagSet, o *options, n string) {
		fs.StringVar(&o.Profile, n, o.Profile, "short (about 2 minutes) or long (10 minutes or more)")
	},
	"kinds": func(fs *flag.FlagSet, o *options, n string) {
		listVar(fs, n, "all", "comma-separated kinds of fault to run, or all", func(s string) (err error) {
			o.Kinds, err = nemesis.ParseKinds(s)
			return err
		})
	},
	"produce-*": func(fs *flag.FlagSet, o *options, _ string) { addProduceFlags(fs, &o.Produce) },
	"consume-*": func(fs *flag.FlagSet, o *options, _ string) { addConsumeFlags(fs, &o.Consume) },
	"sources-*": func(fs *flag.FlagSet, o *options, _ string) { addSourcesFlags(fs, &o.Sources) },
}

// quickDefaults are what -quick changes, by flag name: each applies to a
// scenario that has the flag and was not given it.
var quickDefaults = []struct {
	name string
	set  func(*options)
}{
	{"rows", func(o *options) { o.Rows = 20000 }},
	{"keys", func(o *options) { o.Keys = 2000 }},
	{"duration", func(o *options) { o.Duration = 10 * time.Second }},
	{"orders", func(o *options) { o.Orders = 1000 }},
	{"reps", func(o *options) { o.Reps = 1 }},
	{"scale-rows", func(o *options) { o.ScaleRows = 2000 }},
	{"scale-hot-rows", func(o *options) { o.ScaleHot = 500 }},
	{"consume-orders", func(o *options) { o.Consume.Orders = 300 }},
	{"consume-latency", func(o *options) { o.Consume.Latency = 3 * time.Second }},
}

// invocation is one scenario to run, with its options.
type invocation struct {
	s *scenario
	o options
}

// errNoScenarioFlag is returned for a scenario flag given before any
// scenario's name.
var errNoScenarioFlag = errors.New("a scenario's flags follow its name")

// parseArgs parses go run ./bench's arguments:
//
//	[common flags] [scenario [its flags]]... | all | compare
//
// Without a scenario, compare runs; all runs every scenario but compare
// and nemesis, each with its defaults. Every flag not given is read from
// ORDO_BENCH_<FLAG> (through lookup) when set there.
func parseArgs(args []string, lookup func(string) (string, bool), out io.Writer) ([]invocation, error) {
	base := defaultOptions()
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(out)
	addCommonFlags(fs, &base.common)
	fs.Usage = envflag.Usage(fs, envPrefix, commonUsage())
	if err := envflag.Parse(fs, envPrefix, args, lookup); err != nil {
		return nil, hintScenarioFlag(err)
	}
	args = fs.Args()
	if len(args) == 0 {
		args = []string{compareScenario.name}
	}
	var run []invocation
	for len(args) > 0 {
		name := args[0]
		args = args[1:]
		if name == "all" {
			for i := range scenarios {
				o, _, err := scenarioOptions(&scenarios[i], base, nil, lookup, out)
				if err != nil {
					return nil, err
				}
				run = append(run, invocation{&scenarios[i], o})
			}
			continue
		}
		s := findScenario(name)
		if s == nil {
			return nil, fmt.Errorf("unknown scenario %q (go run ./bench -h lists them)", name)
		}
		o, rest, err := scenarioOptions(s, base, args, lookup, out)
		if err != nil {
			return nil, err
		}
		run = append(run, invocation{s, o})
		args = rest
	}
	return run, nil
}

// scenarioOptions parses s's flags from args, which start right after its
// name, over base (the defaults and the common flags), and returns the
// options and the arguments after s's flags.
func scenarioOptions(s *scenario, base options, args []string, lookup func(string) (string, bool), out io.Writer) (options, []string, error) {
	o := base
	fs := scenarioFlagSet(s, &o, out)
	if err := envflag.Parse(fs, envPrefix, args, lookup); err != nil {
		return o, nil, fmt.Errorf("%s: %w", s.name, err)
	}
	if o.Quick {
		given := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
		for _, q := range quickDefaults {
			if fs.Lookup(q.name) != nil && !given[q.name] {
				q.set(&o)
			}
		}
	}
	if err := o.validate(); err != nil {
		return o, nil, fmt.Errorf("%s: %w", s.name, err)
	}
	return o, fs.Args(), nil
}

// scenarioFlagSet returns a flag set with s's own flags, bound to o.
func scenarioFlagSet(s *scenario, o *options, out io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("bench "+s.name, flag.ContinueOnError)
	fs.SetOutput(out)
	for _, name := range s.flagNames() {
		flagDefs[name](fs, o, name)
	}
	fs.Usage = envflag.Usage(fs, envPrefix, fmt.Sprintf("usage: go run ./bench [common flags] %s [flags] [next scenario [its flags]]...\n\n%s: %s\n\n"+
		"The common flags (go run ./bench -h) come before the first scenario's name.", s.name, s.name, s.summary))
	return fs
}

// flagNames returns the names (keys of flagDefs) of s's flags. compare has
// the flags of every scenario it runs, but -nodes and -instances, which it
// sets itself.
func (s *scenario) flagNames() []string {
	if s != &compareScenario {
		return s.flags
	}
	var names []string
	for _, step := range compareSteps {
		for _, n := range findScenario(step.name).flags {
			if n != "nodes" && n != "instances" && !slices.Contains(names, n) {
				names = append(names, n)
			}
		}
	}
	return names
}

// commonUsage is go run ./bench -h's text before the common flags.
func commonUsage() string {
	var names []string
	for _, s := range append([]scenario{compareScenario, nemesisScenario}, scenarios...) {
		names = append(names, fmt.Sprintf("  %-16s %s", s.name, s.summary))
	}
	return "usage: go run ./bench [common flags] [scenario [its flags]]... | all | compare\n\n" +
		"Without a scenario, compare runs; all runs every scenario below with its defaults.\n" +
		"A scenario's own flags follow its name: go run ./bench <scenario> -h lists them.\n\nScenarios:\n" +
		strings.Join(names, "\n")
}

// hintScenarioFlag adds, to an unknown common flag, that a scenario's
// flags follow its name.
func hintScenarioFlag(err error) error {
	if strings.HasPrefix(err.Error(), "flag provided but not defined") {
		return fmt.Errorf("%w (%w: go run ./bench [common flags] <scenario> [its flags])", err, errNoScenarioFlag)
	}
	return err
}
