-- m11 without the unique (correlation_id, key_seq) index
ALTER TABLE outbox DROP CONSTRAINT outbox_key_seq_key;
