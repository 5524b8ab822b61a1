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
//	node drop-key-seq-trigger [-postgres-url URL] [-check]   let partition owners number rows
//
// Exit status: 0 done (or -h), 1 failed, 2 bad usage (flags, arguments or
// settings).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/ordo-relay/ordo/internal/otelsetup"
	"github.com/ordo-relay/ordo/node"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err := cli{lookup: os.LookupEnv, stdout: os.Stdout, stderr: os.Stderr}.run(ctx, os.Args[1:])
	stop()
	os.Exit(exitStatus(err, os.Stderr))
}

// cli is what the command runs with: the environment and the output
// streams. main gives it the process's; tests give it their own.
type cli struct {
	lookup         func(string) (string, bool)
	stdout, stderr io.Writer
}

// subcommand runs "node NAME args..."; its errors are usage errors (exit
// status 2) when wrapped by usageError, failures otherwise.
type subcommand func(ctx context.Context, c cli, name string, args []string) error

var subcommands = map[string]subcommand{
	"status":     statusCmd,
	"health":     healthCmd,
	"parked":     adminCmd,
	"retry":      adminCmd,
	"skip":       adminCmd,
	"purge":      adminCmd,
	"gossip-key": adminCmd,
	"fill-gap":   adminCmd,

	"drop-key-seq-trigger": dropKeySeqTriggerCmd,
}

// run runs the command line args (without the program name): a
// subcommand, or the node until ctx ends. It returns what to exit with
// (see exitStatus); it never exits itself.
func (c cli) run(ctx context.Context, args []string) error {
	if len(args) > 0 {
		if sub, ok := subcommands[args[0]]; ok {
			if err := sub(ctx, c, args[0], args[1:]); err != nil {
				return fmt.Errorf("node %s: %w", args[0], err)
			}
			return nil
		}
	}
	o, err := parseConfig(args, c.lookup, c.stderr)
	if err != nil {
		return fmt.Errorf("node: %w", usageError(err))
	}
	if o.TableDryRun {
		return c.tableDryRun(ctx, o)
	}
	return c.serve(ctx, o)
}

// serve runs the node until ctx ends. Why it stopped is logged, so the
// error it returns is not printed again.
func (c cli) serve(ctx context.Context, o options) error {
	logger := newLogger(c.stderr, o.LogFormat, o.LogLevel).With("node", o.NodeName)
	getenv := func(k string) string { v, _ := c.lookup(k); return v }
	tp, flush, err := otelsetup.Start(ctx, "ordo-node", c.stdout, getenv, logger)
	if err != nil {
		return fmt.Errorf("node: %w", usageError(err))
	}
	defer flush()
	if err := node.Run(benchHooks(ctx, c.lookup, logger), o.Config, node.Options{Logger: logger, TracerProvider: tp}); err != nil {
		logger.Error("node stopped", "err", err)
		return &exitError{status: 1, err: err, logged: true}
	}
	logger.Info("node stopped")
	return nil
}

// tableDryRun prints node.TableDryRun's reports, one JSON object per
// line, to stdout.
func (c cli) tableDryRun(ctx context.Context, o options) error {
	reports, err := node.TableDryRun(ctx, o.Config)
	enc := json.NewEncoder(c.stdout)
	for _, r := range reports {
		if err := enc.Encode(r); err != nil {
			return fmt.Errorf("node -table-dry-run: %w", err)
		}
	}
	if err != nil {
		return fmt.Errorf("node -table-dry-run: %w", err)
	}
	return nil
}

// exitError is an error with the exit status it calls for.
type exitError struct {
	status int
	err    error
	logged bool // already reported: exitStatus prints nothing
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

// usageError marks err as bad usage: exit status 2.
func usageError(err error) error { return &exitError{status: 2, err: err} }

// exitStatus returns the exit status for what run returned, after
// writing its message to w: 0 for nil or -h (flag.ErrHelp, whose usage
// the flag package printed), 2 for bad usage, 1 for any other error.
func exitStatus(err error, w io.Writer) int {
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return 0
	}
	status, logged := 1, false
	var e *exitError
	if errors.As(err, &e) {
		status, logged = e.status, e.logged
	}
	if !logged {
		fmt.Fprintln(w, err)
	}
	return status
}
