// Command node runs one Ordo relay node: it gossips membership with its
// peers, holds the leases of the partitions assigned to it, and publishes
// their pending outbox rows to RabbitMQ in per-key order. Every flag has an
// ORDO_* environment variable equivalent (see -h).
//
//	node [flags]                           run a node
//	node status [-http ADDR]               print a node's view of the cluster
//	node health [-http ADDR] [-path P]     exit 0 when P (/readyz) answers 200
//	node parked [-http ADDR]               list parked messages
//	node retry  [-http ADDR] ID | -key K   retry a parked message
//	node skip   [-http ADDR] ID            skip (kill) a parked message
//	node purge  [-http ADDR]               delete purgeable dead rows
//	node fill-gap [-http ADDR] KEY KEY_SEQ put a dead placeholder in a key_seq gap
//	node gossip-key [-http ADDR] add|use|remove KEY   rotate gossip keys while running
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
	"strings"
	"syscall"

	"github.com/ordo-relay/ordo/internal/envflag"
	"github.com/ordo-relay/ordo/membership"
	"github.com/ordo-relay/ordo/node"
)

// options is the parsed command line of "node [flags]".
type options struct {
	node.Config
	LogLevel slog.Level
	// LogFormat is json, text, or auto (json unless stderr, where logs go,
	// is a terminal).
	LogFormat string
	// GossipInsecure lets the node gossip without encryption (no
	// -gossip-key); it is logged as a warning at every start.
	GossipInsecure bool
}

// errGossipKey explains why a gossiping node needs a key.
var errGossipKey = errors.New("-gossip-addr needs -gossip-key (ORDO_GOSSIP_KEY): without it any host that reaches the gossip port joins the cluster and takes partitions; " +
	"generate one with `openssl rand -base64 32`, or pass -gossip-insecure (ORDO_GOSSIP_INSECURE=true) to gossip unencrypted on a network you trust")

// checkGossipSecurity refuses a gossip address without a key, unless
// -gossip-insecure says so explicitly, and refuses both a key and
// -gossip-insecure.
func (o options) checkGossipSecurity() error {
	switch {
	case o.GossipAddr == "":
		return nil
	case len(o.GossipKeys) == 0 && !o.GossipInsecure:
		return errGossipKey
	case len(o.GossipKeys) > 0 && o.GossipInsecure:
		return errors.New("-gossip-insecure and -gossip-key contradict each other: drop -gossip-insecure to gossip encrypted")
	}
	return nil
}

// logStartWarnings logs what a start should not pass unnoticed.
func (o options) logStartWarnings(logger *slog.Logger) {
	if o.GossipAddr != "" && o.GossipInsecure {
		logger.Warn("gossip is not encrypted (-gossip-insecure): any host that reaches the gossip address can join the cluster and take partitions; set -gossip-key",
			"gossip", o.GossipAddr)
	}
}

func parseConfig(args []string, lookup func(string) (string, bool), out io.Writer) (options, error) {
	o := options{Config: node.DefaultConfig()}
	c := &o.Config
	fs := flag.NewFlagSet("node", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.StringVar(&c.PostgresURL, "postgres-url", c.PostgresURL, "PostgreSQL URL of the outbox database")
	fs.StringVar(&c.AMQPURL, "amqp-url", c.AMQPURL, "RabbitMQ URL")
	fs.StringVar(&c.NodeName, "node-name", c.NodeName, "this node's name (lease owner and gossip name); keep it stable across restarts")
	fs.StringVar(&c.HTTPAddr, "http-addr", c.HTTPAddr, "address for /healthz, /readyz and /status")
	fs.IntVar(&c.Partitions, "partitions", c.Partitions, "partition count P; fixed at install")
	fs.IntVar(&c.ConfirmWindow, "confirm-window", c.ConfirmWindow, "W: the most unconfirmed publishes in flight")
	fs.IntVar(&c.BatchSize, "batch-size", c.BatchSize, "most rows per partition per read")
	fs.IntVar(&c.ReadAheadMiB, "read-ahead-mib", c.ReadAheadMiB, "memory for rows read ahead of publishing or awaiting their mark, in MiB")
	fs.DurationVar(&c.PollInterval, "poll-interval", c.PollInterval, "read this often without a notification")
	fs.DurationVar(&c.LeaseTTL, "lease-ttl", c.LeaseTTL, "partition lease lifetime; renewed every third of it")
	fs.DurationVar(&c.SettleTimeout, "settle-timeout", c.SettleTimeout, "how long to wait for outstanding confirms when stopping")
	fs.DurationVar(&c.RetryMin, "retry-min", c.RetryMin, "first backoff of a key whose message failed")
	fs.DurationVar(&c.RetryMax, "retry-max", c.RetryMax, "backoff cap of a failing key")
	fs.IntVar(&c.DBMaxConns, "db-max-conns", c.DBMaxConns, "PostgreSQL pool size")
	fs.IntVar(&c.MaxAttempts, "max-attempts", c.MaxAttempts, "failed attempts after which a message is parked")
	fs.DurationVar(&c.ConfirmTimeout, "confirm-timeout", c.ConfirmTimeout, "a publish unconfirmed this long on an open channel counts as a failed attempt")
	fs.DurationVar(&c.RetentionAge, "retention-age", c.RetentionAge, "delete processed rows older than this (0 keeps them)")
	fs.DurationVar(&c.RetentionInterval, "retention-interval", c.RetentionInterval, "how often retention runs")
	fs.IntVar(&c.RetentionChunk, "retention-chunk", c.RetentionChunk, "most rows one retention DELETE removes")
	fs.StringVar(&c.AdminToken, "admin-token", "", "bearer token for the /admin actions (empty: actions off)")
	fs.BoolVar(&c.PProf, "pprof", false, "serve Go's profiler under /debug/pprof/ on the HTTP address")
	fs.StringVar(&c.GossipAddr, "gossip-addr", "", "host:port for gossip (TCP and UDP); empty runs the node alone, owning every partition")
	fs.StringVar(&c.GossipAdvertise, "gossip-advertise", "", "host:port peers reach this node at (default: -gossip-addr)")
	join := fs.String("join", "", "comma-separated seed gossip addresses")
	keys := fs.String("gossip-key", "", "comma-separated base64 gossip encryption keys (16, 24 or 32 bytes); the first encrypts, all decrypt; required with -gossip-addr unless -gossip-insecure")
	fs.BoolVar(&o.GossipInsecure, "gossip-insecure", false, "allow -gossip-addr without -gossip-key: gossip unencrypted (logged as a warning at every start)")
	fs.DurationVar(&c.RejoinInterval, "rejoin-interval", c.RejoinInterval, "how often to join the seeds again (heals splits)")
	fs.DurationVar(&c.DegradedAfter, "degraded-after", c.DegradedAfter, "oldest pending age in this node's partitions above which /readyz and /status say degraded (0: off)")
	fs.DurationVar(&c.BacklogInterval, "backlog-interval", c.BacklogInterval, "how often the backlog of every partition is read for /status and /metrics (one bounded query)")
	level := fs.String("log-level", "info", "debug, info, warn or error")
	fs.StringVar(&o.LogFormat, "log-format", "auto", "json, text, or auto: json unless stderr is a terminal")
	fs.Usage = envflag.Usage(fs, "ORDO", "usage: node [flags]\n       node status|parked|retry|skip|purge|fill-gap|gossip-key -h\n\nRuns one Ordo relay node.")
	if err := envflag.Parse(fs, "ORDO", args, lookup); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	if *join != "" {
		for _, s := range strings.Split(*join, ",") {
			if s = strings.TrimSpace(s); s != "" {
				c.Join = append(c.Join, s)
			}
		}
	}
	var err error
	if c.GossipKeys, err = membership.ParseKeys(*keys); err != nil {
		return o, err
	}
	if err := o.LogLevel.UnmarshalText([]byte(*level)); err != nil {
		return o, fmt.Errorf("log-level %q: %w", *level, err)
	}
	if err := checkLogFormat(o.LogFormat); err != nil {
		return o, err
	}
	if err := o.checkGossipSecurity(); err != nil {
		return o, err
	}
	return o, c.Validate()
}

func main() {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case "status":
			os.Exit(statusMain(os.Args[2:], os.LookupEnv, os.Stdout, os.Stderr))
		case "health":
			os.Exit(healthMain(os.Args[2:], os.LookupEnv, os.Stdout, os.Stderr))
		case "parked", "retry", "skip", "purge", "gossip-key", "fill-gap":
			os.Exit(adminMain(os.Args[1], os.Args[2:], os.LookupEnv, os.Stdout, os.Stderr))
		}
	}
	o, err := parseConfig(os.Args[1:], os.LookupEnv, os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "node:", err)
		os.Exit(2)
	}
	logger := newLogger(os.Stderr, o.LogFormat, o.LogLevel).With("node", o.NodeName)
	o.logStartWarnings(logger)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err = node.Run(ctx, o.Config, node.Options{Logger: logger})
	stop()
	if err != nil {
		logger.Error("node stopped", "err", err)
		os.Exit(1)
	}
	logger.Info("node stopped")
}
