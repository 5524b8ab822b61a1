package orderapi

import (
	"context"
	"embed"

	"github.com/jackc/pgx/v5"

	"github.com/ordo-relay/ordo/internal/pgmigrate"
	"github.com/ordo-relay/ordo/outbox"
)

//go:embed migrations/*.sql
var migrations embed.FS

// Migrate brings the order tables (orders, order_items) up to date. It is
// idempotent and safe to call from many processes at once: it runs in one
// transaction under the migration lock every Ordo component shares. The
// outbox has its own migrations (outbox.Migrate).
func Migrate(ctx context.Context, db outbox.TxBeginner) error {
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if err := pgmigrate.Lock(ctx, tx); err != nil {
			return err
		}
		return pgmigrate.Apply(ctx, tx, "orderapi", migrations, "migrations")
	})
}
