package tablesource

import (
	"context"
	"embed"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/ordo-relay/ordo/internal/pgmigrate"
	"github.com/ordo-relay/ordo/outbox"
	"github.com/ordo-relay/ordo/partition"
)

//go:embed migrations/*.sql
var migrations embed.FS

// Migrate brings Ordo's own tables for an adopted table up to date
// (component "tablesource" in ordo_schema_migrations): ordo_table_rows,
// ordo_table_keys, ordo_table_settings and the numbering function, and
// installs the partition count on first use. It touches nothing of the
// user's table, and creates none of Ordo's own outbox tables. The leases
// are package lease's (lease.Migrate), which the Store's writes and the
// numbering check. It is idempotent and safe to call from many processes
// at once. If the database already holds a different partition count it
// changes nothing and returns an *outbox.PartitionMismatchError.
func Migrate(ctx context.Context, db TxBeginner, partitions int) error {
	if err := partition.ValidateCount(partitions); err != nil {
		return err
	}
	return pgx.BeginTxFunc(ctx, db, pgx.TxOptions{}, func(tx pgx.Tx) error {
		if err := pgmigrate.Lock(ctx, tx); err != nil {
			return err
		}
		if err := pgmigrate.Apply(ctx, tx, "tablesource", migrations, "migrations"); err != nil {
			return err
		}
		var installed int
		err := tx.QueryRow(ctx, `SELECT partitions FROM ordo_table_settings`).Scan(&installed)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			if _, err := tx.Exec(ctx, `INSERT INTO ordo_table_settings (partitions) VALUES ($1)`, partitions); err != nil {
				return fmt.Errorf("store partition count: %w", err)
			}
			return nil
		case err != nil:
			return fmt.Errorf("read partition count: %w", err)
		case installed != partitions:
			return &outbox.PartitionMismatchError{Installed: installed, Configured: partitions}
		}
		return nil
	})
}
