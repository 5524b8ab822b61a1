-- Partition leases: who publishes each partition (docs/design.md, invariant 3).
-- One row per partition, seeded at install and on every start by
-- lease.Migrate. A node owns partition p while owner = its name and its
-- epoch is the current one; every relay write checks both.
-- (Until the lease component owned it, this was part of the outbox
-- component's migration 2, 0002_leases.sql; lease.Migrate adopts it.)
CREATE TABLE ordo_leases (
    partition  int         PRIMARY KEY CHECK (partition >= 0),
    owner      text,
    epoch      bigint      NOT NULL DEFAULT 0,
    expires_at timestamptz NOT NULL DEFAULT '-infinity',
    claimed_at timestamptz
);
