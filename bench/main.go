// Command bench measures Ordo end to end against the real PostgreSQL and
// RabbitMQ: the node binary relays outbox rows from a database of the
// bench's own to an exchange of its own, and a consumer checks every
// delivery for loss and per-key order while timing it.
//
//	go run ./bench [flags] scenario...
//
// Scenarios (see docs/bench.md for what each measures):
//
//	drain    a backlog of -rows pending rows, drained by one node
//	outage   a steady producer while the node's broker link is cut and restored
//	latency  commit-to-delivery latency at a fixed commit rate
//
// Every flag also reads ORDO_BENCH_<FLAG> (e.g. ORDO_BENCH_ROWS) when not
// given. Each scenario prints a table, one "RESULT key=value ..." line and
// the checker's counts, and writes every figure to a JSON file under -out.
// The exit status is 1 when a scenario failed or the checker found a lost,
// reordered or skipped message.
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
	"strings"
	"syscall"
	"time"

	"github.com/ordo-relay/ordo/internal/envflag"
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

	Rows     int           // drain: pending rows
	Keys     int           // distinct correlation ids (0: the scenario's default)
	Payload  int           // approximate payload size in bytes
	Analyze  bool          // drain: ANALYZE the outbox after loading it
	Rate     int           // outage, latency: commits per second (0: the scenario's default)
	Workers  int           // outage, latency: producer goroutines (connections)
	Duration time.Duration // latency: how long producers run
	Warmup   time.Duration // latency: commits in this first part are not measured
	Before   time.Duration // outage: steady running before the cut
	Outage   time.Duration // outage: how long the broker link stays cut
}

// scenario is one benchmark. run owns everything it creates and removes it
// before returning, on error and cancellation too.
type scenario struct {
	name    string
	summary string
	run     func(ctx context.Context, o options) (*Result, error)
}

// scenarios is every scenario, in the order "all" runs them.
var scenarios = []scenario{
	{"drain", "a backlog of pending rows drained by one node: msgs/s, node RSS", runDrain},
	{"outage", "broker link cut under a steady producer: seconds to resume and to drain the backlog", runOutage},
	{"latency", "commit-to-delivery latency at a fixed commit rate: p50, p99, max", runLatency},
}

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
	fs.IntVar(&o.Rows, "rows", 100000, "drain: pending rows")
	fs.IntVar(&o.Keys, "keys", 0, "distinct correlation ids (0: drain 10000, outage 1000, latency 10000)")
	fs.IntVar(&o.Payload, "payload", 300, "approximate JSON payload size in bytes")
	fs.BoolVar(&o.Analyze, "analyze", true, "drain: ANALYZE the outbox after loading it, as autovacuum would soon")
	fs.IntVar(&o.Rate, "rate", 0, "commits per second (0: outage 500, latency 1000)")
	fs.IntVar(&o.Workers, "workers", 16, "outage, latency: producer goroutines, one connection each")
	fs.DurationVar(&o.Duration, "duration", 30*time.Second, "latency: how long producers run")
	fs.DurationVar(&o.Warmup, "warmup", 2*time.Second, "latency: commits in this first part are not measured")
	fs.DurationVar(&o.Before, "before", 3*time.Second, "outage: steady running before the cut")
	fs.DurationVar(&o.Outage, "outage", 10*time.Second, "outage: how long the broker link stays cut")

	var names []string
	for _, s := range scenarios {
		names = append(names, fmt.Sprintf("  %-8s %s", s.name, s.summary))
	}
	fs.Usage = envflag.Usage(fs, "ORDO_BENCH", "usage: go run ./bench [flags] scenario... (or all)\n\nScenarios:\n"+strings.Join(names, "\n"))
	if err := envflag.Parse(fs, "ORDO_BENCH", args, lookup); err != nil {
		return o, nil, err
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return o, nil, errors.New("no scenario given")
	}
	var run []string
	for _, a := range fs.Args() {
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

func (o options) validate() error {
	switch {
	case o.ConfirmWindow < 1 || o.ConfirmWindow > 65535:
		return fmt.Errorf("confirm-window %d out of range 1..65535", o.ConfirmWindow)
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
	removeBinaries()
	os.Exit(code)
}

// run runs the named scenarios in order and returns the exit status.
func run(ctx context.Context, o options, names []string) int {
	code := 0
	for _, name := range names {
		if ctx.Err() != nil {
			fmt.Fprintln(os.Stderr, "bench: interrupted")
			return 1
		}
		s := findScenario(name)
		fmt.Printf("\n=== %s: %s\n", s.name, s.summary)
		res, err := s.run(ctx, o)
		if err != nil {
			fmt.Fprintf(os.Stderr, "bench: %s: %v\n", s.name, err)
			code = 1
			continue
		}
		res.Print(os.Stdout)
		path, err := res.WriteJSON(o.Out)
		if err != nil {
			fmt.Fprintf(os.Stderr, "bench: %s: %v\n", s.name, err)
			code = 1
		} else {
			fmt.Printf("results written to %s\n", path)
		}
		if !res.Check.OK() {
			code = 1
		}
	}
	return code
}
