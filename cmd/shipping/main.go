// Command shipping is the bookstore's example consumer: it keeps a
// projection of the orders (placed -> cancelled) in its own database,
// reading the order events through the inbox package, so that each event
// is handled once and each order's events in order, however many shipping
// instances run.
//
//	shipping [flags]                 consume until SIGINT or SIGTERM
//	shipping [flags] stuck           keys whose gap waited longer than -gap-wait
//	shipping [flags] dead            dead-lettered messages and what waits behind them
//	shipping [flags] resolve ORDER   declare a stuck order's missing events skipped
//	shipping [flags] retry ORDER     retry an order's dead-lettered event
//	shipping [flags] skip ORDER      drop an order's dead-lettered event; the order goes on
//
// resolve, retry and skip act on the order of the source named by -source
// (the outbox database its events came from; default: "default").
//
//	shipping [flags] audit           the last operator actions (CLI and HTTP), newest first
//	shipping -shards N reshard       change S (every instance stopped): docs/consumer.md, "Changing S"
//
// With -http-addr and -admin-token, the same operator actions are served
// over HTTP under /admin/ (admin.go). Every resolve, retry and skip, from
// either side, is recorded in ordo_inbox_audit.
//
// Every flag has an environment equivalent (ORDO_POSTGRES_URL, ...);
// see -h. The database named in -postgres-url is created if missing.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/ordo-relay/ordo/inbox"
	"github.com/ordo-relay/ordo/internal/envflag"
	"github.com/ordo-relay/ordo/wire"
)

// envPrefix prefixes the environment variable of every flag: ORDO_, as
// for every Ordo program (each runs in its own environment).
const envPrefix = "ORDO"

// config is what the flags and environment configure.
type config struct {
	postgresURL string        // the shipping database (projection and inbox)
	dbMaxConns  int           // pool size
	statsEvery  time.Duration // how often to log the inbox counters
	httpAddr    string        // where /metrics, /healthz, /readyz and /admin/ are served; empty: not served
	adminToken  string        // the bearer token /admin/ requires; empty: admin actions off
	operator    string        // who runs a CLI action, for the audit record
	source      string        // the source of the key a CLI action names
	rig         rig           // the tests' and the nemesis' fault injection; empty in the default build (nofaults.go)
	logLevel    slog.Level
	inbox       inbox.Config
	command     []string // a subcommand and its argument, if any
}

func parseConfig(args []string, lookup func(string) (string, bool), output io.Writer) (config, error) {
	cfg := config{inbox: inbox.DefaultConfig("shipping")}
	ic := &cfg.inbox
	ic.Exchange = "bookstore.ordering"
	ic.Bindings = []string{"order.*"}
	var mode, level string
	fs := flag.NewFlagSet("shipping", flag.ContinueOnError)
	fs.SetOutput(output)
	fs.StringVar(&cfg.postgresURL, "postgres-url", "postgres://postgres@127.0.0.1:5432/shipping?sslmode=disable", "the shipping database (created if missing)")
	fs.StringVar(&ic.AMQPURL, "amqp-url", ic.AMQPURL, "RabbitMQ URL")
	fs.StringVar(&ic.Exchange, "exchange", ic.Exchange, "the exchange the order events are published to")
	fs.StringVar(&ic.Name, "name", ic.Name, "consumer group name: keys the inbox rows and names the queues")
	fs.StringVar(&ic.Instance, "instance", ic.Instance, "this instance's name (lease owner); unique per live process")
	fs.IntVar(&ic.Shards, "shards", ic.Shards, "shard queues S; fixed at install")
	fs.IntVar(&ic.Partitions, "partitions", ic.Partitions, "the producer's partition count P")
	fs.IntVar(&ic.Prefetch, "prefetch", ic.Prefetch, "unacknowledged deliveries per shard")
	fs.IntVar(&ic.MaxAttempts, "max-attempts", ic.MaxAttempts, "handler attempts before a message is dead-lettered")
	fs.DurationVar(&ic.LeaseTTL, "lease-ttl", ic.LeaseTTL, "shard lease lifetime")
	fs.DurationVar(&ic.Heartbeat, "heartbeat", ic.Heartbeat, "AMQP heartbeat")
	fs.DurationVar(&ic.GapWait, "gap-wait", ic.GapWait, "how long a gap may wait before its key is reported stuck")
	fs.DurationVar(&ic.RetryMin, "retry-min", ic.RetryMin, "first retry backoff")
	fs.DurationVar(&ic.RetryMax, "retry-max", ic.RetryMax, "largest retry backoff")
	fs.DurationVar(&ic.RetentionAge, "retention-age", 0, "delete keys idle longer than this (the redelivery bound); 0 keeps them")
	fs.StringVar(&mode, "mode", "ordered", "ordered, bootstrap (first run over an existing stream) or partial")
	fs.IntVar(&ic.Lanes, "lanes", ic.Lanes, "keys of a shard handled at once (each key one message at a time)")
	fs.IntVar(&ic.BatchSize, "batch", ic.BatchSize, "deliveries a lane handles in one transaction, one commit for all (group commit; 1: a transaction each)")
	fs.DurationVar(&ic.BatchTime, "batch-time", ic.BatchTime, "handler time after which a lane's transaction takes no more deliveries")
	fs.IntVar(&cfg.dbMaxConns, "db-max-conns", 0, "PostgreSQL pool size (0: 2 + lanes × shards, what one instance owning every shard uses)")
	fs.DurationVar(&cfg.statsEvery, "stats-every", 30*time.Second, "how often to log the inbox counters (0: only at exit)")
	fs.StringVar(&cfg.httpAddr, "http-addr", "", "serve /metrics, /healthz, /readyz and /admin/ here, e.g. 127.0.0.1:8082 (empty: not served)")
	fs.StringVar(&cfg.adminToken, "admin-token", "", "bearer token the /admin/ actions require (empty: they are off)")
	fs.StringVar(&cfg.operator, "operator", "", "your name, recorded with resolve, retry and skip (default: $USER)")
	fs.StringVar(&cfg.source, "source", wire.DefaultSource, "the source (x-ordo-source) of the order resolve, retry and skip act on")
	cfg.rig.addFlags(fs)
	fs.StringVar(&level, "log-level", "info", "debug, info, warn or error")
	fs.Usage = envflag.Usage(fs, envPrefix, "usage: shipping [flags] [stuck | dead | resolve ORDER | retry ORDER | skip ORDER | audit | reshard]")
	if err := envflag.Parse(fs, envPrefix, args, lookup); err != nil {
		return config{}, err
	}
	cfg.command = fs.Args()
	if cfg.operator == "" {
		cfg.operator, _ = lookup("USER")
	}
	if cfg.operator == "" {
		cfg.operator = "unknown"
	}
	var err error
	if ic.Mode, err = inbox.ParseMode(mode); err != nil {
		return config{}, err
	}
	if err := cfg.logLevel.UnmarshalText([]byte(level)); err != nil {
		return config{}, fmt.Errorf("-log-level: %w", err)
	}
	if err := wire.ValidateSource(cfg.source); err != nil {
		return config{}, fmt.Errorf("-source: %w", err)
	}
	if cfg.dbMaxConns == 0 {
		// The inbox runs at most MaxConns - 2 handlers at once (two kept
		// for the lease loop): shards + 4 held a lone instance's 8 shards
		// to 10 handlers instead of 32. The pool opens connections only
		// when lanes need them, so instances sharing the shards open
		// about 2 + lanes × their own shards each.
		cfg.dbMaxConns = 2 + ic.Lanes*ic.Shards
	}
	if err := cfg.rig.validate(); err != nil {
		return config{}, err
	}
	if cfg.dbMaxConns < 2 || cfg.dbMaxConns > 1000 {
		return config{}, fmt.Errorf("-db-max-conns %d out of range 2..1000", cfg.dbMaxConns)
	}
	return cfg, ic.Validate()
}

func main() {
	cfg, err := parseConfig(os.Args[1:], os.LookupEnv, os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "shipping:", err)
		os.Exit(2)
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: cfg.logLevel}))
	cfg.inbox.Logger = logger
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	if len(cfg.command) > 0 {
		err = runCommand(ctx, cfg, os.Stdout)
	} else {
		err = run(ctx, cfg, logger)
	}
	stop()
	if err != nil {
		logger.Error("shipping failed", "err", err)
		os.Exit(1)
	}
}
