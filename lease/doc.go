// Package lease decides which node does publish each partition: a lease
// per partition in PostgreSQL, with an owner, an expiry and an epoch that
// fences off every write of an earlier holder (DESIGN.md invariant 3).
//
// # Schema
//
// The package owns the lease tables, ordo_leases (one row per partition)
// and ordo_lease_audit (every claim, release, expiry, lost renewal and
// refused stale-epoch write). Migrate creates them from the embedded
// migrations/*.sql, recorded as component "lease" in
// ordo_schema_migrations, and seeds the lease rows. Other packages use the
// tables without owning them: relay/pgstore checks a lease row in every
// write and records refused writes in the audit, node reads them for
// /status. Earlier releases created the two tables in the outbox
// component's migrations 2 and 3; on such a database Migrate adopts those
// versions (records them as its own) instead of running them again.
package lease
