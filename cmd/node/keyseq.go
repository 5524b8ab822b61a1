package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/ordo-relay/ordo/internal/envflag"
	"github.com/ordo-relay/ordo/outbox"
)

const dropKeySeqTriggerUsage = `usage: node drop-key-seq-trigger [-postgres-url URL] [-check] [-lock-timeout D]

Drops the producers' key_seq trigger from one outbox database, after
which partition owners number each key's rows and a producer's INSERT
runs no trigger (docs/outbox-table.md, "Who numbers a key's rows").
It refuses while a node that holds a lease there has not recorded that
it numbers rows (a node of a release before the numbering), and names
those nodes: upgrade or stop them, let their leases expire, run it again.
Run it once per source database. -check says what it would do and
changes nothing.`

// dropKeySeqTriggerCmd runs "node drop-key-seq-trigger":
// outbox.DropKeySeqTriggerWithin against one database, with the outcome spelled out for an operator.
// A refusal (old nodes, a lock not had in time) is a failure, exit
// status 1.
func dropKeySeqTriggerCmd(ctx context.Context, c cli, name string, args []string) error {
	fs := flag.NewFlagSet("node "+name, flag.ContinueOnError)
	fs.SetOutput(c.stderr)
	url := fs.String("postgres-url", "", "PostgreSQL URL of the outbox database (the node's -postgres-url, or one -source's)")
	check := fs.Bool("check", false, "say whether the trigger is installed and which nodes keep it needed; drop nothing")
	lockTimeout := fs.Duration("lock-timeout", 5*time.Second,
		"how long to wait for the outbox's lock (DROP TRIGGER waits for the inserts under way, and inserts queue behind it meanwhile)")
	fs.Usage = envflag.Usage(fs, envPrefix, dropKeySeqTriggerUsage)
	if err := envflag.Parse(fs, envPrefix, args, c.lookup); err != nil {
		return usageError(err)
	}
	switch {
	case fs.NArg() > 0:
		return usageError(fmt.Errorf("unexpected arguments %q", fs.Args()))
	case *url == "":
		return usageError(errors.New("give the outbox database: -postgres-url (ORDO_POSTGRES_URL)"))
	case *lockTimeout <= 0:
		return usageError(fmt.Errorf("-lock-timeout %v: want a positive duration", *lockTimeout))
	}
	cfg, err := pgx.ParseConfig(*url)
	if err != nil {
		return usageError(fmt.Errorf("-postgres-url: %w", err))
	}
	cfg.RuntimeParams["application_name"] = "ordo node " + name
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	conn, err := pgx.ConnectConfig(cctx, cfg)
	cancel()
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(context.Background())
	ctx, cancel = context.WithTimeout(ctx, *lockTimeout+30*time.Second)
	defer cancel()

	on, err := outbox.KeySeqTriggerInstalled(ctx, conn)
	if err != nil {
		return fmt.Errorf("%w (is this an Ordo outbox database, migrated by a node?)", err)
	}
	index, err := outbox.PendingIndexInstalled(ctx, conn)
	if err != nil {
		return err
	}
	dead, err := outbox.DeadCheckInstalled(ctx, conn)
	if err != nil {
		return err
	}
	if !on && !index && !dead {
		fmt.Fprintln(c.stdout, "the key_seq trigger is not installed: partition owners number the rows; nothing to do")
		return nil
	}
	keep, leftovers, err := producerLeftovers(ctx, conn, index, dead)
	if err != nil {
		return err
	}
	if !on {
		if keep != "" {
			fmt.Fprintf(c.stdout, "the key_seq trigger is not installed; %s\n", keep)
			return nil
		}
		if *check {
			fmt.Fprintf(c.stdout, "the key_seq trigger is not installed; %s: needed by no node holding a lease, it can be dropped\n", leftovers)
			return nil
		}
	}
	if *check {
		old, err := outbox.OldNodes(ctx, conn)
		if err != nil {
			return err
		}
		if len(old) > 0 {
			fmt.Fprintf(c.stdout, "the key_seq trigger is installed, and must stay while these nodes hold leases without numbering rows:\n  %s\n",
				strings.Join(old, "\n  "))
			return nil
		}
		fmt.Fprintln(c.stdout, "the key_seq trigger is installed; every node holding a lease numbers rows: it can be dropped")
		return nil
	}
	err = outbox.DropKeySeqTriggerWithin(ctx, conn, *lockTimeout)
	var pgErr *pgconn.PgError
	switch {
	case errors.Is(err, outbox.ErrOldNodesRunning):
		return err
	case errors.As(err, &pgErr) && pgErr.Code == "55P03": // lock_not_available
		return fmt.Errorf("the outbox stayed locked for %v (a transaction writing it, or a migration, is open): nothing dropped; run it again, or give a longer -lock-timeout: %w",
			*lockTimeout, err)
	case err != nil:
		return err
	}
	switch {
	case !on:
		fmt.Fprintf(c.stdout, "dropped %s: producers' inserts no longer pay for them\n", leftovers)
	case keep != "":
		fmt.Fprintf(c.stdout, "dropped the key_seq trigger: producers' inserts run no trigger, and partition owners number the rows; %s (run this again once they are upgraded)\n", keep)
	default:
		fmt.Fprintf(c.stdout, "dropped the key_seq trigger and %s: producers' inserts run no trigger, and partition owners number the rows\n", leftovers)
	}
	return nil
}

// producerLeftovers says what of the producers' leftovers the drop keeps
// and for which nodes (keep, "" if nothing), and names those installed
// (index: outbox_pending_by_partition, which relays before release 2 read;
// dead: outbox_dead_is_processed, which relays before release 3 need).
func producerLeftovers(ctx context.Context, conn *pgx.Conn, index, dead bool) (keep, installed string, err error) {
	var names []string
	if index {
		names = append(names, "outbox_pending_by_partition")
	}
	if dead {
		names = append(names, "outbox_dead_is_processed")
	}
	installed = strings.Join(names, " and ")
	users, err := outbox.PendingIndexUsers(ctx, conn)
	if err != nil {
		return "", "", err
	}
	if index && len(users) > 0 {
		return fmt.Sprintf("kept (%s) while these nodes of a release before 2 hold leases:\n  %s", installed, strings.Join(users, "\n  ")), installed, nil
	}
	deadUsers, err := outbox.DeadCheckUsers(ctx, conn)
	if err != nil {
		return "", "", err
	}
	if dead && len(deadUsers) > 0 {
		return fmt.Sprintf("kept (outbox_dead_is_processed) while these nodes of a release before 3 hold leases:\n  %s", strings.Join(deadUsers, "\n  ")), installed, nil
	}
	return "", installed, nil
}
