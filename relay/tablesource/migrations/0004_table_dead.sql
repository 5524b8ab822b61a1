-- A partition's dead rows, for their retention (Store.DeleteProcessed): a
-- probe per partition, whatever the backlog. Only dead rows are in it.
CREATE INDEX ordo_table_rows_dead ON ordo_table_rows (partition, dead_at)
    WHERE dead_at IS NOT NULL;
