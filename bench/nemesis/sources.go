package nemesis

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ordo-relay/ordo/bench/internal/harness"
	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/lease"
	"github.com/ordo-relay/ordo/outbox"
	"github.com/ordo-relay/ordo/wire"
)

// sourceNames are the relay scenario's sources, in order: the first is
// the rig's database (what a one-source run relays, as -postgres-url's
// default), the second a database of the run's own. Their order is the
// index plannedStep.Source names.
var sourceNames = []string{wire.DefaultSource, "billing"}

// runDB is one source's outbox database: the nodes relay it (each through
// a proxy of its own), its order API writes to it, and the bench commits
// its probes and planted rows to it.
type runDB struct {
	name   string        // the source's name, as x-ordo-source says
	dbName string        // the database's name
	url    string        // its URL, direct (the order API and the bench use it)
	pool   *pgxpool.Pool // the bench's statements on it
	api    *harness.Node // its order API, once started
}

// openSources returns the run's count databases: the rig's, named
// default, and for the second a database created next to it (named after
// the rig, with the outbox and the leases installed, dropped at the rig's
// Close).
func openSources(ctx context.Context, r *harness.Rig, count int) ([]*runDB, error) {
	dbs := []*runDB{{name: sourceNames[0], dbName: r.Name, url: r.DBURL, pool: r.Pool}}
	for _, name := range sourceNames[1:count] {
		db, err := createSource(ctx, r, name)
		if err != nil {
			return nil, err
		}
		dbs = append(dbs, db)
	}
	return dbs, nil
}

// createSource creates source name's database, <rig>_<name>, migrated,
// with a pool on it; both are removed at the rig's Close.
func createSource(ctx context.Context, r *harness.Rig, name string) (*runDB, error) {
	sctx, cancel := context.WithTimeout(ctx, harness.SetupTimeout)
	defer cancel()
	db := &runDB{name: name, dbName: r.Name + "_" + name}
	var drop func(context.Context) error
	var err error
	if db.url, drop, err = testkit.CreateDatabase(sctx, r.Config.PostgresURL, db.dbName); err != nil {
		return nil, err
	}
	r.OnClose("drop database "+db.dbName, drop)
	cfg, err := pgxpool.ParseConfig(db.url)
	if err != nil {
		return nil, fmt.Errorf("source %s: %w", name, err)
	}
	cfg.MaxConns = 4
	cfg.ConnConfig.RuntimeParams["application_name"] = harness.AppBench
	if db.pool, err = pgxpool.NewWithConfig(sctx, cfg); err != nil {
		return nil, fmt.Errorf("open pool on %s: %w", db.dbName, err)
	}
	r.OnClose("close pool on "+db.dbName, func(context.Context) error { db.pool.Close(); return nil })
	if err := outbox.Migrate(sctx, db.pool, r.Config.Partitions); err != nil {
		return nil, fmt.Errorf("migrate %s: %w", db.dbName, err)
	}
	if err := lease.Migrate(sctx, db.pool, r.Config.Partitions); err != nil {
		return nil, fmt.Errorf("migrate %s: %w", db.dbName, err)
	}
	return db, nil
}

// sourceIndex returns the index of source name among dbs, or -1.
func sourceIndex(dbs []*runDB, name string) int {
	for i, db := range dbs {
		if db.name == name {
			return i
		}
	}
	return -1
}

// dbNames returns the databases' names.
func dbNames(dbs []*runDB) []string {
	out := make([]string, len(dbs))
	for i, db := range dbs {
		out[i] = db.dbName
	}
	return out
}

// pending returns how many outbox rows are not processed yet, in every
// source.
func pending(ctx context.Context, dbs []*runDB) (int, error) {
	total := 0
	for _, db := range dbs {
		var n int
		if err := db.pool.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE processed_at IS NULL`).Scan(&n); err != nil {
			return 0, fmt.Errorf("count pending rows of %s: %w", db.name, err)
		}
		total += n
	}
	return total, nil
}

// nodeSourceEnv returns a node's database setting: ORDO_POSTGRES_URL with
// one source (the one-source form), ORDO_SOURCES with more; urls are the
// node's own (through its proxies), in the order of dbs.
func nodeSourceEnv(dbs []*runDB, urls []string) string {
	if len(dbs) == 1 {
		return "ORDO_POSTGRES_URL=" + urls[0]
	}
	pairs := make([]string, len(dbs))
	for i, db := range dbs {
		pairs[i] = db.name + "=" + urls[i]
	}
	return "ORDO_SOURCES=" + strings.Join(pairs, " ")
}
