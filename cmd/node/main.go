// Command node runs one Ordo relay node: it holds partition leases in
// PostgreSQL and publishes their pending outbox rows to RabbitMQ in per-key
// order. See the README for configuration; every flag has an ORDO_*
// environment variable equivalent.
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

	"github.com/ordo-relay/ordo/internal/envflag"
	"github.com/ordo-relay/ordo/partition"
)

// config is everything the node is configured with.
type config struct {
	PostgresURL   string        // outbox database
	AMQPURL       string        // broker
	NodeName      string        // lease owner name; stable across restarts
	HTTPAddr      string        // /healthz, /readyz, /status
	Partitions    int           // P; must match the installed count
	ConfirmWindow int           // W: most unconfirmed publishes in flight
	BatchSize     int           // most rows per read
	PollInterval  time.Duration // read without a notification this often
	LeaseTTL      time.Duration // lease lifetime in the database
	SettleTimeout time.Duration // bound on settling confirms at shutdown
	RetryMin      time.Duration // first backoff of a failed key
	RetryMax      time.Duration // backoff cap
	DBMaxConns    int           // pool size
	LogLevel      string        // debug, info, warn, error
}

func defaultNodeName() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		return "ordo-node"
	}
	return h
}

func parseConfig(args []string, lookup func(string) (string, bool), out io.Writer) (config, error) {
	var c config
	fs := flag.NewFlagSet("node", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.StringVar(&c.PostgresURL, "postgres-url", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable", "PostgreSQL URL of the outbox database")
	fs.StringVar(&c.AMQPURL, "amqp-url", "amqp://guest:guest@127.0.0.1:5672/", "RabbitMQ URL")
	fs.StringVar(&c.NodeName, "node-name", defaultNodeName(), "this node's name (the lease owner); keep it stable across restarts")
	fs.StringVar(&c.HTTPAddr, "http-addr", "127.0.0.1:8081", "address for /healthz, /readyz and /status")
	fs.IntVar(&c.Partitions, "partitions", partition.DefaultCount, "partition count P; fixed at install")
	fs.IntVar(&c.ConfirmWindow, "confirm-window", 512, "W: the most unconfirmed publishes in flight")
	fs.IntVar(&c.BatchSize, "batch-size", 512, "most rows per read")
	fs.DurationVar(&c.PollInterval, "poll-interval", time.Second, "read this often without a notification")
	fs.DurationVar(&c.LeaseTTL, "lease-ttl", 2*time.Second, "partition lease lifetime; renewed every third of it")
	fs.DurationVar(&c.SettleTimeout, "settle-timeout", 5*time.Second, "how long to wait for outstanding confirms when stopping")
	fs.DurationVar(&c.RetryMin, "retry-min", 100*time.Millisecond, "first backoff of a key whose message failed")
	fs.DurationVar(&c.RetryMax, "retry-max", 30*time.Second, "backoff cap of a failing key")
	fs.IntVar(&c.DBMaxConns, "db-max-conns", 6, "PostgreSQL pool size")
	fs.StringVar(&c.LogLevel, "log-level", "info", "debug, info, warn or error")
	fs.Usage = envflag.Usage(fs, "ORDO", "usage: node [flags]\n\nRuns one Ordo relay node.")
	if err := envflag.Parse(fs, "ORDO", args, lookup); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	return c, c.validate()
}

func (c config) validate() error {
	switch {
	case c.NodeName == "":
		return errors.New("node name is empty (set -node-name or ORDO_NODE_NAME)")
	case c.DBMaxConns < 3:
		return fmt.Errorf("db-max-conns %d: need at least 3 (reads, marks, status)", c.DBMaxConns)
	case c.LeaseTTL < 300*time.Millisecond:
		return fmt.Errorf("lease-ttl %v is too short (at least 300ms)", c.LeaseTTL)
	}
	if err := partition.ValidateCount(c.Partitions); err != nil {
		return err
	}
	var l slog.Level
	if err := l.UnmarshalText([]byte(c.LogLevel)); err != nil {
		return fmt.Errorf("log-level %q: %w", c.LogLevel, err)
	}
	return nil
}

func main() {
	cfg, err := parseConfig(os.Args[1:], os.LookupEnv, os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "node:", err)
		os.Exit(2)
	}
	var level slog.Level
	_ = level.UnmarshalText([]byte(cfg.LogLevel))
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})).With("node", cfg.NodeName)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err = run(ctx, cfg, logger)
	stop()
	if err != nil {
		logger.Error("node stopped", "err", err)
		os.Exit(1)
	}
	logger.Info("node stopped")
}
