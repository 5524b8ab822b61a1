-- Producers' commits do not NOTIFY in the common case. A
-- transaction that issued NOTIFY takes one database-wide lock before its
-- commit and holds it until after (PreCommit_Notify), so notifying
-- producers cannot share a WAL flush: every producer paid for it on every
-- commit, and all of them together committed at most about once per fsync.
--
-- Now a relay arms a partition when it is idle: it holds the session
-- advisory lock (1869767791 = 'ordo', partition) exclusively
-- (outbox.WakeLockClass; relay/pgstore). For each partition a statement
-- writes to, the trigger tries that lock shared:
--   * the try fails: a relay waits for this partition: notify, as before;
--   * it succeeds: no relay waits (it is busy and polls): no notification,
--     and the shared lock is kept until the transaction ends, so that a
--     relay's arm succeeds only once every producer that did not notify
--     has committed or rolled back (none is missed between its last read
--     and its arm).
-- A shared advisory lock costs an entry in the lock table, no WAL and no
-- lock held across the commit's flush. A transaction holds one per
-- partition it writes to; a statement that writes to more than 16
-- partitions notifies them without locks (one NOTIFY lock per transaction
-- is small for a batch that large, and the lock table stays small).
--
-- Relays of earlier releases only LISTEN: they are woken by commits to
-- partitions a new relay armed, which they do not hold, and otherwise find
-- commits by their poll (within 5 s; docs/design.md, "Rolling upgrade").
CREATE OR REPLACE FUNCTION outbox_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    parts int[];
    p int;
BEGIN
    SELECT array_agg(DISTINCT partition) INTO parts FROM new_rows;
    IF cardinality(parts) > 16 THEN
        FOREACH p IN ARRAY parts LOOP
            PERFORM pg_notify('ordo_outbox', p::text);
        END LOOP;
        RETURN NULL;
    END IF;
    FOREACH p IN ARRAY coalesce(parts, '{}') LOOP
        IF NOT pg_try_advisory_xact_lock_shared(1869767791, p) THEN
            PERFORM pg_notify('ordo_outbox', p::text);
        END IF;
    END LOOP;
    RETURN NULL;
END
$$;
