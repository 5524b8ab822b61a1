package testkit

import (
	"context"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
)

// InsertArticleRow writes one row of the article's "OutboxMessages"
// (tablesource.ArticleDDL) the way its producers do: a plain INSERT, one
// row per transaction, knowing nothing of Ordo. Its type is OrderPlaced,
// its routing key order.placed, its payload an object holding its id.
func InsertArticleRow(ctx context.Context, pool *pgxpool.Pool, id uuid.UUID, key string, at time.Time) error {
	_, err := pool.Exec(ctx, `INSERT INTO "OutboxMessages" ("Id", "Type", "RoutingKey", "Payload", "CorrelationId", "OccurredAt")
		VALUES ($1, 'OrderPlaced', 'order.placed', jsonb_build_object('orderId', $2::text), $3, $4)`, id, id.String(), key, at)
	return err
}
