// Package partition maps ordering keys (correlation ids) to partitions,
// and partitions to the members of a cluster. It is pure: no I/O, no
// goroutines. Who holds a partition (leases, epochs) is package lease's.
//
// The partition function is part of Ordo's public contract: a producer in any
// language computes it to fill the outbox row's partition column. It is
//
//	partition = XXH64(utf8(correlationID), seed 0) mod P
//
// with the 64-bit hash taken as an unsigned integer. P is fixed when the
// outbox is installed (see docs/outbox-table.md).
//
// Assign spreads P partitions over the members evenly (⌊P/N⌋ or ⌈P/N⌉
// each) and moves few of them when a member comes or goes (see
// docs/assignment.md); every node computes the same map from the same
// member set. Assignment.Owned is what a lease.Config's Want returns.
//
// AssignSources does the same over (source, partition) pairs when one
// cluster serves several outbox databases: balanced per source and over
// all pairs, and exactly Assign's map for the one source named
// wire.DefaultSource.
package partition
