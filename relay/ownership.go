package relay

import "time"

// Lease is one partition held by this node.
type Lease struct {
	Partition int
	// Epoch is the fencing token: every relay write for the partition
	// checks that the lease row still carries it.
	Epoch int64
	// Deadline is the local, monotonic instant after which the node must
	// not publish under this lease: the time it sent its last successful
	// claim or renewal, plus the TTL, minus a safety margin.
	Deadline time.Time
}

// Valid reports whether the lease may be published under at now.
func (l Lease) Valid(now time.Time) bool { return now.Before(l.Deadline) }

// Ownership tells a relay which partitions its node holds. The relay reads
// only partitions it holds, publishes a row only while its partition's
// lease is valid at the epoch the row was read under, and stamps every
// write with that epoch so the Store can refuse it once the lease has
// moved. Implementations are safe for concurrent use.
type Ownership interface {
	// Leases returns a copy of the leases held now, by partition, leaving
	// out partitions being handed off.
	Leases() map[int]Lease
	// Lease returns the lease of one partition, if it is held and not
	// being handed off. Cheaper than Leases for a single check.
	Lease(partition int) (Lease, bool)
	// Changed is signalled (non-blocking, coalesced) whenever the held set
	// or an epoch changes.
	Changed() <-chan struct{}
}
