-- Parked keys leave the relay's read (docs/outbox-table.md, "Rows held
-- behind a parked row"). A parked row waits for an operator, and so does
-- every later row of its key; until now each pass of the relay over its
-- partition read them all again: 50,000 parked keys were 100,000 rows
-- re-read by every pass, beside the rows that may go.
--
-- held_behind is the key_seq of the parked row of the same key that a
-- pending row waits behind (NULL: none known). The partition's owner
-- sets it (relay/pgstore, fenced by its lease, with the parked row locked
-- FOR SHARE) when its read finds a row whose row below is parked or held,
-- for every pending row of the key above the parked one.
-- outbox_ready_by_partition holds the pending rows that are neither
-- parked nor held: what the relay reads. A parked row or a held one costs
-- the read nothing after it is held; the rows a producer adds to a parked
-- key are read once, then held.
--
-- Held rows are released by this trigger whenever their parked row stops
-- being parked and pending: an operator's retry (parked_at cleared) or
-- skip (processed), a DELETE, whichever client runs it (the admin API, a
-- relay of an earlier release, psql). The trigger's UPDATE is a statement
-- of its own, which in READ COMMITTED sees every hold committed before it;
-- a hold that has not committed yet holds the parked row FOR SHARE, so
-- the release waits for it and then sees it too.
--
-- outbox_pending_by_partition stays: relays of earlier releases read it
-- (and the node's backlog counts), so a producer's INSERT maintains one
-- partial index more than before (docs/outbox-table.md, "What an insert
-- costs"). Built in the migration's transaction: on a large existing
-- outbox, upgrade while producers are quiet.
ALTER TABLE outbox ADD COLUMN held_behind bigint;

CREATE INDEX outbox_ready_by_partition ON outbox (partition, seq)
    WHERE processed_at IS NULL AND parked_at IS NULL AND held_behind IS NULL;

CREATE FUNCTION outbox_release_held() RETURNS trigger
LANGUAGE plpgsql SET enable_seqscan = off AS $$
BEGIN
    UPDATE outbox SET held_behind = NULL
    WHERE correlation_id = OLD.correlation_id AND key_seq > OLD.key_seq
      AND held_behind = OLD.key_seq AND processed_at IS NULL;
    RETURN NULL;
END
$$;

CREATE TRIGGER outbox_release_held_update
    AFTER UPDATE OF parked_at, processed_at ON outbox
    FOR EACH ROW
    WHEN (OLD.parked_at IS NOT NULL AND OLD.processed_at IS NULL
          AND (NEW.parked_at IS NULL OR NEW.processed_at IS NOT NULL))
    EXECUTE FUNCTION outbox_release_held();

CREATE TRIGGER outbox_release_held_delete
    AFTER DELETE ON outbox
    FOR EACH ROW
    WHEN (OLD.parked_at IS NOT NULL AND OLD.processed_at IS NULL)
    EXECUTE FUNCTION outbox_release_held();
