-- Group commit's advance (docs/consumer.md, "The fast path"): one call
-- records, fenced, the last handled message of each key of a batch.
-- Each key's row is updated by its primary key, a plan no table size or
-- missing statistics can change: one UPDATE ... FROM the batch's arrays,
-- planned while the table was empty and cached, hashed every key row of
-- the consumer for each batch. It returns whether the lease held (epoch
-- 0: no lease), the key rows updated, and per key, in order, whether a
-- stored message of the key is left after the key_seq handled. An
-- instance of the previous release does not call it.
CREATE FUNCTION ordo_inbox_advance_keys(
    p_consumer text, p_shard int, p_owner text, p_epoch bigint,
    p_sources text[], p_keys text[], p_seqs bigint[], p_ids text[], p_occurred timestamptz[],
    OUT held boolean, OUT advanced int, OUT more boolean[])
LANGUAGE plpgsql AS $$
DECLARE
    n int;
BEGIN
    advanced := 0;
    more := '{}';
    held := p_epoch = 0;
    IF NOT held THEN
        PERFORM 1 FROM ordo_inbox_leases
        WHERE consumer = p_consumer AND shard = p_shard AND owner = p_owner AND epoch = p_epoch AND p_epoch > 0
        FOR KEY SHARE;
        held := FOUND;
    END IF;
    IF NOT held THEN
        RETURN;
    END IF;
    FOR i IN 1 .. coalesce(array_length(p_keys, 1), 0) LOOP
        UPDATE ordo_inbox_keys
        SET last_seq = p_seqs[i], last_message_id = p_ids[i], last_occurred_at = p_occurred[i], handled_at = now()
        WHERE consumer = p_consumer AND source = p_sources[i] AND correlation_id = p_keys[i];
        GET DIAGNOSTICS n = ROW_COUNT;
        advanced := advanced + n;
        more := more || EXISTS (
            SELECT 1 FROM ordo_inbox_messages
            WHERE consumer = p_consumer AND source = p_sources[i] AND correlation_id = p_keys[i] AND key_seq > p_seqs[i]);
    END LOOP;
END
$$;
