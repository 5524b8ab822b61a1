// Command bench measures Ordo end to end against the real PostgreSQL and
// RabbitMQ: the node binary relays outbox rows from a database of the
// bench's own to an exchange of its own, and a consumer checks every
// delivery for loss and per-key order while timing it.
//
//	go run ./bench [common flags] [scenario [its flags]]...
//
// The common flags (servers, node binary, output directory, -quick) come
// first; each scenario's own flags follow its name, and
// go run ./bench <scenario> -h lists them: go run ./bench -quick drain
// -nodes 1,2 latency -rate 500.
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
//	sources          one outbox database against two, each on a CPU-capped PostgreSQL cluster of its own: drain and insert ratios
//	nemesis          3 nodes and the order API under a seeded schedule of faults, checked from the deliveries (never in all or compare: it restarts the servers)
//
// Every flag also reads ORDO_BENCH_<FLAG> (e.g. ORDO_BENCH_ROWS) when not
// given (a scenario's flag only in the scenarios that have it). Each
// scenario prints a table, one "RESULT key=value ..." line and the
// checker's counts, and writes every figure to a JSON file under -out.
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
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/ordo-relay/ordo/bench/internal/result"
	"github.com/ordo-relay/ordo/bench/nemesis"
	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/partition"
)

// scenario is one benchmark. run owns everything it creates and removes it
// before returning, on error and cancellation too. It hands every result
// to emit as soon as it has it (a scenario may produce several: one per
// node count, say) and returns the first error that stopped it.
type scenario struct {
	name    string
	summary string
	flags   []string // its own flags: keys of flagDefs (flags.go)
	run     func(ctx context.Context, o options, emit func(*result.Result)) error
}

// scenarios is every scenario, in the order "all" runs them. compare is
// kept out of "all": it runs most of the others itself.
var scenarios = []scenario{
	{"drain", "a backlog of pending rows drained by -nodes Ordo nodes: msgs/s, node RSS", []string{"rows", "keys", "payload", "analyze", "nodes"}, runDrain},
	{"outage", "broker link cut under a steady producer: seconds to resume and to drain the backlog", []string{"keys", "payload", "rate", "workers", "before", "outage"}, runOutage},
	{"latency", "commit-to-delivery latency at a fixed commit rate: p50, p99, max", []string{"keys", "payload", "rate", "workers", "duration", "warmup"}, runLatency},
	{"broker", "a bare publisher with pipelined confirms and no database: the broker's ceiling in msgs/s", []string{"rows", "keys", "payload", "broker-window"}, runBroker},
	{"classic", "the article's relay (50 oldest rows a second, one confirm at a time) as -instances instances: msgs/s", []string{"rows", "keys", "payload", "analyze", "instances", "classic-batch", "classic-interval"}, runClassic},
	{"classic-latency", "the classic relay's commit-to-delivery latency at the latency scenario's rate", []string{"keys", "payload", "rate", "workers", "duration", "warmup", "instances", "classic-batch", "classic-interval"}, runClassicLatency},
	{"race", "OrderPlaced then OrderCancelled per order: reversed arrivals, classic (2 instances) vs Ordo (3 nodes)", []string{"orders", "race-instances", "race-nodes", "payload", "rate", "workers", "classic-batch", "classic-interval"}, runRace},
	{"failover", "kill -9 of one of 3 nodes under load: seconds until its partitions publish again", []string{"keys", "payload", "rate", "workers", "reps", "failover-target"}, runFailover},
	{"join", "a 3rd node joins 2 under load: seconds until it publishes on each of its partitions", []string{"keys", "payload", "rate", "workers", "reps", "join-target"}, runJoin},
	{"shapes", "classic vs Ordo in every backlog shape, with and without ANALYZE: msgs/s, ratios, whole cost per message", []string{"shapes", "shape-limit", "shape-steady", "payload", "workers", "rate", "warmup", "classic-batch", "classic-interval"}, runShapes},
	{"scaleout", "1..4 Ordo nodes, each capped to -scale-cap of a core in a CPU cgroup: msgs/s, efficiency, server busy", []string{"scale-nodes", "scale-cap", "scale-period", "scale-shapes", "scale-rows", "scale-hot-rows", "payload"}, runScaleout},
	{"consume", "inbox consumers, 1..3 instances: ordered handling msgs/s and commit-to-handled latency, vs competing consumers", []string{"workers", "consume-*"}, runConsume},
	{"produce", "producers' cost: Ordo's outbox INSERT (plain SQL, Enqueue) vs a classic outbox table and a trigger-less one: tps, commit p50/p99, PG CPU and WAL per message", []string{"payload", "keys", "produce-*"}, runProduce},
	{"sources", "one outbox database against two, each on a PostgreSQL cluster of the bench's own capped to -sources-cap of a core: drain msg/s and insert tps, ratios two ÷ one (root)", []string{"payload", "sources-*"}, runSources},
	{"charts", "draw the PNG charts (scale-out, shapes, latency) from the newest results under -out into -charts", []string{"charts"}, runCharts},
}

// nemesisScenario is run only by name: it restarts the shared servers, so
// neither all nor compare runs it. It is the nemesis command
// (bench/cmd/nemesis) under the bench's flags.
var nemesisScenario = scenario{"nemesis",
	"3 nodes and the order API under a seeded schedule of faults, checked from the deliveries (go run ./bench/cmd/nemesis)",
	[]string{"rate", "seed", "profile", "kinds"},
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
// Its flags are those of the scenarios it runs (scenario.flagNames).
var compareScenario = scenario{"compare", "broker, classic, drain, latency, race, failover and join in one go, with a table of ratios", nil, runCompare}

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
	if err := o.Consume.validate(); err != nil {
		return err
	}
	if err := o.Sources.validate(); err != nil {
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
	invs, err := parseArgs(os.Args[1:], os.LookupEnv, os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	code := run(ctx, invs)
	stop()
	testkit.RemoveBinaries()
	os.Exit(code)
}

// run runs the scenarios in order and returns the exit status.
func run(ctx context.Context, invs []invocation) int {
	code := 0
	for _, inv := range invs {
		if ctx.Err() != nil {
			fmt.Fprintln(os.Stderr, "bench: interrupted")
			return 1
		}
		out := inv.o.Out
		emit := func(res *result.Result) {
			if !report(res, out) {
				code = 1
			}
		}
		s := inv.s
		fmt.Printf("\n=== %s: %s\n", s.name, s.summary)
		if err := s.run(ctx, inv.o, emit); err != nil {
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
