package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/errgroup"

	"github.com/ordo-relay/ordo/lease"
	"github.com/ordo-relay/ordo/membership"
	"github.com/ordo-relay/ordo/outbox"
	"github.com/ordo-relay/ordo/partition"
	"github.com/ordo-relay/ordo/relay"
	"github.com/ordo-relay/ordo/relay/pgstore"
	"github.com/ordo-relay/ordo/relay/rabbitmq"
)

// Run starts the node and blocks until ctx ends, then shuts down in order:
// the relay stops reading and settles its confirms, the leases are
// released, the node leaves the gossip cluster, and the broker connection
// and HTTP server close.
func Run(ctx context.Context, cfg Config, opts Options) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	logger := opts.Logger
	if logger == nil {
		logger = slog.Default()
	}
	pcfg, err := pgxpool.ParseConfig(cfg.PostgresURL)
	if err != nil {
		return fmt.Errorf("postgres-url: %w", err)
	}
	pcfg.MaxConns = int32(cfg.DBMaxConns)
	// Every session of the node carries its name (pg_stat_activity), unless
	// the URL names them itself; the broker connection does too.
	if pcfg.ConnConfig.RuntimeParams["application_name"] == "" {
		pcfg.ConnConfig.RuntimeParams["application_name"] = "ordo node " + cfg.NodeName
	}
	// The leaser's connection commits every claim and renewal durably.
	leaseConn := pcfg.ConnConfig.Copy()
	leaseConn.RuntimeParams["synchronous_commit"] = "on"
	// The relay's marks and failure records need not wait for the WAL
	// flush: a mark lost in a database crash only means the row is
	// published again, with the same message-id (at least once). This
	// halves what a mark costs.
	pcfg.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
	// A relay read that outlives its timeout is cancelled on the server
	// too (pgx's default only closes the socket, and PostgreSQL would run
	// the statement to its end).
	pcfg.ConnConfig.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.CancelRequestContextWatcherHandler{Conn: c, DeadlineDelay: 2 * time.Second}
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return fmt.Errorf("open PostgreSQL pool: %w", err)
	}
	defer pool.Close()
	if err := migrate(ctx, pool, cfg.Partitions, logger); err != nil {
		return err
	}

	// Who should own what: everything when alone, the assignment over the
	// live members when clustered.
	var members *membership.Membership
	wake := make(chan struct{}, 1)
	want := func() []int {
		all := make([]int, cfg.Partitions)
		for i := range all {
			all[i] = i
		}
		return all
	}
	if cfg.Gossip.BindAddr != "" {
		members, err = membership.New(cfg.membership(logger, opts.GossipTransport))
		if err != nil {
			return err
		}
		want = func() []int {
			if !members.Joined() {
				return nil // not yet part of the cluster: want nothing
			}
			// Live members, less those stepped aside for a healthier
			// peer (this one included).
			a, err := partition.Assign(members.Eligible(), cfg.Partitions)
			if err != nil {
				return nil
			}
			return a.Owned(cfg.NodeName)
		}
	}

	var rl *relay.Relay
	var rlMu sync.Mutex // rl is set after the leaser is built
	leaser, err := partition.NewLeaser(partition.LeaserConfig{
		Node:   cfg.NodeName,
		TTL:    cfg.LeaseTTL,
		Want:   want,
		Wake:   wake,
		Logger: logger,
		Drained: func(p int) bool {
			rlMu.Lock()
			defer rlMu.Unlock()
			return rl == nil || rl.Drained(p)
		},
		Connect: func(ctx context.Context) (*pgx.Conn, error) {
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			return pgx.ConnectConfig(cctx, leaseConn.Copy())
		},
	})
	if err != nil {
		return err
	}
	amqpPub := rabbitmq.New(cfg.amqp(logger))
	health := newHealthMonitor(cfg, amqpPub, func(ctx context.Context) (*pgx.Conn, error) {
		return pgx.ConnectConfig(ctx, leaseConn.Copy())
	}, members, logger)
	var pub relay.Publisher = amqpPub
	if opts.WrapPublisher != nil {
		pub = opts.WrapPublisher(pub)
	}
	pm := newPublishMetrics()
	pub = observedPublisher{Publisher: pub, m: pm}
	store := pgstore.New(pool, logger)
	r, err := relay.New(opts.relayConfig(cfg.relay(logger)), store, pub, leaser)
	if err != nil {
		return err
	}
	rlMu.Lock()
	rl = r
	rlMu.Unlock()

	ln, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		return fmt.Errorf("http-addr: %w", err)
	}
	backlog := NewBacklog(pool, cfg.BacklogInterval, logger)
	v := &view{cfg: cfg, pool: pool, pub: amqpPub, leaser: leaser, members: members, health: health, relay: r, backlog: backlog, logger: logger}
	srv := newHTTPServer(newHTTP(v, pm), cfg.PProf, logger)

	// Background services outlive the relay: they stop only after it has
	// settled, so nothing is published under a released lease.
	bgCtx, stopBG := context.WithCancel(context.Background())
	defer stopBG()
	leaseCtx, stopLeases := context.WithCancel(context.Background())
	defer stopLeases()
	gossipCtx, stopGossip := context.WithCancel(context.Background())
	defer stopGossip()
	var bg errgroup.Group
	bg.Go(func() error { return amqpPub.Run(bgCtx) })
	bg.Go(func() error { return backlog.Run(bgCtx) })
	bg.Go(func() error { return health.Run(bgCtx) })
	bg.Go(func() error {
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("http: %w", err)
		}
		return nil
	})
	// A gossip failure (no seed reachable) stops the node.
	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	gossipDone := make(chan error, 1)
	if members != nil {
		go func() {
			err := members.Run(gossipCtx)
			if err != nil {
				stopRun()
			}
			gossipDone <- err
		}()
		// Forward membership changes to the leaser as plain signals.
		bg.Go(func() error {
			for {
				select {
				case <-bgCtx.Done():
					return nil
				case <-members.Changed():
					select {
					case wake <- struct{}{}:
					default:
					}
				}
			}
		})
	} else {
		gossipDone <- nil
	}
	leaseDone := make(chan error, 1)
	go func() { leaseDone <- leaser.Run(leaseCtx) }()
	logger.Info("node started", "http", ln.Addr().String(), "gossip", cfg.Gossip.BindAddr,
		"partitions", cfg.Partitions, "confirm_window", cfg.Relay.Window)
	if opts.Ready != nil {
		opts.Ready(ln.Addr().String())
	}

	relayErr := r.Run(runCtx)
	logger.Info("relay stopped; releasing leases", "stats", fmt.Sprintf("%+v", r.Stats()))
	stopLeases()
	leaseErr := <-leaseDone
	stopGossip()
	gossipErr := <-gossipDone
	stopBG()
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	httpErr := srv.Shutdown(sctx)
	return errors.Join(relayErr, leaseErr, gossipErr, bg.Wait(), httpErr)
}

// migrate applies the outbox migrations, then the lease migrations,
// retrying while PostgreSQL is unreachable, and refusing at once on a
// partition count mismatch (outbox.Migrate checks it first).
func migrate(ctx context.Context, pool *pgxpool.Pool, partitions int, logger *slog.Logger) error {
	for attempt := 1; ; attempt++ {
		err := outbox.Migrate(ctx, pool, partitions)
		if err == nil {
			err = lease.Migrate(ctx, pool, partitions)
		}
		if err == nil || errors.Is(err, outbox.ErrPartitionMismatch) || ctx.Err() != nil {
			return err
		}
		if attempt == 1 || attempt%10 == 0 {
			logger.Warn("cannot migrate the schema yet; retrying", "attempt", attempt, "err", err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}
