// Package lease decides which node holds each partition: a Leaser claims
// the partitions its node should own, renews them, hands off those it
// should no longer own, and fences every holder with an epoch, in the
// ordo_leases table of PostgreSQL. Gossip (package membership) and
// assignment (package partition) say who should own a partition; a lease
// says who does.
//
// A claim takes a lease that is free, expired, or already this node's, and
// bumps its epoch; every write of the relay checks the epoch in its own
// transaction, so a node that lost a lease (paused, cut off) cannot mark
// rows under it any more. A node stops publishing under a lease at its
// local deadline: the time it sent its last successful claim or renewal,
// plus the TTL, minus a margin, which comes before the database's expiry.
//
// Timing (TimingFor) is the lease timing rule: every interval a node
// derives from its TTL (the margin and renewal above, the health hold, the
// reconnect caps, ...), in one place, with the invariants between them
// checked by its Validate.
//
// The package owns the lease tables, ordo_leases and ordo_lease_audit:
// Migrate creates them (see its doc for the move from the outbox's
// migrations).
//
// The Leaser implements relay.Ownership, the relay's driver-free view of
// it: it sends an Assigned for every lease claimed and a Revoked for every
// lease to give up, and releases a revoked lease once the relay calls the
// Revoked's Done (nothing of the partition in flight) or Config's
// HandoffTimeout passes. Renewals never wait for the relay.
//
//	l, err := lease.New(cfg)         // cfg from lease.DefaultConfig, then Node, Want, Connect
//	r, err := relay.New(rcfg, store, pub, l)
//	go l.Run(ctx)                    // stop it after the relay: it releases its leases on the way out
//	r.Run(relayCtx)
package lease
