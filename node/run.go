package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ordo-relay/ordo/internal/nodehook"
	"github.com/ordo-relay/ordo/lease"
	"github.com/ordo-relay/ordo/membership"
	"github.com/ordo-relay/ordo/relay"
	"github.com/ordo-relay/ordo/relay/pgstore"
	"github.com/ordo-relay/ordo/wire"
)

// Run builds the node, starts it, and blocks until ctx ends or one of its
// components fails. It starts in stages, and stops them in reverse order:
//
//	services  the broker connection, the HTTP server, backlog and health
//	gossip    membership (when clustered)
//	leases    the Leaser
//	relay     the Relay
//
// so that on the way down the relay stops reading and settles its
// confirms, then the leases are released, then the node leaves the gossip
// cluster, and last the broker connection and the HTTP server close.
// Before any stage starts, every source's database is tried once and one
// of them must be migrated (migrations.awaitStart); a source's leaser,
// relay and backlog wait for its own migration, so that a source down at
// start holds back only itself. Run returns the error of every component
// that failed (errors.Join), or the fatal migration errors of the
// sources (fatalMigrateError); ctx's end is not an error.
func Run(ctx context.Context, cfg Config, opts Options) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	logger := opts.Logger
	if logger == nil {
		logger = slog.Default()
	}
	if cfg.Gossip.BindAddr != "" && cfg.Gossip.Insecure {
		logger.Warn("gossip is not encrypted (Gossip.Insecure, -gossip-insecure): any host that reaches the gossip address can join the cluster and take partitions; give the node a gossip key",
			"gossip", cfg.Gossip.BindAddr)
	}
	srcs, err := openSources(ctx, cfg, logger)
	if err != nil {
		return err
	}
	defer func() {
		for _, s := range srcs {
			s.pool.Close()
		}
	}()
	migs := startMigrations(ctx, srcs)
	defer migs.stop()
	if err := migs.awaitStart(ctx); err != nil || ctx.Err() != nil {
		return err
	}
	n, err := build(cfg, opts, nodehook.From(ctx), logger, srcs)
	if err != nil {
		return err
	}
	n.migs = migs
	if n.hooks.Built != nil {
		n.hooks.Built(n.parts())
	}
	return n.run(ctx, opts.Ready)
}

// built is a node's components, built and not yet started.
type built struct {
	cfg     Config
	hooks   nodehook.Hooks // tests only (internal/nodehook)
	logger  *slog.Logger
	members *membership.Membership // nil when the node runs alone
	broker  broker
	health  *healthMonitor
	srcs    []*source // in Config order; the first is the one-source form's
	migs    *migrations
	ln      net.Listener
	srv     *http.Server
}

// openPool opens a source's relay pool, and returns the configuration of
// the connections the leaser and the health monitor open for themselves.
func openPool(ctx context.Context, cfg Config, url string) (*pgxpool.Pool, *pgx.ConnConfig, error) {
	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, nil, fmt.Errorf("postgres-url: %w", err)
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
		return nil, nil, fmt.Errorf("open PostgreSQL pool: %w", err)
	}
	return pool, leaseConn, nil
}

// build makes every component. What can fail (a configuration refused, a
// port taken) is checked before gossip starts listening: a Membership is
// only shut down by its Run, so a failure after it costs a leave.
func build(cfg Config, opts Options, hooks nodehook.Hooks, logger *slog.Logger, srcs []*source) (*built, error) {
	b := &built{cfg: cfg, logger: logger, hooks: hooks, srcs: srcs}
	lcfgs := make([]lease.Config, len(srcs))
	for i, s := range srcs {
		connect, err := leaseConnect(hooks, s)
		if err != nil {
			return nil, err
		}
		lcfg := cfg.timing().Config()
		lcfg.Node, lcfg.Want, lcfg.Connect, lcfg.Logger = cfg.NodeName, b.want(s), connect, s.logger
		if err := lcfg.Validate(); err != nil {
			return nil, err
		}
		lcfgs[i] = lcfg
	}
	var err error
	if b.ln, err = net.Listen("tcp", cfg.HTTPAddr); err != nil {
		return nil, fmt.Errorf("http-addr: %w", err)
	}
	if cfg.Gossip.BindAddr != "" {
		if b.members, err = membership.New(cfg.membershipConfig(logger, hooks.GossipTransport)); err != nil {
			return nil, b.abandon(err)
		}
		for i, s := range srcs {
			lcfgs[i].Wake = s.wake
		}
		if len(srcs) == 1 {
			lcfgs[0].Wake = b.members.Changed() // no fan-out needed
		}
	}
	if b.broker, err = cfg.newBroker(logger); err != nil {
		return nil, b.abandon(err) // Config.Validate checked it: not expected
	}
	b.health = newHealthMonitor(cfg, b.broker, srcs, b.members, logger)
	pm := newPublishFamilies()
	pub := hooks.Publisher(b.broker)
	var budget *relay.Budget
	if len(srcs) > 1 && !hooks.UnsharedBudget {
		// The sources' relays share the node's W and read-ahead, fairly
		// and work-conserving (relay.Budget; docs/design.md, "Sharing W").
		// Only the bench's A/B runs without it (nodehook).
		budget = relay.NewBudget(cfg.Relay.Window, cfg.Relay.ReadAheadBytes)
	}
	for i, s := range srcs {
		if s.leaser, err = lease.New(lcfgs[i]); err != nil {
			return nil, b.abandon(err)
		}
		rc := cfg.relayConfig(s.logger)
		rc.Budget = budget
		rc.TracerProvider = opts.TracerProvider
		spub := observedPublisher{Publisher: stampSource{Publisher: pub, name: s.name}, m: pm.forSource(s.name, b.broker.TimedOut)}
		var store relay.Store = pgstore.New(s.pool, rc.Node, s.logger)
		if s.table != nil {
			if store, err = newTableStore(cfg, s, rc.Node, s.logger); err != nil {
				return nil, b.abandon(err) // Config.Validate checked it: not expected
			}
		}
		store = hooks.Store(store)
		if s.relay, err = relay.New(rc, store, spub, hooks.Ownership(s.leaser)); err != nil {
			return nil, b.abandon(err) // Config.Validate checked it: not expected
		}
		q := outboxBacklog
		if s.table != nil {
			q = tableBacklog
		}
		s.backlog = newBacklog(s.pool, q, cfg.BacklogInterval, s.logger)
	}
	v := &view{cfg: cfg, srcs: srcs, broker: b.broker, members: b.members, health: b.health, logger: logger, budget: budget}
	b.srv = newHTTPServer(newHTTP(v, pm), cfg.PProf, logger)
	return b, nil
}

// abandon closes what build opened before err, and returns err.
func (b *built) abandon(err error) error {
	if b.ln != nil {
		b.ln.Close()
	}
	if b.members != nil {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_ = b.members.Run(ctx) // with ctx over: leave and shut down; its error is about joining
	}
	return err
}

// want returns the leaser's Want of source s: every partition when the
// node runs alone; in a cluster, this node's share of s in the
// assignment over (source, partition) pairs (assignSources), and nothing
// before it has joined. With one source named default it is
// partition.Assign's share, as before sources existed.
func (b *built) want(s *source) func() []int {
	return func() []int {
		if b.members == nil {
			all := make([]int, s.partitions)
			for i := range all {
				all[i] = i
			}
			return all
		}
		if !b.members.Joined() {
			return nil
		}
		return assignSources(b.members, b.cfg.sources())[s.name].Owned(b.cfg.NodeName)
	}
}

// fanOut passes each membership change on to every source's leaser,
// until ctx ends: memberlist's one Changed channel wakes one reader.
func (b *built) fanOut(ctx context.Context) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-b.members.Changed():
		}
		for _, s := range b.srcs {
			select {
			case s.wake <- struct{}{}:
			default:
			}
		}
	}
}

// run starts the stages, waits for ctx's end or a component's failure, and
// stops the stages in reverse order.
func (b *built) run(ctx context.Context, ready func(httpAddr string)) error {
	running, fail := context.WithCancelCause(ctx)
	defer fail(nil)
	st := &stages{fail: fail, logger: b.logger}
	services := []component{{"broker", b.broker.Run}, {"http", serveHTTP(b.srv, b.ln)}}
	for _, s := range b.srcs {
		services = append(services, component{b.named("backlog", s), s.afterMigrated(s.backlog.Run)})
	}
	st.start("services", append(services, component{"health", b.health.Run}, component{"migrations", b.migs.Run})...)
	if b.members != nil {
		gossip := []component{{"gossip", b.runGossip}}
		if len(b.srcs) > 1 {
			gossip = append(gossip, component{"gossip fan-out", b.fanOut})
		}
		st.start("gossip", gossip...)
	}
	var leasers, relays []component
	for _, s := range b.srcs {
		leasers = append(leasers, component{b.named("leases", s), s.afterMigrated(s.leaser.Run)})
		relays = append(relays, component{b.named("relay", s), s.afterMigrated(relayRun(b.hooks, s.relay))})
		if s.table != nil {
			relays = append(relays, component{b.named("intake", s), s.afterMigrated(s.table.intake.Run)})
		}
	}
	st.start("leases", leasers...)
	st.start("relay", relays...).after = func() {
		for _, s := range b.srcs {
			if s.isMigrated() {
				s.logger.Info("relay stopped; releasing leases", "stats", fmt.Sprintf("%+v", s.relay.Stats()))
			}
		}
	}
	b.logger.Info("node started", "http", b.ln.Addr().String(), "gossip", b.cfg.Gossip.BindAddr,
		"partitions", b.cfg.Partitions, "confirm_window", b.cfg.Relay.Window, "sources", sourceNames(b.cfg.sources()),
		"source_partitions", sourceCounts(b.srcs), "waiting", waiting(b.srcs))
	if ready != nil {
		ready(b.ln.Addr().String())
	}
	<-running.Done()
	// The migrations still trying stop first: one that ended now would
	// start its leaser while the node goes down, and say the source is
	// reachable while the node leaves the cluster.
	b.migs.stop()
	return st.stop()
}

// runGossip runs membership until ctx ends. A source whose database the
// cluster knows under another name, or whose name it knows for another
// database (membership.ConflictError: checked as the node joins, and as
// a source's database first answers), stops the node; the error then
// says this node's identities in full.
func (b *built) runGossip(ctx context.Context) error {
	err := b.members.Run(ctx)
	var ce *membership.ConflictError
	if !errors.As(err, &ce) {
		return err
	}
	var mine []string
	for _, s := range b.srcs {
		if s.identity != "" && slices.ContainsFunc(ce.Conflicts, func(c membership.Conflict) bool { return c.Source == s.name }) {
			mine = append(mine, fmt.Sprintf("%s is %s", s.name, s.identity))
		}
	}
	return fmt.Errorf("refused to join: %w (this node's %s)", err, strings.Join(mine, "; "))
}

// named returns a component's name for source s: name alone in the
// one-source form, "name (source s)" otherwise.
func (b *built) named(name string, s *source) string {
	if len(b.srcs) == 1 && s.name == wire.DefaultSource {
		return name
	}
	return name + " (source " + s.name + ")"
}

// serveHTTP is the HTTP server as a component: it serves on ln until ctx
// ends, then shuts down, giving requests under way 5 s.
func serveHTTP(srv *http.Server, ln net.Listener) func(context.Context) error {
	return func(ctx context.Context) error {
		served := make(chan error, 1)
		go func() { served <- srv.Serve(ln) }()
		select {
		case err := <-served:
			return err // never ErrServerClosed: only Shutdown below closes it
		case <-ctx.Done():
		}
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		err := srv.Shutdown(sctx)
		if serr := <-served; !errors.Is(serr, http.ErrServerClosed) {
			err = errors.Join(err, serr)
		}
		return err
	}
}
