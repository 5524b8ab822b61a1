-- Dead rows by key, so the relay's "is the row below this one dead?" check
-- (x-ordo-prev-key-seq) probes a tiny index instead of scanning the table.
CREATE INDEX outbox_dead ON outbox (correlation_id, key_seq) WHERE dead_at IS NOT NULL;
