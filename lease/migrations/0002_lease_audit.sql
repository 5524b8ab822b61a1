-- Lease audit: every claim, release, expiry, renewal failure and refused
-- stale-epoch write, with the node, partition and epoch concerned.
-- (Until the lease component owned it, this was the outbox component's
-- migration 3, 0003_lease_audit.sql; lease.Migrate adopts it.)
CREATE TABLE ordo_lease_audit (
    id        bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at        timestamptz NOT NULL DEFAULT clock_timestamp(),
    node      text        NOT NULL,
    partition int         NOT NULL,
    epoch     bigint      NOT NULL,
    event     text        NOT NULL CHECK (event IN ('claim', 'release', 'expire', 'renew-failed', 'refused-write')),
    detail    text
);

CREATE INDEX ordo_lease_audit_partition ON ordo_lease_audit (partition, at);
