-- The partial indexes a new row does not enter: only their predicates
-- are tested at insert.
DROP INDEX outbox_dead, outbox_parked, outbox_retention, outbox_key_seq_key;
