-- m11's trigger reduced to the counter UPDATE (no checks, no probe, no first-row branch, no SET): the least a trigger-assigned key_seq costs
CREATE OR REPLACE FUNCTION outbox_assign_key_seq() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE outbox_keys SET last_key_seq = last_key_seq + 1 WHERE correlation_id = NEW.correlation_id
        RETURNING last_key_seq INTO NEW.key_seq;
    NEW.occurred_at := clock_timestamp();
    RETURN NEW;
END
$$;
-- its counter rows exist before the prefill (which the floor cannot insert)
INSERT INTO outbox_keys (correlation_id, last_key_seq, partition) SELECT 'key-' || k, 1, k % 64 FROM generate_series(0, 9999) AS k;
