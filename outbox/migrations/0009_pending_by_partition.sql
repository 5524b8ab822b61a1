-- The relay reads each held partition's pending rows in seq order, a page
-- at a time: one index range scan per partition, whose cost
-- follows the rows returned, not the backlog, and which is the only
-- sensible plan with or without statistics. The two indexes the old
-- key-head read walked are dropped, so a producer's insert maintains one
-- index fewer than before. (Built in the migration's transaction: on a
-- large existing outbox, upgrade while producers are quiet.)
CREATE INDEX outbox_pending_by_partition ON outbox (partition, seq) WHERE processed_at IS NULL;
DROP INDEX outbox_pending;
DROP INDEX outbox_pending_seq;
