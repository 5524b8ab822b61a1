package relaytest

import (
	"sync"
	"time"

	"github.com/ordo-relay/ordo/relay"
)

// LeaseTable is the in-memory counterpart of the ordo_leases table: who
// holds each partition, at which epoch. The in-memory Store checks every
// write against it. Safe for concurrent use.
type LeaseTable struct {
	mu     sync.Mutex
	owner  map[int]string
	epoch  map[int]int64
	owners map[string]*Ownership
}

// NewLeaseTable returns a table with no partition held.
func NewLeaseTable() *LeaseTable {
	return &LeaseTable{owner: map[int]string{}, epoch: map[int]int64{}, owners: map[string]*Ownership{}}
}

// Holds reports whether node holds partition at epoch.
func (t *LeaseTable) Holds(node string, partition int, epoch int64) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.owner[partition] == node && t.epoch[partition] == epoch
}

// Epoch returns the partition's current epoch.
func (t *LeaseTable) Epoch(partition int) int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.epoch[partition]
}

// Ownership returns node's view of the table, the relay.Ownership a relay
// of that node consumes. Leases it is granted stay valid for ttl after each
// Renew (or forever when ttl is 0).
func (t *LeaseTable) Ownership(node string, ttl time.Duration) *Ownership {
	t.mu.Lock()
	defer t.mu.Unlock()
	o := &Ownership{table: t, node: node, ttl: ttl, held: map[int]relay.Lease{}, revoking: map[int]bool{},
		events: make(chan relay.Event, eventBuffer)}
	t.owners[node] = o
	return o
}

// Grant gives partitions to node at a new epoch each, as a claim does,
// taking them from whoever held them (that holder's view loses them at
// once, as if its renewal had failed: its relay gets a Revoked with no
// Done).
func (t *LeaseTable) Grant(node string, partitions ...int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, p := range partitions {
		if prev := t.owners[t.owner[p]]; prev != nil && t.owner[p] != node {
			prev.drop(p, t.epoch[p])
		}
		t.epoch[p]++
		t.owner[p] = node
		if o := t.owners[node]; o != nil {
			o.add(p, t.epoch[p])
		}
	}
}

// Steal moves partitions to node in the table only: the previous holder's
// view still believes it holds them (a paused node that has not yet
// noticed). Its writes are refused from now on.
func (t *LeaseTable) Steal(node string, partitions ...int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, p := range partitions {
		t.epoch[p]++
		t.owner[p] = node
	}
}

// eventBuffer is how many events an Ownership queues for a relay that does
// not receive them; a test that needs more is doing something else.
const eventBuffer = 4096

// Ownership is one node's view of a LeaseTable; it implements the
// Ownership contract the relay consumes, and sends its relay an Assigned
// for every grant and a Revoked for every loss and Revoke.
type Ownership struct {
	table  *LeaseTable
	node   string
	ttl    time.Duration
	events chan relay.Event

	mu       sync.Mutex
	held     map[int]relay.Lease
	revoking map[int]bool
}

var _ relay.Ownership = (*Ownership)(nil)

func (o *Ownership) deadline() time.Time {
	if o.ttl == 0 {
		return time.Now().Add(24 * time.Hour)
	}
	return time.Now().Add(o.ttl)
}

// send queues ev for the relay; it panics rather than block when the relay
// has not received eventBuffer events.
func (o *Ownership) send(ev relay.Event) {
	select {
	case o.events <- ev:
	default:
		panic("relaytest: Ownership event buffer full: is a relay receiving?")
	}
}

func (o *Ownership) add(p int, epoch int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	l := relay.Lease{Partition: p, Epoch: epoch, Deadline: o.deadline()}
	o.held[p] = l
	delete(o.revoking, p)
	o.send(relay.Assigned{Lease: l})
}

func (o *Ownership) drop(p int, epoch int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	delete(o.held, p)
	delete(o.revoking, p)
	o.send(relay.Revoked{Partition: p, Epoch: epoch})
}

// Renew extends every held lease by the TTL from now, as a successful
// renewal does.
func (o *Ownership) Renew() {
	o.mu.Lock()
	defer o.mu.Unlock()
	for p, l := range o.held {
		l.Deadline = o.deadline()
		o.held[p] = l
	}
}

// Expire sets every held lease's local deadline in the past, as a node
// that could not renew in time sees it.
func (o *Ownership) Expire() {
	o.mu.Lock()
	defer o.mu.Unlock()
	for p, l := range o.held {
		l.Deadline = time.Now().Add(-time.Millisecond)
		o.held[p] = l
	}
}

// Revoke starts handing partition p off, as a Leaser does when p is no
// longer wanted: p is no longer offered to the relay, though still held in
// the table, and the relay gets a Revoked. The returned channel is closed
// when the relay calls its Done. Revoke of a partition not held returns
// nil.
func (o *Ownership) Revoke(p int) <-chan struct{} {
	o.mu.Lock()
	defer o.mu.Unlock()
	l, ok := o.held[p]
	if !ok {
		return nil
	}
	o.revoking[p] = true
	acked := make(chan struct{})
	var once sync.Once
	o.send(relay.Revoked{Partition: p, Epoch: l.Epoch, Done: func() { once.Do(func() { close(acked) }) }})
	return acked
}

// Keep takes back a Revoke of p, as a Leaser does when p is wanted again
// before it was released: p is offered again, at the same epoch, and the
// relay gets an Assigned. It reports whether p was being revoked. The
// Done of the Revoke taken back may still be called by the relay; nothing
// waits for it any more.
func (o *Ownership) Keep(p int) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	l, ok := o.held[p]
	if !ok || !o.revoking[p] {
		return false
	}
	delete(o.revoking, p)
	o.send(relay.Assigned{Lease: l})
	return true
}

// Leases returns a copy of the leases held now, by partition, leaving out
// partitions being handed off.
func (o *Ownership) Leases() map[int]relay.Lease {
	o.mu.Lock()
	defer o.mu.Unlock()
	m := make(map[int]relay.Lease, len(o.held))
	for p, l := range o.held {
		if !o.revoking[p] {
			m[p] = l
		}
	}
	return m
}

// Lease implements the Ownership contract.
func (o *Ownership) Lease(p int) (relay.Lease, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	l, ok := o.held[p]
	if !ok || o.revoking[p] {
		return relay.Lease{}, false
	}
	return l, true
}

// Events implements the Ownership contract.
func (o *Ownership) Events() <-chan relay.Event { return o.events }
