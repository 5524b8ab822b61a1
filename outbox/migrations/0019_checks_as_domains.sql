-- The single-column checks move from the table to domains: same rule,
-- same names, a fraction of the cost.
--
-- PostgreSQL (15) reads every CHECK constraint of a table back from its
-- stored text (stringToNode) and prepares it for each INSERT or UPDATE
-- statement it runs: the three constraints of outbox were about 18 % of
-- the backend CPU of a producer's one-row INSERT without the key_seq
-- trigger (perf, docs/outbox-table.md, "What an insert costs"). A
-- domain's constraint is kept parsed in the type cache, and a column of a
-- domain type is checked only where a statement writes it: a producer's
-- INSERT checks the partition (and the attempts' default), a relay's mark
-- checks nothing.
--
-- A violation is still SQLSTATE 23514 naming outbox_partition_range or
-- outbox_attempts_nonnegative. Clients see the columns as integer (the
-- row description gives a domain's base type), and a parameter bound to
-- them is inferred as the domain, which drivers send as integer.
--
-- No rewrite: a domain without a constraint over the column's own type
-- needs none, so the constraints are dropped first (a constraint on a
-- column whose type changes would be re-added and re-validated over the
-- whole table) and added to the domains after, NOT VALID: every row
-- present passed the table constraint it replaces. The partial indexes
-- on partition (ready, parked, retention) are rebuilt (PostgreSQL keeps
-- an index across a type change only if it has no predicate), in the
-- migration's transaction: producers wait for it, about 1.2 s per
-- million rows in the table (1,000,000 rows, 40 % of them pending, on
-- this project's 2-core machine), within the migration's statement
-- timeout (2 min). With a larger table, upgrade while producers are
-- quiet.
-- outbox_partition_range needs P, which a fresh database does not have
-- yet: outbox.Migrate adds it at install (install in outbox/migrate.go).
--
-- outbox_dead_is_processed spans two columns and stays a table
-- constraint: outbox.DropKeySeqTrigger drops it once every node holding a
-- lease is of release 3, whose mark clears a dead_at it did not write and
-- whose purge deletes only processed rows (docs/outbox-table.md).
ALTER TABLE outbox DROP CONSTRAINT IF EXISTS outbox_partition_range,
                   DROP CONSTRAINT IF EXISTS outbox_attempts_nonnegative;

CREATE DOMAIN outbox_partition AS integer;
CREATE DOMAIN outbox_attempts AS integer;
ALTER TABLE outbox ALTER COLUMN partition TYPE outbox_partition,
                   ALTER COLUMN attempts TYPE outbox_attempts;

ALTER DOMAIN outbox_attempts ADD CONSTRAINT outbox_attempts_nonnegative CHECK (VALUE >= 0) NOT VALID;

DO $$
DECLARE
    p int;
BEGIN
    SELECT partitions INTO p FROM ordo_settings;
    IF p IS NOT NULL THEN
        EXECUTE format('ALTER DOMAIN outbox_partition ADD CONSTRAINT outbox_partition_range CHECK (VALUE >= 0 AND VALUE < %s) NOT VALID', p);
    END IF;
END
$$;
