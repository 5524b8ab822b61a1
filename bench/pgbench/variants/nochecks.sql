-- m11 without the three CHECK constraints left on the table
ALTER TABLE outbox DROP CONSTRAINT outbox_partition_range, DROP CONSTRAINT outbox_attempts_nonnegative, DROP CONSTRAINT outbox_dead_is_processed;
