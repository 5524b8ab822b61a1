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

// ClassicOutboxDDL creates classic_outbox, the article's outbox table in
// snake case: what producers without Ordo write, and what the producer
// benchmarks compare Ordo's INSERT with (the bench's produce scenario,
// outbox's BenchmarkInsertStatement). A uuid key, the message's type,
// routing key, payload, correlation id and times, and the article's one
// partial index on occurred_at where processed_at is null.
const ClassicOutboxDDL = `
CREATE TABLE classic_outbox (
    id             uuid         PRIMARY KEY,
    type           varchar(200) NOT NULL,
    routing_key    varchar(200) NOT NULL,
    payload        jsonb        NOT NULL,
    correlation_id text,
    occurred_at    timestamptz  NOT NULL DEFAULT now(),
    processed_at   timestamptz
);
CREATE INDEX classic_outbox_pending ON classic_outbox (occurred_at) WHERE processed_at IS NULL`
