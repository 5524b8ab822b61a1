// Command orderapi serves Ordo's demo order API: it migrates the outbox and
// order tables, then answers HTTP until SIGINT or SIGTERM, when it stops
// accepting connections and lets requests in flight finish (at most 10 s).
// It writes orders and their events to PostgreSQL only; Ordo nodes publish
// the events.
//
// Every flag has an environment equivalent (ORDO_POSTGRES_URL,
// ORDO_HTTP_ADDR, ...); see -h.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ordo-relay/ordo/internal/envflag"
	"github.com/ordo-relay/ordo/internal/otelsetup"
	"github.com/ordo-relay/ordo/orderapi"
	"github.com/ordo-relay/ordo/outbox"
)

// envPrefix prefixes the environment variable of every flag.
const envPrefix = "ORDO"

// shutdownTimeout bounds the wait for requests in flight at shutdown.
const shutdownTimeout = 10 * time.Second

// config is what the flags and environment configure.
type config struct {
	// postgresURL is the database holding the outbox and the order tables.
	postgresURL string
	// httpAddr is the address the API listens on.
	httpAddr string
	// partitions is the outbox partition count; it must match the one the
	// database was installed with.
	partitions int
	// dbMaxConns is the size of the PostgreSQL connection pool.
	dbMaxConns int
	// api configures the handler (the exchange comes from -exchange).
	api orderapi.Config
}

// parseConfig reads args (without the program name) and the environment,
// through lookup, into a validated config. It returns flag.ErrHelp after
// printing usage to output when asked for -h.
func parseConfig(args []string, lookup func(string) (string, bool), output io.Writer) (config, error) {
	cfg := config{api: orderapi.DefaultConfig()}
	fs := flag.NewFlagSet("orderapi", flag.ContinueOnError)
	fs.SetOutput(output)
	fs.StringVar(&cfg.postgresURL, "postgres-url", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable", "PostgreSQL URL")
	fs.StringVar(&cfg.httpAddr, "http-addr", "127.0.0.1:8080", "HTTP listen address")
	fs.StringVar(&cfg.api.Exchange, "exchange", cfg.api.Exchange, "RabbitMQ exchange the order events are addressed to")
	fs.IntVar(&cfg.partitions, "partitions", 64, "outbox partition count; must match the installed one")
	fs.IntVar(&cfg.dbMaxConns, "db-max-conns", 10, "most PostgreSQL connections")
	fs.DurationVar(&cfg.api.IdempotencyKeyTTL, "idempotency-key-ttl", cfg.api.IdempotencyKeyTTL,
		"how long an Idempotency-Key of POST /orders is kept (a retry within it gets the first order back)")
	fs.Usage = envflag.Usage(fs, envPrefix, "usage: orderapi [flags]")
	if err := envflag.Parse(fs, envPrefix, args, lookup); err != nil {
		return config{}, err
	}
	if fs.NArg() > 0 {
		return config{}, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	switch {
	case cfg.postgresURL == "":
		return config{}, errors.New("-postgres-url is required")
	case cfg.httpAddr == "":
		return config{}, errors.New("-http-addr is required")
	case cfg.dbMaxConns < 1 || cfg.dbMaxConns > 1000:
		return config{}, fmt.Errorf("-db-max-conns is %d, it must be between 1 and 1000", cfg.dbMaxConns)
	}
	if err := cfg.api.Validate(); err != nil {
		return config{}, err
	}
	return cfg, nil
}

func main() {
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	err := start(os.Args[1:], logger)
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
	default:
		logger.Error("orderapi failed", "err", err)
		os.Exit(1)
	}
}

// start parses the configuration and runs until SIGINT or SIGTERM.
func start(args []string, logger *slog.Logger) error {
	cfg, err := parseConfig(args, os.LookupEnv, os.Stderr)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err = run(ctx, cfg, logger)
	if err != nil && errors.Is(err, context.Canceled) && ctx.Err() != nil {
		// Stopped by a signal while starting: a normal stop.
		logger.Info("orderapi stopped while starting", "err", err)
		return nil
	}
	return err
}

// run migrates the database and serves the API until ctx is cancelled, then
// shuts down gracefully and returns nil. It returns an error when it cannot
// start or the server fails.
// openDatabase opens the pool, applies the outbox's and the order
// tables' migrations, and returns the partition count the outbox holds.
func openDatabase(ctx context.Context, cfg config) (*pgxpool.Pool, int, error) {
	poolCfg, err := pgxpool.ParseConfig(cfg.postgresURL)
	if err != nil {
		return nil, 0, fmt.Errorf("parse -postgres-url: %w", err)
	}
	poolCfg.MaxConns = int32(cfg.dbMaxConns)
	pool, err := pgxpool.NewWithConfig(ctx, poolCfg)
	if err != nil {
		return nil, 0, fmt.Errorf("open PostgreSQL pool: %w", err)
	}
	if err := outbox.Migrate(ctx, pool, cfg.partitions); err != nil {
		pool.Close()
		return nil, 0, fmt.Errorf("migrate outbox: %w", err)
	}
	if err := orderapi.Migrate(ctx, pool); err != nil {
		pool.Close()
		return nil, 0, fmt.Errorf("migrate order tables: %w", err)
	}
	partitions, err := outbox.LoadPartitions(ctx, pool, cfg.partitions)
	if err != nil {
		pool.Close()
		return nil, 0, err
	}
	return pool, partitions, nil
}

func run(ctx context.Context, cfg config, logger *slog.Logger) error {
	pool, partitions, err := openDatabase(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	producer, err := outbox.NewProducer(partitions)
	if err != nil {
		return err
	}
	tp, flush, err := otelsetup.Start(ctx, "ordo-orderapi", os.Stdout, os.Getenv, logger)
	if err != nil {
		return err
	}
	defer flush()
	cfg.api.TracerProvider = tp
	handler, err := orderapi.New(cfg.api, pool, producer, logger)
	if err != nil {
		return err
	}

	ln, err := net.Listen("tcp", cfg.httpAddr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", cfg.httpAddr, err)
	}
	srv := &http.Server{
		Handler:           instrument(handler, pool, logger),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	expiryCtx, stopExpiry := context.WithCancel(context.Background())
	expiryDone := make(chan error, 1)
	go func() { expiryDone <- handler.RunKeyExpiry(expiryCtx) }()
	defer func() { stopExpiry(); <-expiryDone }() // before the pool closes
	logger.Info("orderapi listening", "addr", ln.Addr().String(), "exchange", cfg.api.Exchange, "partitions", partitions)

	select {
	case err := <-served:
		return fmt.Errorf("serve HTTP: %w", err)
	case <-ctx.Done():
	}
	logger.Info("orderapi shutting down")
	shutdownCtx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	shutdownErr := srv.Shutdown(shutdownCtx)
	if shutdownErr != nil {
		// Requests still running: close their connections so their
		// transactions roll back and the pool can close.
		srv.Close()
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve HTTP: %w", err)
	}
	if shutdownErr != nil {
		return fmt.Errorf("shut down HTTP within %v: %w", shutdownTimeout, shutdownErr)
	}
	logger.Info("orderapi stopped")
	return nil
}
