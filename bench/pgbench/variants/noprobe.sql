-- m11's trigger without the id probe
CREATE OR REPLACE FUNCTION outbox_assign_key_seq() RETURNS trigger
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
