package inbox

import (
	"context"
	"embed"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/ordo-relay/ordo/internal/pgmigrate"
)

//go:embed migrations/*.sql
var migrations embed.FS

// TxBeginner starts transactions; *pgxpool.Pool and *pgx.Conn satisfy it.
type TxBeginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Migrate brings the inbox schema in the consumer's database up to date
// (component "inbox" in ordo_schema_migrations). It is idempotent and safe
// to call from many processes at once.
func Migrate(ctx context.Context, db TxBeginner) error {
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if err := pgmigrate.Lock(ctx, tx); err != nil {
			return err
		}
		return pgmigrate.Apply(ctx, tx, "inbox", migrations, "migrations")
	})
	if err != nil {
		return fmt.Errorf("inbox migrate: %w", err)
	}
	return nil
}
