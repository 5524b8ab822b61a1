-- alternate.sql: the cost of each piece of the outbox INSERT, in one
-- backend, variants alternating (bench/pgbench/README.md). Run by
-- alternate.sh, which creates the database and applies the migrations.
SET synchronous_commit = off;
CREATE FUNCTION pieces_cpu() RETURNS bigint LANGUAGE sql AS $$
    SELECT split_part(s, ' ', 14)::bigint + split_part(s, ' ', 15)::bigint FROM pg_read_file('/proc/self/stat') AS s
$$;
CREATE TABLE classic_outbox (
    id           uuid        PRIMARY KEY,
    type         text        NOT NULL,
    payload      jsonb       NOT NULL,
    occurred_at  timestamptz NOT NULL DEFAULT now(),
    processed_at timestamptz
);
CREATE INDEX classic_outbox_pending ON classic_outbox (occurred_at) WHERE processed_at IS NULL;
CREATE SEQUENCE bare_key_seq START 1000000;
CREATE TABLE pieces_result (variant text, rep int, us numeric);

-- The trigger of migration 11 with one piece cut, each variant a trigger of
-- its own, enabled one at a time.
CREATE OR REPLACE FUNCTION trig_m11() RETURNS trigger
LANGUAGE plpgsql SET enable_seqscan = off AS $$
DECLARE
    key_partition int;
    refused text;
BEGIN
    -- The former CHECK constraints, first: a refused row touches no counter.
    IF octet_length(NEW.correlation_id) NOT BETWEEN 1 AND 255 OR octet_length(NEW.exchange) > 255
            OR octet_length(NEW.routing_key) > 255 OR octet_length(NEW.type) > 255
            OR jsonb_typeof(NEW.headers) <> 'object' THEN
        refused := CASE
            WHEN octet_length(NEW.correlation_id) NOT BETWEEN 1 AND 255 THEN 'outbox_correlation_id_length'
            WHEN octet_length(NEW.exchange) > 255 THEN 'outbox_exchange_length'
            WHEN octet_length(NEW.routing_key) > 255 THEN 'outbox_routing_key_length'
            WHEN octet_length(NEW.type) > 255 THEN 'outbox_type_length'
            ELSE 'outbox_headers_object' END;
        RAISE EXCEPTION 'new row for relation "outbox" violates check constraint "%"', refused
            USING ERRCODE = 'check_violation', CONSTRAINT = refused, TABLE = 'outbox',
                  HINT = 'correlation_id is 1 to 255 bytes; exchange, routing_key and type at most 255; headers a JSON object; see docs/outbox-table.md';
    END IF;
    UPDATE outbox_keys
        SET last_key_seq = last_key_seq + 1,
            partition = coalesce(partition, NEW.partition)
        WHERE correlation_id = NEW.correlation_id
        RETURNING last_key_seq, partition INTO NEW.key_seq, key_partition;
    IF NOT FOUND THEN
        -- The key's first row (or two first rows racing: the loser waits
        -- for the winner's commit and then takes the update branch).
        INSERT INTO outbox_keys AS k (correlation_id, last_key_seq, partition)
        VALUES (NEW.correlation_id, 1, NEW.partition)
        ON CONFLICT (correlation_id) DO UPDATE
            SET last_key_seq = k.last_key_seq + 1,
                partition = coalesce(k.partition, EXCLUDED.partition)
        RETURNING k.last_key_seq, k.partition INTO NEW.key_seq, key_partition;
    END IF;
    IF EXISTS (SELECT 1 FROM outbox WHERE id = NEW.id) THEN
        -- The row is there already: nothing to insert, nothing to count.
        IF NEW.key_seq = 1 THEN
            DELETE FROM outbox_keys WHERE correlation_id = NEW.correlation_id;
        ELSE
            UPDATE outbox_keys SET last_key_seq = last_key_seq - 1 WHERE correlation_id = NEW.correlation_id;
        END IF;
        RETURN NULL;
    END IF;
    IF key_partition IS DISTINCT FROM NEW.partition THEN
        -- The statement fails, so the counter's increment is undone too.
        RAISE EXCEPTION 'outbox: correlation_id % belongs to partition % (its earlier rows), but this row says partition %',
                quote_literal(NEW.correlation_id), key_partition, NEW.partition
            USING ERRCODE = 'check_violation', CONSTRAINT = 'outbox_key_partition',
                  TABLE = 'outbox', COLUMN = 'partition',
                  HINT = 'partition must be xxhash64(correlation_id) mod P for every row of a key; see docs/outbox-table.md';
    END IF;
    NEW.occurred_at := clock_timestamp();
    RETURN NEW;
END
$$;
CREATE OR REPLACE FUNCTION trig_noprobe() RETURNS trigger
LANGUAGE plpgsql SET enable_seqscan = off AS $$
DECLARE
    key_partition int;
    refused text;
BEGIN
    -- The former CHECK constraints, first: a refused row touches no counter.
    IF octet_length(NEW.correlation_id) NOT BETWEEN 1 AND 255 OR octet_length(NEW.exchange) > 255
            OR octet_length(NEW.routing_key) > 255 OR octet_length(NEW.type) > 255
            OR jsonb_typeof(NEW.headers) <> 'object' THEN
        refused := CASE
            WHEN octet_length(NEW.correlation_id) NOT BETWEEN 1 AND 255 THEN 'outbox_correlation_id_length'
            WHEN octet_length(NEW.exchange) > 255 THEN 'outbox_exchange_length'
            WHEN octet_length(NEW.routing_key) > 255 THEN 'outbox_routing_key_length'
            WHEN octet_length(NEW.type) > 255 THEN 'outbox_type_length'
            ELSE 'outbox_headers_object' END;
        RAISE EXCEPTION 'new row for relation "outbox" violates check constraint "%"', refused
            USING ERRCODE = 'check_violation', CONSTRAINT = refused, TABLE = 'outbox',
                  HINT = 'correlation_id is 1 to 255 bytes; exchange, routing_key and type at most 255; headers a JSON object; see docs/outbox-table.md';
    END IF;
    UPDATE outbox_keys
        SET last_key_seq = last_key_seq + 1,
            partition = coalesce(partition, NEW.partition)
        WHERE correlation_id = NEW.correlation_id
        RETURNING last_key_seq, partition INTO NEW.key_seq, key_partition;
    IF NOT FOUND THEN
        -- The key's first row (or two first rows racing: the loser waits
        -- for the winner's commit and then takes the update branch).
        INSERT INTO outbox_keys AS k (correlation_id, last_key_seq, partition)
        VALUES (NEW.correlation_id, 1, NEW.partition)
        ON CONFLICT (correlation_id) DO UPDATE
            SET last_key_seq = k.last_key_seq + 1,
                partition = coalesce(k.partition, EXCLUDED.partition)
        RETURNING k.last_key_seq, k.partition INTO NEW.key_seq, key_partition;
    END IF;
    IF key_partition IS DISTINCT FROM NEW.partition THEN
        -- The statement fails, so the counter's increment is undone too.
        RAISE EXCEPTION 'outbox: correlation_id % belongs to partition % (its earlier rows), but this row says partition %',
                quote_literal(NEW.correlation_id), key_partition, NEW.partition
            USING ERRCODE = 'check_violation', CONSTRAINT = 'outbox_key_partition',
                  TABLE = 'outbox', COLUMN = 'partition',
                  HINT = 'partition must be xxhash64(correlation_id) mod P for every row of a key; see docs/outbox-table.md';
    END IF;
    NEW.occurred_at := clock_timestamp();
    RETURN NEW;
END
$$;
CREATE OR REPLACE FUNCTION trig_nolen() RETURNS trigger
LANGUAGE plpgsql SET enable_seqscan = off AS $$
DECLARE
    key_partition int;
    refused text;
BEGIN
    UPDATE outbox_keys
        SET last_key_seq = last_key_seq + 1,
            partition = coalesce(partition, NEW.partition)
        WHERE correlation_id = NEW.correlation_id
        RETURNING last_key_seq, partition INTO NEW.key_seq, key_partition;
    IF NOT FOUND THEN
        -- The key's first row (or two first rows racing: the loser waits
        -- for the winner's commit and then takes the update branch).
        INSERT INTO outbox_keys AS k (correlation_id, last_key_seq, partition)
        VALUES (NEW.correlation_id, 1, NEW.partition)
        ON CONFLICT (correlation_id) DO UPDATE
            SET last_key_seq = k.last_key_seq + 1,
                partition = coalesce(k.partition, EXCLUDED.partition)
        RETURNING k.last_key_seq, k.partition INTO NEW.key_seq, key_partition;
    END IF;
    IF EXISTS (SELECT 1 FROM outbox WHERE id = NEW.id) THEN
        -- The row is there already: nothing to insert, nothing to count.
        IF NEW.key_seq = 1 THEN
            DELETE FROM outbox_keys WHERE correlation_id = NEW.correlation_id;
        ELSE
            UPDATE outbox_keys SET last_key_seq = last_key_seq - 1 WHERE correlation_id = NEW.correlation_id;
        END IF;
        RETURN NULL;
    END IF;
    IF key_partition IS DISTINCT FROM NEW.partition THEN
        -- The statement fails, so the counter's increment is undone too.
        RAISE EXCEPTION 'outbox: correlation_id % belongs to partition % (its earlier rows), but this row says partition %',
                quote_literal(NEW.correlation_id), key_partition, NEW.partition
            USING ERRCODE = 'check_violation', CONSTRAINT = 'outbox_key_partition',
                  TABLE = 'outbox', COLUMN = 'partition',
                  HINT = 'partition must be xxhash64(correlation_id) mod P for every row of a key; see docs/outbox-table.md';
    END IF;
    NEW.occurred_at := clock_timestamp();
    RETURN NEW;
END
$$;
CREATE OR REPLACE FUNCTION trig_nopartcheck() RETURNS trigger
LANGUAGE plpgsql SET enable_seqscan = off AS $$
DECLARE
    key_partition int;
    refused text;
BEGIN
    -- The former CHECK constraints, first: a refused row touches no counter.
    IF octet_length(NEW.correlation_id) NOT BETWEEN 1 AND 255 OR octet_length(NEW.exchange) > 255
            OR octet_length(NEW.routing_key) > 255 OR octet_length(NEW.type) > 255
            OR jsonb_typeof(NEW.headers) <> 'object' THEN
        refused := CASE
            WHEN octet_length(NEW.correlation_id) NOT BETWEEN 1 AND 255 THEN 'outbox_correlation_id_length'
            WHEN octet_length(NEW.exchange) > 255 THEN 'outbox_exchange_length'
            WHEN octet_length(NEW.routing_key) > 255 THEN 'outbox_routing_key_length'
            WHEN octet_length(NEW.type) > 255 THEN 'outbox_type_length'
            ELSE 'outbox_headers_object' END;
        RAISE EXCEPTION 'new row for relation "outbox" violates check constraint "%"', refused
            USING ERRCODE = 'check_violation', CONSTRAINT = refused, TABLE = 'outbox',
                  HINT = 'correlation_id is 1 to 255 bytes; exchange, routing_key and type at most 255; headers a JSON object; see docs/outbox-table.md';
    END IF;
    UPDATE outbox_keys
        SET last_key_seq = last_key_seq + 1,
            partition = coalesce(partition, NEW.partition)
        WHERE correlation_id = NEW.correlation_id
        RETURNING last_key_seq, partition INTO NEW.key_seq, key_partition;
    IF NOT FOUND THEN
        -- The key's first row (or two first rows racing: the loser waits
        -- for the winner's commit and then takes the update branch).
        INSERT INTO outbox_keys AS k (correlation_id, last_key_seq, partition)
        VALUES (NEW.correlation_id, 1, NEW.partition)
        ON CONFLICT (correlation_id) DO UPDATE
            SET last_key_seq = k.last_key_seq + 1,
                partition = coalesce(k.partition, EXCLUDED.partition)
        RETURNING k.last_key_seq, k.partition INTO NEW.key_seq, key_partition;
    END IF;
    IF EXISTS (SELECT 1 FROM outbox WHERE id = NEW.id) THEN
        -- The row is there already: nothing to insert, nothing to count.
        IF NEW.key_seq = 1 THEN
            DELETE FROM outbox_keys WHERE correlation_id = NEW.correlation_id;
        ELSE
            UPDATE outbox_keys SET last_key_seq = last_key_seq - 1 WHERE correlation_id = NEW.correlation_id;
        END IF;
        RETURN NULL;
    END IF;
    NEW.occurred_at := clock_timestamp();
    RETURN NEW;
END
$$;
CREATE OR REPLACE FUNCTION trig_noset() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    key_partition int;
    refused text;
BEGIN
    -- The former CHECK constraints, first: a refused row touches no counter.
    IF octet_length(NEW.correlation_id) NOT BETWEEN 1 AND 255 OR octet_length(NEW.exchange) > 255
            OR octet_length(NEW.routing_key) > 255 OR octet_length(NEW.type) > 255
            OR jsonb_typeof(NEW.headers) <> 'object' THEN
        refused := CASE
            WHEN octet_length(NEW.correlation_id) NOT BETWEEN 1 AND 255 THEN 'outbox_correlation_id_length'
            WHEN octet_length(NEW.exchange) > 255 THEN 'outbox_exchange_length'
            WHEN octet_length(NEW.routing_key) > 255 THEN 'outbox_routing_key_length'
            WHEN octet_length(NEW.type) > 255 THEN 'outbox_type_length'
            ELSE 'outbox_headers_object' END;
        RAISE EXCEPTION 'new row for relation "outbox" violates check constraint "%"', refused
            USING ERRCODE = 'check_violation', CONSTRAINT = refused, TABLE = 'outbox',
                  HINT = 'correlation_id is 1 to 255 bytes; exchange, routing_key and type at most 255; headers a JSON object; see docs/outbox-table.md';
    END IF;
    UPDATE outbox_keys
        SET last_key_seq = last_key_seq + 1,
            partition = coalesce(partition, NEW.partition)
        WHERE correlation_id = NEW.correlation_id
        RETURNING last_key_seq, partition INTO NEW.key_seq, key_partition;
    IF NOT FOUND THEN
        -- The key's first row (or two first rows racing: the loser waits
        -- for the winner's commit and then takes the update branch).
        INSERT INTO outbox_keys AS k (correlation_id, last_key_seq, partition)
        VALUES (NEW.correlation_id, 1, NEW.partition)
        ON CONFLICT (correlation_id) DO UPDATE
            SET last_key_seq = k.last_key_seq + 1,
                partition = coalesce(k.partition, EXCLUDED.partition)
        RETURNING k.last_key_seq, k.partition INTO NEW.key_seq, key_partition;
    END IF;
    IF EXISTS (SELECT 1 FROM outbox WHERE id = NEW.id) THEN
        -- The row is there already: nothing to insert, nothing to count.
        IF NEW.key_seq = 1 THEN
            DELETE FROM outbox_keys WHERE correlation_id = NEW.correlation_id;
        ELSE
            UPDATE outbox_keys SET last_key_seq = last_key_seq - 1 WHERE correlation_id = NEW.correlation_id;
        END IF;
        RETURN NULL;
    END IF;
    IF key_partition IS DISTINCT FROM NEW.partition THEN
        -- The statement fails, so the counter's increment is undone too.
        RAISE EXCEPTION 'outbox: correlation_id % belongs to partition % (its earlier rows), but this row says partition %',
                quote_literal(NEW.correlation_id), key_partition, NEW.partition
            USING ERRCODE = 'check_violation', CONSTRAINT = 'outbox_key_partition',
                  TABLE = 'outbox', COLUMN = 'partition',
                  HINT = 'partition must be xxhash64(correlation_id) mod P for every row of a key; see docs/outbox-table.md';
    END IF;
    NEW.occurred_at := clock_timestamp();
    RETURN NEW;
END
$$;

CREATE OR REPLACE FUNCTION trig_rowwake() RETURNS trigger
LANGUAGE plpgsql SET enable_seqscan = off AS $$
DECLARE
    key_partition int;
    refused text;
BEGIN
    -- The former CHECK constraints, first: a refused row touches no counter.
    IF octet_length(NEW.correlation_id) NOT BETWEEN 1 AND 255 OR octet_length(NEW.exchange) > 255
            OR octet_length(NEW.routing_key) > 255 OR octet_length(NEW.type) > 255
            OR jsonb_typeof(NEW.headers) <> 'object' THEN
        refused := CASE
            WHEN octet_length(NEW.correlation_id) NOT BETWEEN 1 AND 255 THEN 'outbox_correlation_id_length'
            WHEN octet_length(NEW.exchange) > 255 THEN 'outbox_exchange_length'
            WHEN octet_length(NEW.routing_key) > 255 THEN 'outbox_routing_key_length'
            WHEN octet_length(NEW.type) > 255 THEN 'outbox_type_length'
            ELSE 'outbox_headers_object' END;
        RAISE EXCEPTION 'new row for relation "outbox" violates check constraint "%"', refused
            USING ERRCODE = 'check_violation', CONSTRAINT = refused, TABLE = 'outbox',
                  HINT = 'correlation_id is 1 to 255 bytes; exchange, routing_key and type at most 255; headers a JSON object; see docs/outbox-table.md';
    END IF;
    UPDATE outbox_keys
        SET last_key_seq = last_key_seq + 1,
            partition = coalesce(partition, NEW.partition)
        WHERE correlation_id = NEW.correlation_id
        RETURNING last_key_seq, partition INTO NEW.key_seq, key_partition;
    IF NOT FOUND THEN
        -- The key's first row (or two first rows racing: the loser waits
        -- for the winner's commit and then takes the update branch).
        INSERT INTO outbox_keys AS k (correlation_id, last_key_seq, partition)
        VALUES (NEW.correlation_id, 1, NEW.partition)
        ON CONFLICT (correlation_id) DO UPDATE
            SET last_key_seq = k.last_key_seq + 1,
                partition = coalesce(k.partition, EXCLUDED.partition)
        RETURNING k.last_key_seq, k.partition INTO NEW.key_seq, key_partition;
    END IF;
    IF EXISTS (SELECT 1 FROM outbox WHERE id = NEW.id) THEN
        -- The row is there already: nothing to insert, nothing to count.
        IF NEW.key_seq = 1 THEN
            DELETE FROM outbox_keys WHERE correlation_id = NEW.correlation_id;
        ELSE
            UPDATE outbox_keys SET last_key_seq = last_key_seq - 1 WHERE correlation_id = NEW.correlation_id;
        END IF;
        RETURN NULL;
    END IF;
    IF key_partition IS DISTINCT FROM NEW.partition THEN
        -- The statement fails, so the counter's increment is undone too.
        RAISE EXCEPTION 'outbox: correlation_id % belongs to partition % (its earlier rows), but this row says partition %',
                quote_literal(NEW.correlation_id), key_partition, NEW.partition
            USING ERRCODE = 'check_violation', CONSTRAINT = 'outbox_key_partition',
                  TABLE = 'outbox', COLUMN = 'partition',
                  HINT = 'partition must be xxhash64(correlation_id) mod P for every row of a key; see docs/outbox-table.md';
    END IF;
    IF NOT pg_try_advisory_xact_lock_shared(1869767791, NEW.partition) THEN
        PERFORM pg_notify('ordo_outbox', NEW.partition::text);
    END IF;
    NEW.occurred_at := clock_timestamp();
    RETURN NEW;
END
$$;

-- Migration 12's trigger (with no CHECK constraints and no outbox_notify).
CREATE OR REPLACE FUNCTION trig_m12() RETURNS trigger
LANGUAGE plpgsql SET enable_seqscan = off AS $$
DECLARE
    key_partition int;
    partitions int;
    refused text;
    woken text;
BEGIN
    -- The former CHECK constraints, first: a refused row touches no counter.
    IF octet_length(NEW.correlation_id) NOT BETWEEN 1 AND 255 OR octet_length(NEW.exchange) > 255
            OR octet_length(NEW.routing_key) > 255 OR octet_length(NEW.type) > 255
            OR jsonb_typeof(NEW.headers) <> 'object'
            OR NEW.attempts < 0 OR (NEW.dead_at IS NOT NULL AND NEW.processed_at IS NULL) THEN
        refused := CASE
            WHEN octet_length(NEW.correlation_id) NOT BETWEEN 1 AND 255 THEN 'outbox_correlation_id_length'
            WHEN octet_length(NEW.exchange) > 255 THEN 'outbox_exchange_length'
            WHEN octet_length(NEW.routing_key) > 255 THEN 'outbox_routing_key_length'
            WHEN octet_length(NEW.type) > 255 THEN 'outbox_type_length'
            WHEN jsonb_typeof(NEW.headers) <> 'object' THEN 'outbox_headers_object'
            WHEN NEW.attempts < 0 THEN 'outbox_attempts_nonnegative'
            ELSE 'outbox_dead_is_processed' END;
        RAISE EXCEPTION 'new row for relation "outbox" violates check constraint "%"', refused
            USING ERRCODE = 'check_violation', CONSTRAINT = refused, TABLE = 'outbox',
                  HINT = 'correlation_id is 1 to 255 bytes; exchange, routing_key and type at most 255; headers a JSON object; see docs/outbox-table.md';
    END IF;
    UPDATE outbox_keys
        SET last_key_seq = last_key_seq + 1
        WHERE correlation_id = NEW.correlation_id AND partition IS NOT NULL
        RETURNING last_key_seq, partition INTO NEW.key_seq, key_partition;
    IF NOT FOUND THEN
        -- The key's first row (or two first rows racing: the loser waits
        -- for the winner's commit and then takes the update branch), or
        -- a counter row without a partition: this row's partition becomes
        -- the key's, so it must be one of the install's.
        partitions := (SELECT s.partitions FROM ordo_settings AS s);
        IF NEW.partition < 0 OR NEW.partition >= partitions THEN
            RAISE EXCEPTION 'new row for relation "outbox" violates check constraint "outbox_partition_range"'
                USING ERRCODE = 'check_violation', CONSTRAINT = 'outbox_partition_range', TABLE = 'outbox', COLUMN = 'partition',
                      HINT = format('partition is xxhash64(correlation_id) mod %s, from 0 to %s; see docs/outbox-table.md', partitions, partitions - 1);
        END IF;
        INSERT INTO outbox_keys AS k (correlation_id, last_key_seq, partition)
        VALUES (NEW.correlation_id, 1, NEW.partition)
        ON CONFLICT (correlation_id) DO UPDATE
            SET last_key_seq = k.last_key_seq + 1,
                partition = coalesce(k.partition, EXCLUDED.partition)
        RETURNING k.last_key_seq, k.partition INTO NEW.key_seq, key_partition;
    END IF;
    IF EXISTS (SELECT 1 FROM outbox WHERE id = NEW.id) THEN
        -- The row is there already: nothing to insert, nothing to count.
        IF NEW.key_seq = 1 THEN
            DELETE FROM outbox_keys WHERE correlation_id = NEW.correlation_id;
        ELSE
            UPDATE outbox_keys SET last_key_seq = last_key_seq - 1 WHERE correlation_id = NEW.correlation_id;
        END IF;
        RETURN NULL;
    END IF;
    IF key_partition IS DISTINCT FROM NEW.partition THEN
        -- The statement fails, so the counter's increment is undone too.
        RAISE EXCEPTION 'outbox: correlation_id % belongs to partition % (its earlier rows), but this row says partition %',
                quote_literal(NEW.correlation_id), key_partition, NEW.partition
            USING ERRCODE = 'check_violation', CONSTRAINT = 'outbox_key_partition',
                  TABLE = 'outbox', COLUMN = 'partition',
                  HINT = 'partition must be xxhash64(correlation_id) mod P for every row of a key; see docs/outbox-table.md';
    END IF;
    -- Wake a relay that waits for this partition, once per partition and
    -- transaction: the shared lock, held until the transaction ends, or,
    -- if a relay armed the partition (or this transaction already holds
    -- 16 of these locks), a notification.
    woken := coalesce(nullif(current_setting('ordo.woken_partitions', true), ''), ',');
    IF position(',' || NEW.partition || ',' IN woken) = 0 THEN
        IF length(woken) - length(replace(woken, ',', '')) > 16
                OR NOT pg_try_advisory_xact_lock_shared(1869767791, NEW.partition) THEN
            PERFORM pg_notify('ordo_outbox', NEW.partition::text);
        END IF;
        woken := set_config('ordo.woken_partitions', woken || NEW.partition || ',', true);
    END IF;
    NEW.occurred_at := clock_timestamp();
    RETURN NEW;
END
$$;

CREATE FUNCTION trig_floor() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE outbox_keys SET last_key_seq = last_key_seq + 1 WHERE correlation_id = NEW.correlation_id
        RETURNING last_key_seq INTO NEW.key_seq;
    NEW.occurred_at := clock_timestamp();
    RETURN NEW;
END
$$;
CREATE TRIGGER t_m11 BEFORE INSERT ON outbox FOR EACH ROW EXECUTE FUNCTION trig_m11();
ALTER TABLE outbox DISABLE TRIGGER t_m11;
CREATE TRIGGER t_noprobe BEFORE INSERT ON outbox FOR EACH ROW EXECUTE FUNCTION trig_noprobe();
ALTER TABLE outbox DISABLE TRIGGER t_noprobe;
CREATE TRIGGER t_nolen BEFORE INSERT ON outbox FOR EACH ROW EXECUTE FUNCTION trig_nolen();
ALTER TABLE outbox DISABLE TRIGGER t_nolen;
CREATE TRIGGER t_nopartcheck BEFORE INSERT ON outbox FOR EACH ROW EXECUTE FUNCTION trig_nopartcheck();
ALTER TABLE outbox DISABLE TRIGGER t_nopartcheck;
CREATE TRIGGER t_noset BEFORE INSERT ON outbox FOR EACH ROW EXECUTE FUNCTION trig_noset();
ALTER TABLE outbox DISABLE TRIGGER t_noset;
CREATE TRIGGER t_floor BEFORE INSERT ON outbox FOR EACH ROW EXECUTE FUNCTION trig_floor();
ALTER TABLE outbox DISABLE TRIGGER t_floor;
CREATE TRIGGER t_m12 BEFORE INSERT ON outbox FOR EACH ROW EXECUTE FUNCTION trig_m12();
ALTER TABLE outbox DISABLE TRIGGER t_m12;
CREATE TRIGGER t_rowwake BEFORE INSERT ON outbox FOR EACH ROW EXECUTE FUNCTION trig_rowwake();
ALTER TABLE outbox DISABLE TRIGGER t_rowwake;

-- 10,000 keys with one row each
INSERT INTO outbox (id, partition, correlation_id, exchange, routing_key, type, payload)
SELECT gen_random_uuid(), k % 64, 'key-' || k, 'x', 'y', 'z', '{}' FROM generate_series(0, 9999) AS k ORDER BY 'key-' || k;
INSERT INTO classic_outbox (id, type, payload) SELECT gen_random_uuid(), 'z', '{}' FROM generate_series(0, 9999);

-- pieces_switch puts the schema in variant v's shape (from any other).
CREATE PROCEDURE pieces_switch(v text) LANGUAGE plpgsql AS $$
DECLARE
    t text;
BEGIN
    ALTER TABLE outbox DISABLE TRIGGER USER;
    IF v NOT IN ('classic', 'bare') THEN
        ALTER TABLE outbox ENABLE TRIGGER outbox_notify;
        IF v IN ('nonotify', 'rowwake', 'm12') THEN
            ALTER TABLE outbox DISABLE TRIGGER outbox_notify;
        END IF;
        t := CASE WHEN v IN ('noprobe', 'nolen', 'nopartcheck', 'noset', 'floor', 'rowwake', 'm12') THEN 't_' || v ELSE 'outbox_assign_key_seq' END;
        EXECUTE format('ALTER TABLE outbox ENABLE TRIGGER %I', t);
    END IF;
    DROP INDEX IF EXISTS outbox_pending_by_partition, outbox_parked, outbox_retention, outbox_dead;
    ALTER TABLE outbox DROP CONSTRAINT IF EXISTS outbox_key_seq_key, DROP CONSTRAINT IF EXISTS outbox_attempts_nonnegative,
        DROP CONSTRAINT IF EXISTS outbox_dead_is_processed, DROP CONSTRAINT IF EXISTS outbox_partition_range;
    IF v <> 'nopending' THEN
        CREATE INDEX outbox_pending_by_partition ON outbox (partition, seq) WHERE processed_at IS NULL;
    END IF;
    IF v <> 'nopartial' THEN
        CREATE INDEX outbox_parked ON outbox (partition) WHERE parked_at IS NOT NULL AND processed_at IS NULL;
        CREATE INDEX outbox_retention ON outbox (partition, processed_at) WHERE processed_at IS NOT NULL AND dead_at IS NULL;
        CREATE INDEX outbox_dead ON outbox (correlation_id, key_seq) WHERE dead_at IS NOT NULL;
    END IF;
    IF v <> 'nokeyidx' THEN
        ALTER TABLE outbox ADD CONSTRAINT outbox_key_seq_key UNIQUE (correlation_id, key_seq);
    END IF;
    IF v NOT IN ('nochecks', 'm12') THEN
        ALTER TABLE outbox ADD CONSTRAINT outbox_attempts_nonnegative CHECK (attempts >= 0),
            ADD CONSTRAINT outbox_dead_is_processed CHECK (dead_at IS NULL OR processed_at IS NOT NULL),
            ADD CONSTRAINT outbox_partition_range CHECK (partition >= 0 AND partition < 64);
    END IF;
END
$$;

-- pieces_rows inserts n rows, one per transaction, as variant v's producer does.
CREATE PROCEDURE pieces_rows(v text, n int) LANGUAGE plpgsql AS $$
DECLARE
    k int;
BEGIN
    FOR i IN 1..n LOOP
        k := floor(random() * 10000)::int;
        IF v = 'classic' THEN
            INSERT INTO classic_outbox (id, type, payload)
            VALUES (gen_random_uuid(), 'ordo.bench.event.v1', '{"key":"key-1234","t":1767000000000000000,"pad":"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}');
        ELSIF v = 'bare' THEN
            INSERT INTO outbox (id, partition, correlation_id, key_seq, exchange, routing_key, type, payload, occurred_at)
            VALUES (gen_random_uuid(), k % 64, 'key-' || k, nextval('bare_key_seq'), 'ordo.bench.produce', 'bench.event', 'ordo.bench.event.v1', '{"key":"key-1234","t":1767000000000000000,"pad":"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}', clock_timestamp());
        ELSE
            INSERT INTO outbox (id, partition, correlation_id, exchange, routing_key, type, payload)
            VALUES (gen_random_uuid(), k % 64, 'key-' || k, 'ordo.bench.produce', 'bench.event', 'ordo.bench.event.v1', '{"key":"key-1234","t":1767000000000000000,"pad":"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}');
        END IF;
        COMMIT;
    END LOOP;
END
$$;

-- pieces_trial measures variant v: a warm-up, then n rows.
CREATE PROCEDURE pieces_trial(v text, rep int, n int) LANGUAGE plpgsql AS $$
DECLARE
    c0 bigint;
BEGIN
    CALL pieces_switch(v);
    COMMIT;
    CALL pieces_rows(v, 300);
    c0 := pieces_cpu();
    CALL pieces_rows(v, n);
    INSERT INTO pieces_result VALUES (v, rep, round((pieces_cpu() - c0) * 1e6 / 100 / n, 1));
    COMMIT;
END
$$;
