-- m11 without the trigger function's SET enable_seqscan = off
ALTER FUNCTION outbox_assign_key_seq() RESET enable_seqscan;
