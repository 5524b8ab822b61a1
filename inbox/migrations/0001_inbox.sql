-- The inbox schema, in the consumer's own database. Every table is keyed by
-- consumer (the consumer group's name), so several consumers can share one
-- database without sharing state.

-- The shard topology a consumer was installed with. A process configured
-- differently refuses to start (see docs/consumer.md, "Changing S").
CREATE TABLE ordo_inbox_topology (
    consumer     text        PRIMARY KEY,
    shards       int         NOT NULL CHECK (shards > 0),
    partitions   int         NOT NULL CHECK (partitions > 0),
    mapping      text        NOT NULL,  -- 'mod': shard = x-ordo-partition mod shards
    exchange     text        NOT NULL,  -- the source exchange Ordo publishes to
    bindings     text[]      NOT NULL,  -- routing keys bound from the source exchange
    queue_prefix text        NOT NULL,  -- shard i's queue is <queue_prefix>.shard.<i>
    installed_at timestamptz NOT NULL DEFAULT now()
);

-- Live instances: each one refreshes its row every TTL/3. The rows not
-- expired are the members every instance balances the shards over.
CREATE TABLE ordo_inbox_members (
    consumer   text        NOT NULL,
    instance   text        NOT NULL,
    expires_at timestamptz NOT NULL,
    started_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, instance)
);

-- One lease per shard: the owner consumes the shard's queue, and every inbox
-- write checks owner and epoch (the fence) in its own transaction.
CREATE TABLE ordo_inbox_leases (
    consumer   text        NOT NULL,
    shard      int         NOT NULL,
    owner      text,
    epoch      bigint      NOT NULL DEFAULT 0,
    expires_at timestamptz NOT NULL DEFAULT '-infinity',
    claimed_at timestamptz,
    PRIMARY KEY (consumer, shard)
);

-- The last handled key_seq of every key (correlation id).
CREATE TABLE ordo_inbox_keys (
    consumer         text        NOT NULL,
    correlation_id   text        NOT NULL,
    last_seq         bigint      NOT NULL DEFAULT 0,
    last_message_id  text,
    last_occurred_at timestamptz,  -- AMQP timestamp of the last handled message (for the low-water mark)
    handled_at       timestamptz NOT NULL DEFAULT now(),  -- consumer clock, last change
    PRIMARY KEY (consumer, correlation_id)
);
CREATE INDEX ordo_inbox_keys_idle ON ordo_inbox_keys (consumer, handled_at);

-- Messages held by the inbox instead of the broker: a gap's later messages,
-- and messages whose handler failed (retried with backoff, then dead).
CREATE TABLE ordo_inbox_messages (
    consumer        text        NOT NULL,
    correlation_id  text        NOT NULL,
    key_seq         bigint      NOT NULL,
    prev_seq        bigint      NOT NULL,
    partition       int         NOT NULL,
    shard           int         NOT NULL,
    message_id      text        NOT NULL,
    type            text        NOT NULL,
    exchange        text        NOT NULL,
    routing_key     text        NOT NULL,
    occurred_at     timestamptz,
    headers         jsonb       NOT NULL,
    body            bytea       NOT NULL,
    stored_at       timestamptz NOT NULL DEFAULT now(),
    attempts        int         NOT NULL DEFAULT 0,
    last_error      text,
    next_attempt_at timestamptz NOT NULL DEFAULT 'infinity',  -- 'infinity': waits for its predecessor
    dead_at         timestamptz,
    PRIMARY KEY (consumer, correlation_id, key_seq)
);
CREATE INDEX ordo_inbox_messages_due ON ordo_inbox_messages (consumer, shard, next_attempt_at)
    WHERE dead_at IS NULL;

-- Retention's low-water mark: a message of an unknown key whose AMQP
-- timestamp is before low_water belongs to a key retention deleted, and is
-- dropped as a duplicate.
CREATE TABLE ordo_inbox_retention (
    consumer   text        PRIMARY KEY,
    low_water  timestamptz NOT NULL,
    deleted    bigint      NOT NULL DEFAULT 0,
    updated_at timestamptz NOT NULL DEFAULT now()
);
