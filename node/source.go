package node

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ordo-relay/ordo/internal/backoff"
	"github.com/ordo-relay/ordo/lease"
	"github.com/ordo-relay/ordo/outbox"
	"github.com/ordo-relay/ordo/relay"
	"github.com/ordo-relay/ordo/wire"
)

// source is what a node builds for one outbox database: everything that
// the database fences (docs/design.md, "Sources"). The node's broker
// connection, gossip and HTTP server are shared by every source.
type source struct {
	name       string
	pool       *pgxpool.Pool
	leaseConn  *pgx.ConnConfig // the leaser's and the health ping's connections
	slowConns  atomic.Int32    // consecutive connects of leaseConn that ran out of time (connectTimeout)
	connectMin time.Duration   // the first bound of connect (0: connectTimeoutMin; tests shorten it)
	migrateMax time.Duration   // the bound of a migration attempt (0: migrateAttemptMax; tests shorten it)
	identity   string          // its database's identity, read by its migration (source.readIdentity); "" unknown
	idToken    string          // the same, as gossiped (membership.DatabaseIdentity); "" unknown
	logger     *slog.Logger    // the node's, with a "source" attribute when it has several
	wake       chan struct{}   // membership changes, fanned out to this source's leaser
	leaser     *lease.Leaser
	relay      *relay.Relay
	backlog    *Backlog
	table      *tableSource // the adopted table it relays; nil: Ordo's own outbox

	// partitions is P, as installed in its database (Config.sources
	// resolves it).
	partitions int
	// migrated is closed once the source's schema has been migrated
	// (migrations.migrateSource); explicit: the source comes from
	// Config.Sources, not the one-source form.
	migrated chan struct{}
	explicit bool
}

// openSources opens a pool per source (it connects when first used);
// on an error it closes what it opened. The databases are migrated
// afterwards, each on its own (startMigrations).
func openSources(ctx context.Context, cfg Config, logger *slog.Logger) ([]*source, error) {
	srcs := cfg.sources()
	out := make([]*source, 0, len(srcs))
	for _, sc := range srcs {
		s := &source{name: sc.Name, partitions: sc.Partitions, logger: logger, wake: make(chan struct{}, 1),
			migrated: make(chan struct{}), explicit: len(cfg.Sources) > 0}
		if l, ok := tableLayout(sc); ok {
			s.table = &tableSource{layout: l}
		}
		if len(srcs) > 1 || sc.Name != wire.DefaultSource {
			s.logger = logger.With("source", sc.Name)
		}
		var err error
		if s.pool, s.leaseConn, err = openPool(ctx, cfg, sc.PostgresURL); err != nil {
			for _, o := range out {
				o.pool.Close()
			}
			return nil, s.errorf("%w", err)
		}
		out = append(out, s)
	}
	return out, nil
}

// isMigrated reports whether the source's schema has been migrated: its
// leaser, relay and backlog run, and its health may say reachable.
func (s *source) isMigrated() bool {
	select {
	case <-s.migrated:
		return true
	default:
		return false
	}
}

// afterMigrated returns run as a component of source s: it waits for the
// source's migration, then runs; it returns nil if ctx ends first.
func (s *source) afterMigrated(run func(context.Context) error) func(context.Context) error {
	return func(ctx context.Context) error {
		select {
		case <-s.migrated:
			if ctx.Err() != nil { // both ready at once: stopping wins
				return nil
			}
			return run(ctx)
		case <-ctx.Done():
			return nil
		}
	}
}

// mismatchHint returns, when err (a migration error of the source named
// name) is a *outbox.PartitionMismatchError, the same mismatch with a
// hint naming the source's own count (its hint, the node's count, would
// change every source without a count of its own); else nil.
func mismatchHint(err error, name string) error {
	var pm *outbox.PartitionMismatchError
	if !errors.As(err, &pm) {
		return nil
	}
	return &sourceMismatchError{source: name, err: pm}
}

// sourceMismatchError is a partition count mismatch of one source of
// Config.Sources. It unwraps to the *outbox.PartitionMismatchError, so
// errors.Is(err, outbox.ErrPartitionMismatch) holds.
type sourceMismatchError struct {
	source string
	err    *outbox.PartitionMismatchError
}

func (e *sourceMismatchError) Error() string {
	return fmt.Sprintf("source %s: outbox was installed with %d partitions but this node is configured with %d for this source; "+
		"the partition count cannot change after install (set Sources[%s].Partitions: node -source-partitions %s=%d, ORDO_SOURCE_PARTITIONS)",
		e.source, e.err.Installed, e.err.Configured, e.source, e.source, e.err.Installed)
}

func (e *sourceMismatchError) Unwrap() error { return e.err }

// errorf formats an error of the source, naming it when it is not the
// one-source form's.
func (s *source) errorf(format string, args ...any) error {
	err := fmt.Errorf(format, args...)
	if s.name == wire.DefaultSource {
		return err
	}
	return fmt.Errorf("source %s: %w", s.name, err)
}

// connect opens a connection of the source's own (the leaser's, the
// health ping's), bounded by connectTimeout of the connects of the source
// that ran out of time in a row.
func (s *source) connect(ctx context.Context) (*pgx.Conn, error) {
	slow := s.slowConns.Load()
	cctx, cancel := context.WithTimeout(ctx, connectTimeout(int(slow), cmp.Or(s.connectMin, connectTimeoutMin)))
	defer cancel()
	conn, err := pgx.ConnectConfig(cctx, s.leaseConn.Copy())
	switch {
	case err == nil:
		s.slowConns.Store(0)
	case cctx.Err() != nil && ctx.Err() == nil:
		s.slowConns.CompareAndSwap(slow, slow+1)
	}
	return conn, err
}

// connectTimeoutMin is the first bound of a connect of the source's own
// connections (connect, connectTimeout).
const connectTimeoutMin = 5 * time.Second

// connectTimeout is the bound of a connect after slow connects in a row
// ran out of time: lo, doubled for each, up to 8·lo (5 s to 40 s). A
// server that takes longer than a fixed bound to start a session (a
// PostgreSQL just restarted, on a loaded machine: 5-20 s) is never
// reached by connects that give up at that bound and start over, each
// costing it a session start of its own; one that refuses or
// resets fails fast whatever the bound.
func connectTimeout(slow int, lo time.Duration) time.Duration {
	return backoff.Doubled(slow, lo, 8*lo)
}

// stampSource is the relay.Publisher of one source: it sets each
// message's Source before the node's publisher sends it, so that every
// message carries wire.HeaderSource, wire.DefaultSource's included
// (docs/design.md, "Sources": explicit beats implied; a consumer reads an
// absent header as default, which is what older nodes sent).
type stampSource struct {
	relay.Publisher
	name string
}

var (
	_ relay.Publisher = stampSource{}
	_ relay.Flusher   = stampSource{}
)

// Flush implements relay.Flusher.
func (p stampSource) Flush() { relay.Flush(p.Publisher) }

// Publish implements relay.Publisher.
func (p stampSource) Publish(ctx context.Context, msg *relay.Message, settle func(relay.Result)) error {
	msg.Source = p.name
	return p.Publisher.Publish(ctx, msg, settle)
}
