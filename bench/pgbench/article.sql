-- The article's OutboxMessages (EF Core) in snake case, as bench
-- produce's classic table: uuid key, type, routing key, payload jsonb,
-- correlation id, occurred-at, processed-at, and one partial index on
-- occurred-at over the pending rows.
CREATE TABLE classic_outbox (
    id             uuid        PRIMARY KEY,
    type           text        NOT NULL,
    routing_key    text        NOT NULL,
    payload        jsonb       NOT NULL,
    correlation_id text,
    occurred_at    timestamptz NOT NULL DEFAULT now(),
    processed_at   timestamptz
);
CREATE INDEX classic_outbox_pending ON classic_outbox (occurred_at) WHERE processed_at IS NULL;
