-- lean without the ready (partition, seq) index, the one partial index
-- a new row enters
DROP INDEX outbox_ready_by_partition;
