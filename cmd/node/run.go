package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/errgroup"

	"github.com/ordo-relay/ordo/outbox"
	"github.com/ordo-relay/ordo/partition"
	"github.com/ordo-relay/ordo/relay"
)

// run starts the node and blocks until ctx ends, then shuts down in order:
// the relay stops reading and settles its confirms, then the leases are
// released, then the broker connection and the HTTP server close.
func run(ctx context.Context, cfg config, logger *slog.Logger) error {
	pcfg, err := pgxpool.ParseConfig(cfg.PostgresURL)
	if err != nil {
		return fmt.Errorf("postgres-url: %w", err)
	}
	pcfg.MaxConns = int32(cfg.DBMaxConns)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return fmt.Errorf("open PostgreSQL pool: %w", err)
	}
	defer pool.Close()
	if err := migrate(ctx, pool, cfg.Partitions, logger); err != nil {
		return err
	}

	all := make([]int, cfg.Partitions)
	for i := range all {
		all[i] = i
	}
	leaser, err := partition.NewLeaser(partition.LeaserConfig{
		Node:   cfg.NodeName,
		TTL:    cfg.LeaseTTL,
		Want:   func() []int { return all },
		Logger: logger,
		Connect: func(ctx context.Context) (*pgx.Conn, error) {
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			return pgx.ConnectConfig(cctx, pcfg.ConnConfig.Copy())
		},
	})
	if err != nil {
		return err
	}
	pub := relay.NewAMQPPublisher(relay.AMQPConfig{URL: cfg.AMQPURL, Window: cfg.ConfirmWindow, Logger: logger})
	store := relay.NewPGStore(pool, logger)
	rl, err := relay.New(relay.Config{
		Node:          cfg.NodeName,
		Window:        cfg.ConfirmWindow,
		BatchSize:     cfg.BatchSize,
		PollInterval:  cfg.PollInterval,
		RetryMin:      cfg.RetryMin,
		RetryMax:      cfg.RetryMax,
		SettleTimeout: cfg.SettleTimeout,
		Logger:        logger,
	}, store, pub, leaser)
	if err != nil {
		return err
	}

	ln, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		return fmt.Errorf("http-addr: %w", err)
	}
	srv := &http.Server{
		Handler:           newHTTP(cfg, pool, pub, leaser, rl, logger),
		ReadHeaderTimeout: 5 * time.Second,
	}

	// Background services outlive the relay: they stop only after it has
	// settled, so nothing is published under a released lease.
	bgCtx, stopBG := context.WithCancel(context.Background())
	defer stopBG()
	leaseCtx, stopLeases := context.WithCancel(context.Background())
	defer stopLeases()
	var bg errgroup.Group
	bg.Go(func() error { return pub.Run(bgCtx) })
	leaseDone := make(chan error, 1)
	go func() { leaseDone <- leaser.Run(leaseCtx) }()
	bg.Go(func() error {
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("http: %w", err)
		}
		return nil
	})
	logger.Info("node started", "http", ln.Addr().String(), "partitions", cfg.Partitions, "confirm_window", cfg.ConfirmWindow)

	relayErr := rl.Run(ctx)
	logger.Info("relay stopped; releasing leases", "stats", fmt.Sprintf("%+v", rl.Stats()))
	stopLeases()
	leaseErr := <-leaseDone
	stopBG()
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	httpErr := srv.Shutdown(sctx)
	return errors.Join(relayErr, leaseErr, bg.Wait(), httpErr)
}

// migrate applies the outbox migrations, retrying while PostgreSQL is
// unreachable, and refusing at once on a partition count mismatch.
func migrate(ctx context.Context, pool *pgxpool.Pool, partitions int, logger *slog.Logger) error {
	for attempt := 1; ; attempt++ {
		err := outbox.Migrate(ctx, pool, partitions)
		if err == nil || errors.Is(err, outbox.ErrPartitionMismatch) || ctx.Err() != nil {
			return err
		}
		if attempt == 1 || attempt%10 == 0 {
			logger.Warn("cannot migrate the outbox yet; retrying", "attempt", attempt, "err", err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}
