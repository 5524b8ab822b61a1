package relay

import (
	"github.com/google/uuid"
)

// The relay's state, and who owns each piece of it. Everything below is
// guarded by Relay.mu.
//
//   - Relay.parts holds a partState per held partition, for one lease
//     epoch (handoff.go makes and drops them). A partState owns its keys
//     and the rows read ahead of them (partState.queued, keyState.rows),
//     and a partReader (pass.go): the cursor, the passes and the wake-up
//     flags of the partition. Only partReader's methods change those;
//     likewise its slowRead (slowread.go), where it stands after reads of
//     it timed out.
//   - A keyState is one key's rows read ahead, in key_seq order, and its
//     place in the per-key rule (keyrule.go): what it published and had
//     confirmed in this epoch, and how many of its flights stand in each
//     state (keyState.flights, kept by flightBook.move alone).
//   - A flight (flight.go) is one published message, from nextFlight
//     until it is marked, its failure recorded, or it turns out unsent.
//     Relay.flights owns them all and moves each through its states in one
//     function; every count of flights (per key, per partition, the
//     node's unconfirmed and in flight) follows from those moves. It
//     also holds how many flights of one key may be unsettled at once
//     (perKey: 1 but in tests) and the tracer that starts their spans.
//   - Relay.gen, a readGen (readgen.go), says whether a row a read
//     returned is newer than what memory holds: whether marks or failure
//     records were written since the read began.
//   - Relay.settled, a writeBack (writeback.go), holds the settlements
//     waiting to be written; settle adds to it, the mark loop takes
//     from it, and only its methods change it.
//   - Relay.queues (queues.go) holds the keys waiting to be looked at by
//     dispatch (ready), for a time (backing off) or for a lease (lease
//     wait); only its methods change the three lines and keyState.inReady.
//   - Relay.mem (memory.go) counts the memory of rows read ahead and of
//     flights, in the relay's count and its Budget's at once, and holds
//     the half-free mark; only its methods change them. A parked head is
//     charged nothing.
//   - With a Config.Budget, the relay's part of it (a share, which
//     flightBook and memory hold, set once by New):
//     flightBook takes and gives back its slots (flight.go), the read
//     asks it for bytes (read.go). Its counts are under the Budget's lock.
//   - Relay.wake, a wakes (wake.go), holds the three signals the read,
//     dispatch and mark loops wait on, which any file may send, and the
//     wake-up state (the commit rate, busy, polls, arming); only wake.go
//     writes that state, and other files tell it what happened through
//     its methods (readTook, stray).
//   - Relay.progress (progress.go) says whether the relay is stalled, and
//     when it last looked.

// partState is what the relay holds in memory of one partition, for one
// lease epoch: its keys' rows and where its reading stands.
type partState struct {
	id     int
	epoch  int64
	keys   map[string]*keyState
	queued map[uuid.UUID]*entry // read ahead, not in flight
	rd     partReader           // cursor, passes and wake-ups (pass.go)
	slow   slowRead             // after reads of it timed out (slowread.go)
}

// keyState is one key's rows read ahead and its place in the per-key rule.
type keyState struct {
	part      *partState
	name      string
	rows      []*entry     // read ahead, not in flight, ascending key_seq
	flights   flightCounts // its flights by state (flightBook.move)
	published int64        // highest key_seq published in this epoch
	confirmed int64        // highest key_seq confirmed in this epoch
	failGen   uint64       // readGen after its last failure record (readgen.go)
	gapFrom   int64        // key_seq of a row left out for memory since its pass began: none above it is queued (0: none)
	inReady   bool
}

// entry is one row held in memory.
type entry struct {
	row    Row
	seen   uint64 // the pass of its partition that last read it
	size   int64
	unsent int // publishes in a row settled Unsent (see Relay.unsentDelay)
}

// rowSize is what row r is charged in memory (memory.go): a parked row
// nothing, it waits for an operator; any other its text and payload.
func rowSize(r *Row) int64 {
	if r.Parked {
		return 0
	}
	return int64(len(r.Payload)+len(r.Headers)+len(r.CorrelationID)+len(r.Exchange)+len(r.RoutingKey)+len(r.Type)) + 400 // the Row, its entry, map slots and key state, roughly
}

func newPartState(p int, epoch int64) *partState {
	return &partState{id: p, epoch: epoch, keys: map[string]*keyState{}, queued: map[uuid.UUID]*entry{}, rd: newPartReader()}
}

func (ps *partState) key(name string) *keyState {
	k := ps.keys[name]
	if k == nil {
		k = &keyState{part: ps, name: name}
		ps.keys[name] = k
	}
	return k
}

func (r *Relay) dropPartLocked(ps *partState) {
	if ps.rd.isArmed() {
		r.wake.stray(ps.id) // disarmed by the next syncArms
	}
	for _, e := range ps.queued {
		r.mem.add(-e.size)
	}
	for _, k := range ps.keys {
		r.queues.forget(k)
	}
	delete(r.parts, ps.id)
}

// currentLocked reports whether k's partition is still the one in memory.
func (r *Relay) currentLocked(k *keyState) bool {
	return r.parts[k.part.id] == k.part
}

// pushReadyLocked puts k in line for the dispatch loop, and wakes it. A
// key whose head is parked is not: it cannot go until a read brings its
// head back unparked (after an operator's retry), and a pass would
// otherwise line up every parked key for nothing.
func (r *Relay) pushReadyLocked(k *keyState) {
	if len(k.rows) > 0 && !k.rows[0].row.Parked && r.queues.push(k) {
		signal(r.wake.dispatch)
	}
}
