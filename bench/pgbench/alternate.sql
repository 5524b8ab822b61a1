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

-- The trigger variants trig_<name>() come before this file (alternate.sh
-- makes them from the migrations).
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
