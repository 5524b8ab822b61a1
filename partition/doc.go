// Package partition maps ordering keys (correlation ids) to partitions and,
// in later stages, partitions to cluster members and leases.
//
// The partition function is part of Ordo's public contract: a producer in any
// language computes it to fill the outbox row's partition column. It is
//
//	partition = XXH64(utf8(correlationID), seed 0) mod P
//
// with the 64-bit hash taken as an unsigned integer. P is fixed when the
// outbox is installed (see docs/outbox-table.md).
package partition
