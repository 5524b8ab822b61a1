// Command nemesis checks Ordo's promises under failure: three node
// processes and the order API on the real PostgreSQL and RabbitMQ, under a
// seeded schedule of faults (kills, pauses, server restarts, cut and
// stalled links, gossip splits, a memory alarm, poison rows), judged from
// the deliveries by a history checker. See docs/reliability.md.
//
//	go run ./bench/cmd/nemesis [flags]
//
// It restarts the shared servers: run it alone, e.g. under
// flock -x -o /tmp/ordo-servers.lock. The last line on stdout is its
// RESULT; the exit status is 1 when the checker found a problem or a step
// could not run, 2 for bad flags. Every flag also reads ORDO_NEMESIS_<FLAG>
// (e.g. ORDO_NEMESIS_SEED) when not given.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/ordo-relay/ordo/bench/nemesis"
	"github.com/ordo-relay/ordo/internal/childproc"
	"github.com/ordo-relay/ordo/internal/envflag"
)

const envPrefix = "ORDO_NEMESIS"

func parseConfig(args []string, lookup func(string) (string, bool), out io.Writer) (nemesis.Config, error) {
	cfg := nemesis.DefaultConfig()
	fs := flag.NewFlagSet("nemesis", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.StringVar(&cfg.PostgresURL, "postgres-url", cfg.PostgresURL, "PostgreSQL admin URL (the run creates and drops its own database)")
	fs.StringVar(&cfg.AMQPURL, "amqp-url", cfg.AMQPURL, "RabbitMQ URL")
	fs.StringVar(&cfg.Out, "out", cfg.Out, "directory for the JSON result")
	fs.IntVar(&cfg.Partitions, "partitions", cfg.Partitions, "partition count P")
	fs.IntVar(&cfg.ConfirmWindow, "confirm-window", cfg.ConfirmWindow, "the nodes' confirm window W")
	fs.StringVar(&cfg.NodeBin, "node-bin", cfg.NodeBin, "prebuilt node binary (default: go build -tags ordobench ./cmd/node)")
	fs.DurationVar(&cfg.Timeout, "timeout", cfg.Timeout, "bound on every wait")
	fs.IntVar(&cfg.Rate, "rate", cfg.Rate, "order API requests a second (0: 100)")
	fs.Int64Var(&cfg.Seed, "seed", cfg.Seed, "seed of the fault schedule (0: draw one and print it)")
	fs.StringVar(&cfg.Scenario, "scenario", cfg.Scenario, "relay (3 nodes, judged from the deliveries) or consumers (3 shipping instances, judged from their database)")
	fs.StringVar(&cfg.Profile, "profile", cfg.Profile, "short (about 2 minutes) or long (10 minutes or more)")
	fs.IntVar(&cfg.Sources, "sources", cfg.Sources, "outbox databases the relay scenario's nodes relay: 2 (default and billing; adds the source-link fault) or 1 (default); 0: the scenario's (relay 2, consumers 1)")
	fs.BoolVar(&cfg.Lean, "lean", cfg.Lean, "relay scenario: drop the producers' key_seq trigger once the nodes run, so the partition owners number the rows")
	kinds := fs.String("kinds", "all", "comma-separated kinds of fault to run, or all (the scenario's)")
	fs.Usage = envflag.Usage(fs, envPrefix, "usage: go run ./bench/cmd/nemesis [flags]")
	if err := envflag.Parse(fs, envPrefix, args, lookup); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	var err error
	if cfg.Kinds, err = nemesis.ParseKinds(*kinds); err != nil {
		return cfg, err
	}
	return cfg, cfg.Validate()
}

func main() {
	cfg, err := parseConfig(os.Args[1:], os.LookupEnv, os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "nemesis:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err = nemesis.Run(ctx, cfg)
	stop()
	childproc.RemoveBinaries()
	if err != nil {
		fmt.Fprintln(os.Stderr, "nemesis:", err)
		os.Exit(1)
	}
}
