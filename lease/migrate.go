package lease

import (
	"context"
	"embed"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/ordo-relay/ordo/internal/pgmigrate"
	"github.com/ordo-relay/ordo/partition"
)

// migrationComponent is the name the lease tables' migrations are recorded under
// in ordo_schema_migrations.
const migrationComponent = "lease"

//go:embed migrations/*.sql
var migrationFiles embed.FS

// movedFromOutbox: releases up to and including 99ac80e created the lease
// tables in the outbox component's migrations 2 and 3. On such a database
// the lease component records its own versions as applied instead of
// running them again; the outbox keeps its records.
var movedFromOutbox = []pgmigrate.Moved{
	{Version: 1, From: "outbox", FromVersion: 2, FromName: "0002_leases.sql"},
	{Version: 2, From: "outbox", FromVersion: 3, FromName: "0003_lease_audit.sql"},
}

// sqlSeedLeaseRows makes sure every partition 0..$1-1 has a lease row.
const sqlSeedLeaseRows = `
INSERT INTO ordo_leases (partition)
SELECT g FROM generate_series(0, $1::int - 1) AS g
ON CONFLICT (partition) DO NOTHING`

// TxBeginner starts transactions; *pgxpool.Pool and *pgx.Conn satisfy it.
type TxBeginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Migrate brings the lease tables up to date and makes sure every
// partition 0..partitions-1 has a lease row. It is idempotent and safe to
// call from many processes at once: it runs in one transaction under the
// migration lock every Ordo component shares.
//
// The package owns the lease tables: ordo_leases (one row per partition)
// and ordo_lease_audit (every claim, release, expiry, lost renewal and
// refused stale-epoch write), created from the embedded migrations/*.sql
// and recorded as component "lease" in ordo_schema_migrations. Other
// packages use them without owning them: relay/pgstore checks a lease row
// in every write and records refused writes in the audit, node reads them
// for /status. Earlier releases created the two tables in the outbox
// component's migrations 2 and 3; on such a database Migrate adopts those
// versions (records them as its own, with the time they were applied)
// instead of running them again, and the outbox keeps its records.
//
// partitions must be the installed count: outbox.Migrate checks it, so
// call that first (a node does both). The lease tables refer to no other
// table, so the order of the two only matters for that check.
func Migrate(ctx context.Context, db TxBeginner, partitions int) error {
	if err := partition.ValidateCount(partitions); err != nil {
		return err
	}
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if err := pgmigrate.Lock(ctx, tx); err != nil {
			return err
		}
		if err := pgmigrate.Adopt(ctx, tx, migrationComponent, migrationFiles, "migrations", movedFromOutbox); err != nil {
			return err
		}
		if err := pgmigrate.Apply(ctx, tx, migrationComponent, migrationFiles, "migrations"); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, sqlSeedLeaseRows, partitions); err != nil {
			return fmt.Errorf("seed lease rows: %w", err)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("lease migrate: %w", err)
	}
	return nil
}
