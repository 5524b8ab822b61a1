-- Ordo outbox table contract, version 1. See docs/outbox-table.md.

-- Install-time settings: exactly one row, written by the first process that
-- migrates (outbox.Migrate), holding the partition count P.
CREATE TABLE ordo_settings (
    singleton    boolean     PRIMARY KEY DEFAULT true CHECK (singleton),
    partitions   int         NOT NULL CHECK (partitions BETWEEN 1 AND 4096),
    installed_at timestamptz NOT NULL DEFAULT now()
);

-- Per-key counter: hands out key_seq. Its row lock, held by the producer's
-- transaction until commit, serialises the producers of one key, so commit
-- order = key_seq order for that key. Rows are kept: deleting one would
-- restart its key at 1.
CREATE TABLE outbox_keys (
    correlation_id text   PRIMARY KEY,
    last_key_seq   bigint NOT NULL CHECK (last_key_seq > 0)
);

CREATE TABLE outbox (
    id             uuid        PRIMARY KEY,
    seq            bigint      GENERATED ALWAYS AS IDENTITY,
    partition      int         NOT NULL,
    correlation_id text        NOT NULL,
    key_seq        bigint      NOT NULL,
    exchange       text        NOT NULL,
    routing_key    text        NOT NULL,
    type           text        NOT NULL,
    payload        jsonb       NOT NULL,
    headers        jsonb       NOT NULL DEFAULT '{}',
    occurred_at    timestamptz NOT NULL,
    processed_at   timestamptz,
    attempts       int         NOT NULL DEFAULT 0,
    last_error     text,
    CONSTRAINT outbox_seq_key UNIQUE (seq),
    CONSTRAINT outbox_key_seq_key UNIQUE (correlation_id, key_seq),
    CONSTRAINT outbox_correlation_id_length CHECK (octet_length(correlation_id) BETWEEN 1 AND 255),
    CONSTRAINT outbox_exchange_length CHECK (octet_length(exchange) <= 255),
    CONSTRAINT outbox_routing_key_length CHECK (octet_length(routing_key) <= 255),
    CONSTRAINT outbox_type_length CHECK (octet_length(type) <= 255),
    CONSTRAINT outbox_headers_object CHECK (jsonb_typeof(headers) = 'object'),
    CONSTRAINT outbox_attempts_nonnegative CHECK (attempts >= 0)
    -- outbox_partition_range (0 <= partition < P) is added at install, when P is known.
);

-- Pending rows, by partition: what relays read.
CREATE INDEX outbox_pending ON outbox (partition, correlation_id, key_seq) WHERE processed_at IS NULL;

-- BEFORE INSERT: assign key_seq from the key's counter row (taking its lock),
-- then occurred_at from the clock after that lock. Values a producer supplies
-- for these two columns are replaced.
CREATE FUNCTION outbox_assign_key_seq() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO outbox_keys AS k (correlation_id, last_key_seq)
    VALUES (NEW.correlation_id, 1)
    ON CONFLICT (correlation_id) DO UPDATE SET last_key_seq = k.last_key_seq + 1
    RETURNING k.last_key_seq INTO NEW.key_seq;
    NEW.occurred_at := clock_timestamp();
    RETURN NEW;
END
$$;

CREATE TRIGGER outbox_assign_key_seq
    BEFORE INSERT ON outbox
    FOR EACH ROW EXECUTE FUNCTION outbox_assign_key_seq();

-- AFTER INSERT, once per statement: one notification per partition touched.
-- PostgreSQL also folds identical notifications of one transaction into one,
-- so a transaction of many statements still wakes each partition once.
CREATE FUNCTION outbox_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    p int;
BEGIN
    FOR p IN SELECT DISTINCT partition FROM new_rows LOOP
        PERFORM pg_notify('ordo_outbox', p::text);
    END LOOP;
    RETURN NULL;
END
$$;

CREATE TRIGGER outbox_notify
    AFTER INSERT ON outbox
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_notify();
