-- The key_seq trigger's "is this id here already?" probe (0006) is a
-- PL/pgSQL query: PostgreSQL plans it for the session and, after five
-- executions, may keep a generic plan for good. Planned while the outbox
-- looked empty (ANALYZE of an empty table), that plan was a sequential
-- scan, run once per inserted row: a 40,000-row burst in one transaction
-- took about 50 s instead of 1. With sequential scans off inside
-- the trigger, its only plan is the primary key probe, whatever the
-- statistics say. A CREATE OR REPLACE of this function must keep the
-- setting (it resets it otherwise); TestTriggerNeverScansTheOutbox checks.
ALTER FUNCTION outbox_assign_key_seq() SET enable_seqscan = off;
