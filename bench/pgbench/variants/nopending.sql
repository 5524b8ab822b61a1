-- m11 without the pending (partition, seq) index
DROP INDEX outbox_pending_by_partition;
