-- Partition leases: who publishes each partition (DESIGN.md invariant 3).
-- One row per partition, seeded at install and on every start by
-- outbox.Migrate. A node owns partition p while owner = its name and its
-- epoch is the current one; every relay write checks both.
CREATE TABLE ordo_leases (
    partition  int         PRIMARY KEY CHECK (partition >= 0),
    owner      text,
    epoch      bigint      NOT NULL DEFAULT 0,
    expires_at timestamptz NOT NULL DEFAULT '-infinity',
    claimed_at timestamptz
);

-- Key heads are read in seq order among pending rows.
CREATE INDEX outbox_pending_seq ON outbox (seq) WHERE processed_at IS NULL;
