// Package pgmigrate applies embedded, numbered SQL migrations to PostgreSQL,
// once each, safely under concurrent starts.
//
// Every migration file is named NNNN_description.sql. Apply runs inside the
// caller's transaction after Lock, so two processes starting at once
// serialise on a transaction-scoped advisory lock (a session lock taken
// through a pool could be released on another connection) and the second one
// finds the work done.
//
// Versions are recorded per component (component, version) in
// ordo_schema_migrations, whose owner is this package. A migration that
// changes owner is adopted (Adopt): its new owner records it as applied,
// without running it again, where its former owner had recorded it.
package pgmigrate

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// lockKey is the advisory lock key shared by every Ordo component's
// migrations: 'ordo.migrate' read as ASCII, fitting in a signed 64-bit int.
const lockKey int64 = 0x6f72646f2e6d6967

// ErrNewerSchema is returned (wrapped, naming the component and both
// versions) by Apply when the database holds a migration of the
// component newer than any this binary has: a binary older than the
// schema must not run on it, and trying again does not help.
var ErrNewerSchema = errors.New("upgrade the binary")

// The bounds Lock sets on a migration transaction, so that an attempt
// never waits without end: a failure they cause is transient (SQLSTATE
// 55P03 or 57014), and the caller tries again later.
const (
	// LockTimeout bounds each wait for a lock: the migration lock held
	// by another process's migration, or a table lock behind producers'
	// open transactions (waiting longer would queue every later producer
	// of the table behind the migration's lock).
	LockTimeout = 15 * time.Second
	// StatementTimeout bounds each statement of a migration.
	StatementTimeout = 2 * time.Minute
	// IdleTimeout ends, on the server, a migration transaction whose
	// client went silent between statements (a link that stalled): its
	// locks, the migration lock among them, are released instead of held
	// until TCP keepalive notices.
	IdleTimeout = time.Minute
)

// Lock sets the bounds above for the rest of tx, then takes the
// migration lock for the rest of tx.
func Lock(ctx context.Context, tx pgx.Tx) error {
	if _, err := tx.Exec(ctx, `SELECT set_config('lock_timeout', $1, true),
       set_config('statement_timeout', $2, true),
       set_config('idle_in_transaction_session_timeout', $3, true)`,
		ms(LockTimeout), ms(StatementTimeout), ms(IdleTimeout)); err != nil {
		return fmt.Errorf("bound migration transaction: %w", err)
	}
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, lockKey); err != nil {
		return fmt.Errorf("take migration lock: %w", err)
	}
	return nil
}

type migration struct {
	version int
	name    string
	sql     string
}

// Apply applies, in version order, every migration in dir of fsys that
// component has not applied yet, recording each in ordo_schema_migrations.
// Call Lock on tx first.
func Apply(ctx context.Context, tx pgx.Tx, component string, fsys fs.FS, dir string) error {
	ms, err := load(fsys, dir)
	if err != nil {
		return err
	}
	if err := createTable(ctx, tx); err != nil {
		return err
	}
	rows, err := tx.Query(ctx, `SELECT version FROM ordo_schema_migrations WHERE component = $1`, component)
	if err != nil {
		return fmt.Errorf("read %s schema version: %w", component, err)
	}
	versions, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		return fmt.Errorf("read %s schema version: %w", component, err)
	}
	applied := make(map[int]bool, len(versions))
	current := 0
	for _, v := range versions {
		applied[v] = true
		current = max(current, v)
	}
	if n := len(ms); n > 0 && current > ms[n-1].version {
		return fmt.Errorf("%s schema version %d is newer than this binary knows (%d): %w",
			component, current, ms[n-1].version, ErrNewerSchema)
	}
	// Every migration not applied yet, also one numbered below the newest
	// applied (written on a branch while a later one was merged first).
	for _, m := range ms {
		if applied[m.version] {
			continue
		}
		if _, err := tx.Exec(ctx, m.sql); err != nil {
			return fmt.Errorf("apply %s migration %s: %w", component, m.name, err)
		}
		if _, err := tx.Exec(ctx,
			`INSERT INTO ordo_schema_migrations (component, version, name) VALUES ($1, $2, $3)`,
			component, m.version, m.name); err != nil {
			return fmt.Errorf("record %s migration %s: %w", component, m.name, err)
		}
	}
	return nil
}

func createTable(ctx context.Context, tx pgx.Tx) error {
	if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS ordo_schema_migrations (
		component  text        NOT NULL,
		version    int         NOT NULL,
		name       text        NOT NULL,
		applied_at timestamptz NOT NULL DEFAULT now(),
		PRIMARY KEY (component, version))`); err != nil {
		return fmt.Errorf("create migrations table: %w", err)
	}
	return nil
}

// Moved says that a component's migration Version holds SQL that an
// earlier release applied as migration FromVersion of component From,
// recorded under the file name FromName.
type Moved struct {
	Version     int    // the migration's version under its new owner
	From        string // the component that applied it before
	FromVersion int    // its version there
	FromName    string // the file name From recorded it under
}

// Adopt records as applied, for component, every moved migration whose
// former record (From, FromVersion, FromName) exists and that component
// has not recorded yet, keeping the former record's applied_at. It runs no
// migration and leaves the former records as they are, so a binary that
// still knows the migration under its former owner finds it applied. The
// name check tells the moved SQL apart from whatever the former owner
// records under that version now. Call Lock on tx first, and Adopt before
// Apply.
func Adopt(ctx context.Context, tx pgx.Tx, component string, fsys fs.FS, dir string, moved []Moved) error {
	ms, err := load(fsys, dir)
	if err != nil {
		return err
	}
	names := make(map[int]string, len(ms))
	for _, m := range ms {
		names[m.version] = m.name
	}
	if err := createTable(ctx, tx); err != nil {
		return err
	}
	for _, mv := range moved {
		name, ok := names[mv.Version]
		if !ok {
			return fmt.Errorf("adopt %s migration %d: no such migration in %s", component, mv.Version, dir)
		}
		if _, err := tx.Exec(ctx, `
INSERT INTO ordo_schema_migrations (component, version, name, applied_at)
SELECT $1, $2, $3, f.applied_at FROM ordo_schema_migrations AS f
WHERE f.component = $4 AND f.version = $5 AND f.name = $6
ON CONFLICT (component, version) DO NOTHING`,
			component, mv.Version, name, mv.From, mv.FromVersion, mv.FromName); err != nil {
			return fmt.Errorf("adopt %s migration %s from %s %s: %w", component, name, mv.From, mv.FromName, err)
		}
	}
	return nil
}

func load(fsys fs.FS, dir string) ([]migration, error) {
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return nil, fmt.Errorf("read migrations: %w", err)
	}
	var ms []migration
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".sql") {
			continue
		}
		num, _, ok := strings.Cut(e.Name(), "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v <= 0 {
			return nil, fmt.Errorf("migration %q: name must start with a positive number and '_'", e.Name())
		}
		b, err := fs.ReadFile(fsys, path.Join(dir, e.Name()))
		if err != nil {
			return nil, fmt.Errorf("read migration %s: %w", e.Name(), err)
		}
		ms = append(ms, migration{version: v, name: e.Name(), sql: string(b)})
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].version < ms[j].version })
	for i := 1; i < len(ms); i++ {
		if ms[i].version == ms[i-1].version {
			return nil, fmt.Errorf("migrations %s and %s share version %d", ms[i-1].name, ms[i].name, ms[i].version)
		}
	}
	return ms, nil
}

// ms is d as a PostgreSQL setting in milliseconds.
func ms(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) }
