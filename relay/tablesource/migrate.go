package tablesource

import (
	"context"
	"embed"

	"github.com/jackc/pgx/v5"

	"github.com/ordo-relay/ordo/internal/pgmigrate"
)

//go:embed migrations/*.sql
var migrations embed.FS

// Migrate brings Ordo's own tables for an adopted table up to date
// (component "tablesource" in ordo_schema_migrations): ordo_table_rows,
// ordo_table_keys and the numbering function. It touches nothing of the
// user's table. The leases are package lease's (lease.Migrate), which
// the Store's writes and the numbering check. It is idempotent and safe
// to call from many processes at once.
func Migrate(ctx context.Context, db TxBeginner) error {
	return pgx.BeginTxFunc(ctx, db, pgx.TxOptions{}, func(tx pgx.Tx) error {
		if err := pgmigrate.Lock(ctx, tx); err != nil {
			return err
		}
		return pgmigrate.Apply(ctx, tx, "tablesource", migrations, "migrations")
	})
}
