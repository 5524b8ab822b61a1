-- Rows held behind a parked row of their key (held_behind: that row's
-- key_seq), as Ordo's own outbox holds them: a read that meets a row
-- behind a parked one holds it and every pending row of its key above the
-- parked row, and no later read returns them, so a parked key's backlog
-- is read about once, not on every pass. They are released when the
-- parked row is retried (parked_at cleared), skipped (dead_at set) or
-- deleted: an operator's SQL needs to do nothing more.
ALTER TABLE ordo_table_rows ADD COLUMN held_behind bigint;

DROP INDEX ordo_table_rows_ready;
CREATE INDEX ordo_table_rows_ready ON ordo_table_rows (partition, seq)
    WHERE parked_at IS NULL AND dead_at IS NULL AND held_behind IS NULL;

CREATE FUNCTION ordo_table_release_held() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE ordo_table_rows SET held_behind = NULL
    WHERE key = OLD.key AND key_seq > OLD.key_seq AND held_behind = OLD.key_seq;
    RETURN NULL;
END
$$;

CREATE TRIGGER ordo_table_release_held_update
    AFTER UPDATE OF parked_at, dead_at ON ordo_table_rows FOR EACH ROW
    WHEN (OLD.parked_at IS NOT NULL AND OLD.dead_at IS NULL AND (NEW.parked_at IS NULL OR NEW.dead_at IS NOT NULL))
    EXECUTE FUNCTION ordo_table_release_held();

CREATE TRIGGER ordo_table_release_held_delete
    AFTER DELETE ON ordo_table_rows FOR EACH ROW
    WHEN (OLD.parked_at IS NOT NULL AND OLD.dead_at IS NULL)
    EXECUTE FUNCTION ordo_table_release_held();
