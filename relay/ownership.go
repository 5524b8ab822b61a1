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

// Ownership tells a relay which partitions its node holds and hands them
// over: it pushes an Assigned when the node has claimed a partition and a
// Revoked when the relay must give one up, and answers Lease, the live
// check the relay makes right before every publish. The relay reads only
// partitions it was assigned, publishes a row only while its partition's
// lease is valid at the epoch the row was read under, and stamps every
// write with that epoch so the Store can refuse it once the lease has
// moved. Implementations are safe for concurrent use.
//
// A handoff, in franz-go's shape: the Ownership stops offering the
// partition (Lease reports it not held: no new publish passes the check)
// and sends Revoked; the relay stops the partition's work, waits until
// every message of it that was published has been confirmed and marked
// (or failed and recorded, or found unsent), then calls Revoked.Done. The
// Ownership releases the lease then, or after a timeout of its own if Done
// does not come; it never waits on the relay for anything else.
type Ownership interface {
	// Lease returns the lease of one partition, if the node holds it and
	// is not handing it off.
	Lease(partition int) (Lease, bool)
	// Events delivers Assigned and Revoked values, each partition's in
	// the order they happened. Sending them never blocks the Ownership's
	// own work (renewals): it queues them until the relay receives.
	Events() <-chan Event
}

// Event is what an Ownership sends its relay: Assigned or Revoked.
type Event interface{ ownershipEvent() }

// Assigned tells the relay that its node holds Lease.Partition at
// Lease.Epoch from now on: the relay reads it from its first pending row.
// An Assigned at another epoch than the one the relay works under replaces
// it: what the relay had read of the partition is forgotten.
type Assigned struct {
	Lease Lease
}

// Revoked tells the relay to stop working on Partition at Epoch: read and
// publish nothing more of it, let its messages in flight settle and their
// outcomes be written, then call Done.
type Revoked struct {
	Partition int
	Epoch     int64
	// Done, when not nil, is called by the relay exactly once, when
	// nothing of the partition is in flight any more: every message of it
	// published under Epoch has been confirmed and marked, failed and
	// recorded, or found unsent. It must not block. Nil when nothing
	// waits: the lease is already gone (another node holds it now).
	Done func()
}

func (Assigned) ownershipEvent() {}
func (Revoked) ownershipEvent()  {}
