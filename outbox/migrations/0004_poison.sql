-- Poison messages (docs/design.md, invariant 5) and retention.
-- A failed row waits until next_attempt_at; after the attempt cap it is
-- parked (parked_at). Either way every later row of its key waits behind it.
-- An operator may skip a parked row: it becomes dead (dead_at, with
-- processed_at set too, so it is no longer pending) and is never published.
ALTER TABLE outbox
    ADD COLUMN next_attempt_at timestamptz,
    ADD COLUMN parked_at       timestamptz,
    ADD COLUMN dead_at         timestamptz,
    ADD CONSTRAINT outbox_dead_is_processed CHECK (dead_at IS NULL OR processed_at IS NOT NULL);

-- Parked rows, for the operator's list.
CREATE INDEX outbox_parked ON outbox (partition) WHERE parked_at IS NOT NULL AND processed_at IS NULL;

-- Processed rows by age, for retention (dead rows stay until purged).
CREATE INDEX outbox_retention ON outbox (partition, processed_at) WHERE processed_at IS NOT NULL AND dead_at IS NULL;

-- Every operator action: who, from where, what, on what, and how it ended.
CREATE TABLE ordo_operator_audit (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at          timestamptz NOT NULL DEFAULT clock_timestamp(),
    operator    text        NOT NULL,
    remote_addr text        NOT NULL,
    action      text        NOT NULL,
    target      text        NOT NULL,
    result      text        NOT NULL
);
