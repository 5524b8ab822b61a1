-- Sources (docs/design.md, "Sources"): one Ordo cluster may relay several
-- outbox databases, and key_seq is gap-free per (source, correlation id),
-- so the inbox keys its state by (consumer, source, correlation id). The
-- source is a message's x-ordo-source header, 'default' when absent.
--
-- Upgrade in place: every existing row becomes the source 'default' (a
-- constant default adds the column without rewriting the table), and the
-- primary keys are rebuilt with the source (an index build, under the
-- migration's lock). The defaults stay, so an instance of the previous
-- release, still running during a rolling upgrade, keeps writing
-- 'default' rows, which is what its messages are: upgrade every instance
-- before a second source publishes to the consumer.
ALTER TABLE ordo_inbox_keys ADD COLUMN source text NOT NULL DEFAULT 'default';
ALTER TABLE ordo_inbox_keys DROP CONSTRAINT ordo_inbox_keys_pkey;
ALTER TABLE ordo_inbox_keys ADD PRIMARY KEY (consumer, source, correlation_id);

ALTER TABLE ordo_inbox_messages ADD COLUMN source text NOT NULL DEFAULT 'default';
ALTER TABLE ordo_inbox_messages DROP CONSTRAINT ordo_inbox_messages_pkey;
ALTER TABLE ordo_inbox_messages ADD PRIMARY KEY (consumer, source, correlation_id, key_seq);

-- The retention low-water mark stays one per consumer (see
-- docs/consumer.md, "Sources"): its key changes nothing that a release
-- without sources reads.

-- An operator action names the source of its key.
ALTER TABLE ordo_inbox_audit ADD COLUMN source text NOT NULL DEFAULT 'default';
