CREATE TABLE classic_outbox (
    id           uuid        PRIMARY KEY,
    type         text        NOT NULL,
    payload      jsonb       NOT NULL,
    occurred_at  timestamptz NOT NULL DEFAULT now(),
    processed_at timestamptz
);
CREATE INDEX classic_outbox_pending ON classic_outbox (occurred_at) WHERE processed_at IS NULL;
