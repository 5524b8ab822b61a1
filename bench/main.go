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
//	orders           orders through the order API at a fixed rate: the API's answer time and 201 to delivery
//	race             OrderPlaced then OrderCancelled: how many arrive reversed, classic vs Ordo
//	failover         kill -9 of one of 3 nodes under load: seconds until its partitions publish again
//	join             a 3rd node joins 2 under load: seconds until it publishes on all its partitions
//	produce          the producers' side: Ordo's outbox INSERT against a classic outbox table, tps, commit latency, PG CPU, WAL
//	sources          one outbox database against two, each on a CPU-capped PostgreSQL cluster of its own: drain and insert ratios
//
// The nemesis, which restarts the shared servers, is a command of its own:
// go run ./bench/cmd/nemesis (docs/reliability.md).
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
	"syscall"

	"github.com/ordo-relay/ordo/bench/internal/charts"
	"github.com/ordo-relay/ordo/bench/internal/consume"
	"github.com/ordo-relay/ordo/bench/internal/drain"
	"github.com/ordo-relay/ordo/bench/internal/measure"
	"github.com/ordo-relay/ordo/bench/internal/produce"
	"github.com/ordo-relay/ordo/bench/internal/shapes"
	"github.com/ordo-relay/ordo/bench/internal/sources"
	"github.com/ordo-relay/ordo/bench/internal/steady"

	"github.com/ordo-relay/ordo/bench/internal/result"
	"github.com/ordo-relay/ordo/internal/childproc"
)

// scenario is one benchmark. run owns everything it creates and removes it
// before returning, on error and cancellation too. It hands every result
// to emit as soon as it has it (a scenario may produce several: one per
// node count, say) and returns the first error that stopped it.
type scenario struct {
	name    string
	summary string
	// options returns a fresh copy of the scenario's defaults, a pointer
	// to its own options type (next to its run function), with zero common
	// flags.
	options func() settings
	// run runs the scenario with options from its options func.
	run func(ctx context.Context, o settings, emit func(*result.Result)) error
}

// settings is a scenario's options: a pointer to its own options type,
// which embeds the common flags and has the scenario's own.
type settings interface {
	// Base returns the common flags (promoted from the embedded measure.Common).
	Base() *measure.Common
	// AddFlags registers the scenario's own flags on fs, bound to the
	// options' fields, with their values as defaults.
	AddFlags(fs *flag.FlagSet)
	// Validate reports every one of the scenario's own flags out of range.
	Validate() error
}

// newScenario makes a scenario whose options are of type O, starting from
// defaults(), and run by run.
func newScenario[O any, P interface {
	*O
	settings
}](name, summary string, defaults func() O, run func(context.Context, O, func(*result.Result)) error) scenario {
	return scenario{name: name, summary: summary,
		options: func() settings { o := defaults(); return P(&o) },
		run: func(ctx context.Context, o settings, emit func(*result.Result)) error {
			return run(ctx, *o.(P), emit)
		},
	}
}

// scenarios is every scenario, in the order "all" runs them. compare is
// kept out of "all": it runs most of the others itself.
var scenarios = []scenario{
	newScenario("drain", "a backlog of pending rows drained by -nodes Ordo nodes: msgs/s, node RSS", drain.DefaultOptions, drain.Run),
	newScenario("outage", "broker link cut under a steady producer: seconds to resume and to drain the backlog", steady.DefaultOutageOptions, steady.RunOutage),
	newScenario("latency", "commit-to-delivery latency at a fixed commit rate: p50, p99, max", steady.DefaultLatencyOptions, steady.RunLatency),
	newScenario("broker", "a bare publisher with pipelined confirms and no database: the broker's ceiling in msgs/s", drain.DefaultBrokerOptions, drain.RunBroker),
	newScenario("classic", "the article's relay (50 oldest rows a second, one confirm at a time) as -instances instances: msgs/s", drain.DefaultClassicOptions, drain.RunClassic),
	newScenario("classic-latency", "the classic relay's commit-to-delivery latency at the latency scenario's rate", steady.DefaultClassicLatencyOptions, steady.RunClassicLatency),
	newScenario("orders", "orders placed through the order API with one node relaying: orders/s reached, the API's answer time, 201 to delivery, CPU per process", steady.DefaultOrdersOptions, steady.RunOrders),
	newScenario("race", "OrderPlaced then OrderCancelled per order: reversed arrivals, classic (2 instances) vs Ordo (3 nodes)", steady.DefaultRaceOptions, steady.RunRace),
	newScenario("failover", "kill -9 of one of 3 nodes under load: seconds until its partitions publish again", steady.DefaultFailoverOptions, steady.RunFailover),
	newScenario("join", "a 3rd node joins 2 under load: seconds until it publishes on each of its partitions", steady.DefaultJoinOptions, steady.RunJoin),
	newScenario("shapes", "classic vs Ordo in every backlog shape, with and without ANALYZE: msgs/s, ratios, whole cost per message", shapes.DefaultOptions, shapes.Run),
	newScenario("scaleout", "1..4 Ordo nodes, each capped to -scale-cap of a core in a CPU cgroup: msgs/s, efficiency, server busy", shapes.DefaultScaleoutOptions, shapes.RunScaleout),
	newScenario("consume", "inbox consumers, 1..3 instances: ordered handling msgs/s and commit-to-handled latency, vs competing consumers", consume.DefaultOptions, consume.Run),
	newScenario("produce", "producers' cost: Ordo's outbox INSERT (plain SQL, Enqueue) vs a classic outbox table and a trigger-less one: tps, commit p50/p99, PG CPU and WAL per message", produce.DefaultOptions, produce.Run),
	newScenario("sources", "one outbox database against two, each on a PostgreSQL cluster of the bench's own capped to -sources-cap of a core: drain msg/s and insert tps, ratios two ÷ one (root)", sources.DefaultOptions, sources.Run),
	newScenario("charts", "draw the PNG charts (scale-out, shapes, latency) from the newest results under -out into -charts", charts.DefaultOptions, charts.Run),
}

// compareScenario is the default: see runCompare. Its flags are those of
// the scenarios it runs (compareOptions).
var compareScenario = newScenario("compare", "broker, classic, drain, latency, race, failover and join in one go, with a table of ratios",
	defaultCompareOptions, runCompare)

// allScenarios is compare and then every scenario of all.
func allScenarios() []*scenario {
	out := []*scenario{&compareScenario}
	for i := range scenarios {
		out = append(out, &scenarios[i])
	}
	return out
}

func findScenario(name string) *scenario {
	for _, s := range allScenarios() {
		if s.name == name {
			return s
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
	childproc.RemoveBinaries()
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
		out := inv.o.Base().Out
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
