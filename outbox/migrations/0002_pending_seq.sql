-- Key heads are read in seq order among pending rows. (Dropped again by
-- migration 9.)
--
-- Until the lease component owned it, this migration, then named
-- 0002_leases.sql, also created ordo_leases: that table is now the lease
-- component's migration 1 (lease/migrations/0001_leases.sql), which adopts
-- this version where it was recorded under its old name. The version stays
-- here so that every release finds outbox versions 1 to 9 applied.
CREATE INDEX outbox_pending_seq ON outbox (seq) WHERE processed_at IS NULL;
