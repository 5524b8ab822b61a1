-- A partition's parked rows, for the node's backlog count (/status,
-- metrics): a bounded probe per partition, whatever the backlog. Only
-- parked rows are in it.
CREATE INDEX ordo_table_rows_parked ON ordo_table_rows (partition)
    WHERE parked_at IS NOT NULL AND dead_at IS NULL;
