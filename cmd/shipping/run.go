package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ordo-relay/ordo/inbox"
	"github.com/ordo-relay/ordo/internal/otelsetup"
)

// run consumes until ctx is cancelled.
func run(ctx context.Context, cfg config, logger *slog.Logger) error {
	pool, err := openPool(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := migrate(ctx, pool); err != nil {
		return fmt.Errorf("migrate projection: %w", err)
	}
	db, q := cfg.rig.wrap(pool, projector(cfg.inbox.Instance), logger)
	tp, flush, err := otelsetup.Start(ctx, "ordo-shipping", os.Stdout, os.Getenv, logger)
	if err != nil {
		return err
	}
	defer flush()
	cfg.inbox.TracerProvider = tp
	c, err := inbox.NewQueued(cfg.inbox, db, q)
	if err != nil {
		return err
	}
	stopHTTP, err := serveHTTP(cfg, c, pool, logger)
	if err != nil {
		return err
	}
	defer stopHTTP()
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	var every <-chan time.Time
	if cfg.statsEvery > 0 {
		t := time.NewTicker(cfg.statsEvery)
		defer t.Stop()
		every = t.C
	}
	ready := c.Ready()
	for {
		select {
		case <-ready:
			ready = nil
			logger.Info("shipping consuming", "instance", cfg.inbox.Instance, "shards", cfg.inbox.Shards,
				"queues", c.Topology().ShardQueue(0)+"..", "exchange", cfg.inbox.Exchange)
		case <-every:
			logStats(logger, "shipping stats", c.Stats(), c.Owned())
		case err := <-done:
			logStats(logger, "shipping stopped", c.Stats(), nil)
			return err
		}
	}
}

func logStats(logger *slog.Logger, msg string, s inbox.Stats, owned []int) {
	logger.Info(msg, "handled", s.Handled, "duplicates", s.Duplicates, "gaps_stored", s.GapsStored,
		"retries", s.Retries, "dead_lettered", s.DeadLettered, "invalid", s.Invalid, "fenced", s.Fenced, "rewinds", s.Rewinds,
		"stuck_keys", s.StuckKeys, "dead_keys", s.DeadKeys, "shards", owned)
}

// openPool opens the shipping database, creating it first if missing.
func openPool(ctx context.Context, cfg config) (*pgxpool.Pool, error) {
	pc, err := pgxpool.ParseConfig(cfg.postgresURL)
	if err != nil {
		return nil, fmt.Errorf("parse -postgres-url: %w", err)
	}
	pc.MaxConns = int32(cfg.dbMaxConns)
	if err := ensureDatabase(ctx, cfg.postgresURL, pc.ConnConfig.Database); err != nil {
		return nil, err
	}
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("open PostgreSQL pool: %w", err)
	}
	return pool, nil
}

func ensureDatabase(ctx context.Context, rawURL, name string) error {
	conn, err := pgx.Connect(ctx, rawURL)
	if err == nil {
		return conn.Close(ctx)
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "3D000" { // invalid_catalog_name
		return fmt.Errorf("connect to the shipping database: %w", err)
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		return fmt.Errorf("parse -postgres-url: %w", err)
	}
	u.Path = "/postgres"
	admin, err := pgx.Connect(ctx, u.String())
	if err != nil {
		return fmt.Errorf("connect to create database %s: %w", name, err)
	}
	defer admin.Close(context.WithoutCancel(ctx))
	_, err = admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
	// duplicate_database, or unique_violation when two instances create
	// it at the same instant: another instance won.
	if errors.As(err, &pgErr) && (pgErr.Code == "42P04" || pgErr.Code == "23505") {
		err = nil
	}
	if err != nil {
		return fmt.Errorf("create database %s: %w", name, err)
	}
	return nil
}

// runCommand runs an operator subcommand against the database.
func runCommand(ctx context.Context, cfg config, out io.Writer) error {
	pool, err := openPool(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := inbox.Migrate(ctx, pool); err != nil {
		return err
	}
	name := cfg.inbox.Name
	cmd, args := cfg.command[0], cfg.command[1:]
	needKey := func() (string, error) {
		if len(args) != 1 {
			return "", fmt.Errorf("%s takes one order id", cmd)
		}
		return args[0], nil
	}
	switch cmd {
	case "reshard":
		return reshard(ctx, pool, cfg.inbox, out)
	case "stuck":
		return printStuck(ctx, pool, name, cfg.inbox.GapWait, out)
	case "dead":
		return printDead(ctx, pool, name, out)
	case "audit":
		return printAudit(ctx, pool, name, out)
	case "resolve", "retry", "skip":
		key, err := needKey()
		if err != nil {
			return err
		}
		who := inbox.Actor{Operator: cfg.operator, RemoteAddr: "cli"}
		if err := inbox.Act(ctx, pool, who, inbox.Action(cmd), name, cfg.source, key); err != nil {
			return err
		}
		fmt.Fprintf(out, "%s %s/%s: done; the owning instance picks it up within its retry poll\n", cmd, cfg.source, key)
		return nil
	}
	return fmt.Errorf("unknown command %q (want stuck, dead, resolve, retry, skip, audit or reshard)", cmd)
}

func printStuck(ctx context.Context, db inbox.DB, name string, gapWait time.Duration, out io.Writer) error {
	keys, err := inbox.Stuck(ctx, db, name, gapWait)
	if err != nil {
		return err
	}
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "SOURCE\tORDER\tLAST\tMISSING\tWAITING\tSTORED\tSINCE")
	for _, k := range keys {
		fmt.Fprintf(w, "%s\t%s\t%d\t%d..%d\t%d\t%d\t%s\n", k.Source, k.Key, k.Last, k.Last+1, k.Prev, k.Waiting, k.Stored, k.Since.Format(time.RFC3339))
	}
	return w.Flush()
}

func printDead(ctx context.Context, db inbox.DB, name string, out io.Writer) error {
	ms, err := inbox.Dead(ctx, db, name)
	if err != nil {
		return err
	}
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "SOURCE\tORDER\tKEY_SEQ\tTYPE\tATTEMPTS\tBEHIND\tDEAD_AT\tERROR")
	for _, m := range ms {
		fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%d\t%d\t%s\t%s\n", m.Source, m.Key, m.KeySeq, m.Type, m.Attempts, m.Waiting,
			m.DeadAt.Format(time.RFC3339), strings.ReplaceAll(m.LastError, "\n", " "))
	}
	return w.Flush()
}

func printAudit(ctx context.Context, db inbox.DB, name string, out io.Writer) error {
	list, err := inbox.Audit(ctx, db, name, 50)
	if err != nil {
		return err
	}
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "AT\tOPERATOR\tFROM\tACTION\tSOURCE\tORDER\tRESULT")
	for _, a := range list {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", a.At.Format(time.RFC3339), a.Operator, a.RemoteAddr, a.Action, a.Source, a.Key,
			strings.ReplaceAll(a.Result, "\n", " "))
	}
	return w.Flush()
}

// reshard changes the installed shard count to cfg.Shards (every instance
// must be stopped): see inbox.Reshard.
func reshard(ctx context.Context, db inbox.DB, cfg inbox.Config, out io.Writer) error {
	conn, err := amqp.Dial(cfg.AMQPURL)
	if err != nil {
		return fmt.Errorf("connect to RabbitMQ: %w", err)
	}
	defer conn.Close()
	rep, err := inbox.Reshard(ctx, db, conn, cfg)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "shards %d -> %d: %d partitions rebound, %d messages re-routed, %d queues deleted, %d stored messages moved; start the instances with -shards %d\n",
		rep.From, rep.To, rep.Rebound, rep.Rerouted, rep.Deleted, rep.StoredMsg, rep.To)
	return nil
}
