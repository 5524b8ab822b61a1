package node

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/ordo-relay/ordo/internal/backoff"
	"github.com/ordo-relay/ordo/internal/pgmigrate"
	"github.com/ordo-relay/ordo/lease"
	"github.com/ordo-relay/ordo/membership"
	"github.com/ordo-relay/ordo/outbox"
)

// The waits between a source's migration attempts (backoff, with
// jitter): a database down at start is tried again soon, and one down for
// long about every 5 s.
const (
	migrateRetryMin = 500 * time.Millisecond
	migrateRetryMax = 5 * time.Second
)

// startGrace bounds how long a node waits for every source's first
// migration attempt before it starts with the sources migrated by then:
// the first bound of a connect (connectTimeoutMin), so that a database
// that does not answer at all has been tried once.
const startGrace = connectTimeoutMin

// migrations migrates every source's database, each on its own, retrying
// while it cannot be reached, so that a source down at start holds back
// only itself (docs/design.md, "A source down at start"). A source's
// leaser, relay and backlog start once its migration has succeeded
// (source.migrated); until then its health says unreachable. An error
// that trying again cannot mend (fatalMigrateError) ends that source's
// attempts and stops the node: before it starts (awaitStart), or while
// it runs (Run, a component of the services stage).
//
// Its goroutines, one a source, are owned by Run: stop cancels them and
// waits for them.
type migrations struct {
	srcs   []*source
	cancel context.CancelFunc
	wg     sync.WaitGroup
	tried  []chan struct{} // per source: closed when its first attempt has ended
	any    chan struct{}   // closed when a source has been migrated
	failed chan struct{}   // closed when a source has failed for good

	mu       sync.Mutex
	errs     []error  // per source: its fatal error, or nil
	ids      []string // per source: its database identity, once checked against the others'
	anyOnce  sync.Once
	failOnce sync.Once
}

// startMigrations starts migrating every source of srcs, each in a
// goroutine of its own, until ctx ends or stop is called.
func startMigrations(ctx context.Context, srcs []*source) *migrations {
	ctx, cancel := context.WithCancel(ctx)
	m := &migrations{srcs: srcs, cancel: cancel, any: make(chan struct{}), failed: make(chan struct{}),
		tried: make([]chan struct{}, len(srcs)), errs: make([]error, len(srcs)), ids: make([]string, len(srcs))}
	for i, s := range srcs {
		m.tried[i] = make(chan struct{})
		m.wg.Add(1)
		go func() {
			defer m.wg.Done()
			m.migrateSource(ctx, i, s)
		}()
	}
	return m
}

// stop cancels the migrations still trying and waits for them.
func (m *migrations) stop() {
	m.cancel()
	m.wg.Wait()
}

// awaitStart waits until every source has been tried once (or
// startGrace has passed: an attempt may wait on another node's migration
// lock, or on a link that stalled after connecting) and one source has
// been migrated: with one source, until it is migrated, as before
// sources. It returns the fatal errors of the sources tried by then
// (errors.Join, in Config order), or nil if ctx ended first.
func (m *migrations) awaitStart(ctx context.Context) error {
	grace := time.NewTimer(startGrace)
	defer grace.Stop()
tried:
	for _, t := range m.tried {
		select {
		case <-t:
		case <-grace.C:
			break tried
		case <-ctx.Done():
			return nil
		}
	}
	if err := m.err(); err != nil {
		return err
	}
	select {
	case <-m.any:
		return m.err() // a source may have failed for good meanwhile
	case <-m.failed:
		return m.err()
	case <-ctx.Done():
		return nil
	}
}

// Run returns the fatal error of a source migrated after the node
// started, or nil when ctx ends.
func (m *migrations) Run(ctx context.Context) error {
	select {
	case <-m.failed:
		return m.err()
	case <-ctx.Done():
		return nil
	}
}

// err returns every source's fatal error, joined in Config order.
func (m *migrations) err() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return errors.Join(m.errs...)
}

// migrateSource migrates the i-th source s, attempt after attempt, until
// it succeeds, fails for good, or ctx ends.
func (m *migrations) migrateSource(ctx context.Context, i int, s *source) {
	bo := backoff.New(migrateRetryMin, migrateRetryMax)
	defer m.triedOnce(i) // also when ctx ended during the first attempt
	for attempt := 1; ; attempt++ {
		err := s.migrate(ctx)
		if err == nil {
			err = m.claimDatabase(i, s)
		}
		switch {
		case err == nil:
			close(s.migrated)
			m.anyOnce.Do(func() { close(m.any) })
			if attempt > 1 {
				s.logger.Info("schema migrated; the source's leases and relay start", "attempts", attempt)
			}
			return
		case ctx.Err() != nil:
			return
		case fatalMigrateError(err):
			m.mu.Lock()
			m.errs[i] = s.migrateError(err)
			m.mu.Unlock()
			m.failOnce.Do(func() { close(m.failed) })
			return
		}
		if attempt == 1 || attempt%10 == 0 {
			msg := "cannot migrate the schema yet; retrying (the source's partitions wait, every other source relays)"
			if len(m.srcs) == 1 {
				msg = "cannot migrate the schema yet; retrying"
			}
			s.logger.Warn(msg, "attempt", attempt, "err", err)
		}
		m.triedOnce(i)
		if !backoff.Sleep(ctx, bo.Next()) {
			return
		}
	}
}

// ErrSameDatabase is wrapped by the error that stops a node two of whose
// sources are one database: two leasers on one ordo_leases, and every row
// published twice under two x-ordo-source values, which consumers would
// handle twice.
var ErrSameDatabase = errors.New("two sources are the same database")

// claimDatabase records the database identity of the i-th source s, just
// migrated, and fails (for good) when another source of the node has the
// same one, naming both.
func (m *migrations) claimDatabase(i int, s *source) error {
	if s.identity == "" {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for j, id := range m.ids {
		if j != i && id == s.identity {
			return fmt.Errorf("sources %s and %s are one database (%s): give each source its own database: %w",
				m.srcs[j].name, s.name, s.identity, ErrSameDatabase)
		}
	}
	m.ids[i] = s.identity
	return nil
}

// triedOnce records that the i-th source's first attempt has ended.
func (m *migrations) triedOnce(i int) {
	select {
	case <-m.tried[i]:
	default:
		close(m.tried[i])
	}
}

// migrate applies the outbox migrations, then the lease migrations, to
// the source's database, on a connection of the source's own
// (source.connect: bounded, and longer after connects that ran out of
// time, so that a database that does not answer costs an attempt of at
// most 5 to 40 s and a shutdown ends it at once).
//
// The whole attempt is bounded too (migrateAttemptMax): the server ends
// its own waits (pgmigrate.Lock's lock, statement and idle timeouts), but
// a link that stalls after the connect answers nothing, and the attempt
// would otherwise wait for TCP keepalive. Such an attempt fails as
// transient, is logged, and is tried again.
func (s *source) migrate(ctx context.Context) error {
	bound := cmp.Or(s.migrateMax, migrateAttemptMax)
	actx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	err := s.migrateOnce(actx)
	if err != nil && actx.Err() != nil && ctx.Err() == nil {
		return fmt.Errorf("migration attempt ran out of its %v: %w", bound, err)
	}
	return err
}

// migrateAttemptMax bounds one migration attempt (source.migrate): the
// longest connect (connectTimeout), a wait for the migration lock
// (pgmigrate.LockTimeout), a statement (pgmigrate.StatementTimeout), and
// room for the rest.
const migrateAttemptMax = 8*connectTimeoutMin + pgmigrate.LockTimeout + pgmigrate.StatementTimeout + time.Minute

func (s *source) migrateOnce(ctx context.Context) error {
	conn, err := s.connect(ctx)
	if err != nil {
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = conn.Close(cctx)
		cancel()
	}()
	// A source relaying an adopted table gets none of Ordo's own outbox
	// tables: the user's table may well be named outbox.
	if s.table == nil {
		if err := outbox.Migrate(ctx, conn, s.partitions); err != nil {
			return err
		}
	}
	if err := lease.Migrate(ctx, conn, s.partitions); err != nil {
		return err
	}
	if s.table != nil {
		if err := migrateTable(ctx, conn, s.table.layout, s.partitions); err != nil {
			return err
		}
	}
	return s.readIdentity(ctx, conn)
}

// readIdentity sets s.identity to its database's identity: the server's
// system identifier and the database's oid, the same whatever URL, host
// name or port reaches it; and s.idToken to the token gossiped for it
// (membership.DatabaseIdentity), which the cluster's nodes compare
// (docs/design.md, "One database, one name"). A role that may not read
// the server's control data leaves both unknown (""), and the checks of
// claimDatabase and of the cluster with them.
func (s *source) readIdentity(ctx context.Context, conn *pgx.Conn) error {
	var sysid, oid int64
	err := conn.QueryRow(ctx, `SELECT (SELECT system_identifier FROM pg_control_system()),
       (SELECT oid::int8 FROM pg_database WHERE datname = current_database())`).Scan(&sysid, &oid)
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == "42501":
		s.logger.Warn("cannot read the server's system identifier; two sources on one database are not detected", "err", err)
		return nil
	case err != nil:
		return fmt.Errorf("read database identity: %w", err)
	}
	s.idToken = membership.DatabaseIdentity(uint64(sysid), uint32(oid))
	s.identity = fmt.Sprintf("system identifier %d, database oid %d, gossiped as %s", uint64(sysid), oid, s.idToken)
	return nil
}

// migrateError is err, a fatal migration error of s, as Run returns it:
// naming the source, and with the count to set on a partition count
// mismatch of Config.Sources (mismatchHint).
func (s *source) migrateError(err error) error {
	if s.explicit {
		if err := mismatchHint(err, s.name); err != nil {
			return err
		}
	}
	return s.errorf("%w", err)
}

// fatalMigrateError reports whether a migration error is one that trying
// again cannot mend, so that the node stops with it rather than wait:
//
//   - a partition count other than the installed one
//     (outbox.ErrPartitionMismatch);
//   - a schema newer than this binary (pgmigrate.ErrNewerSchema);
//   - PostgreSQL refusing the login (SQLSTATE class 28: a wrong password,
//     no pg_hba.conf entry) or a database that does not exist (3D000):
//     the URL is the node's configuration, and only a restart changes it;
//   - a migration statement refused (class 42: no privilege to create a
//     table, an object in the way): it fails the same way every time.
//
// Anything else is taken as transient and tried again: no connection, a
// timeout, a server starting or shutting down (57P01, 57P03), too many
// connections (53300), a lock or serialization failure.
func fatalMigrateError(err error) bool {
	if errors.Is(err, outbox.ErrPartitionMismatch) || errors.Is(err, pgmigrate.ErrNewerSchema) || errors.Is(err, ErrSameDatabase) {
		return true
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	return strings.HasPrefix(pgErr.Code, "28") || strings.HasPrefix(pgErr.Code, "42") || pgErr.Code == "3D000"
}
