package relay

import (
	"slices"
	"time"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel/trace"
)

// partState is what the relay holds in memory of one partition, for one
// lease epoch: its keys' queues and where its reading stands. Guarded by
// Relay.mu.
type partState struct {
	id     int
	epoch  int64
	keys   map[string]*keyState
	queued map[uuid.UUID]*entry // read ahead, not in flight

	cursor     int64     // highest seq read in this epoch: tail reads continue above it
	passCursor int64     // highest seq read in the current pass
	pass       uint64    // the current pass; entries carry the pass that last saw them
	reading    bool      // a pass is under way: the next read continues at passCursor
	dirty      bool      // a new pass is wanted as soon as minPassGap allows
	lastPass   time.Time // when the current pass began
	passAt     time.Time // when a follow-up pass is due (zero: none)
	passStep   int       // follow-up passes run since the last new rows
	hot        bool      // a tail read is wanted (a notification, a poll, or a full page)
	notified   bool      // a notification came since the last tail read began
	armed      bool      // the Store notifies this partition's commits (see wake.go)
	polledNew  bool      // new rows were found above the cursor while unarmed, since the last pass began
}

// keyState is one key's queue and its place in the per-key rule.
type keyState struct {
	part      *partState
	name      string
	queue     []*entry // read ahead, not in flight, ascending key_seq
	inFlight  int      // published and not yet settled
	writing   int      // failures settled and not yet recorded
	flights   int      // published and not yet marked or recorded failed
	published int64    // highest key_seq published in this epoch
	confirmed int64    // highest key_seq confirmed in this epoch
	lastWrite uint64   // Relay.writes after its last failure record
	inReady   bool
}

// entry is one row held in memory.
type entry struct {
	row    Row
	seen   uint64 // the pass of its partition that last read it
	size   int64
	unsent int // publishes in a row settled Unsent (see Relay.unsentDelay)
}

// flight is one published message, until it is marked or its failure is
// recorded.
type flight struct {
	msg       Message
	attempts  int
	key       *keyState
	e         *entry
	size      int64
	confirmed bool
	span      trace.Span // the publish's PRODUCER span; nil without tracing
}

func rowSize(r *Row) int64 {
	return int64(len(r.Payload)+len(r.Headers)+len(r.CorrelationID)+len(r.Exchange)+len(r.RoutingKey)+len(r.Type)) + 400 // the Row, its entry, map slots and key state, roughly
}

func newPartState(p int, epoch int64) *partState {
	return &partState{id: p, epoch: epoch, keys: map[string]*keyState{}, queued: map[uuid.UUID]*entry{}, dirty: true, passStep: followUps}
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
	if ps.armed {
		r.strays = append(r.strays, ps.id) // disarmed by the next syncArms
	}
	for _, e := range ps.queued {
		r.bytes -= e.size
	}
	for _, k := range ps.keys {
		delete(r.blocked, k)
		delete(r.leaseWait, k)
	}
	delete(r.parts, ps.id)
}

// current reports whether k's partition is still the one in memory.
func (r *Relay) currentLocked(k *keyState) bool {
	return r.parts[k.part.id] == k.part
}

func (r *Relay) pushReadyLocked(k *keyState) {
	if !k.inReady && len(k.queue) > 0 {
		k.inReady = true
		r.ready = append(r.ready, k)
	}
}

// ingestLocked stores the rows one read returned for partition ps (read
// under epoch): rows in flight or just marked are ignored, rows already
// queued take the database's newer word on their state, and new rows join
// their key's queue in key_seq order. A parked row's followers are not
// kept: they cannot go before an operator acts, and the next pass reads
// them again.
func (r *Relay) ingestLocked(ps *partState, rows []Row) {
	for i := range rows {
		row := rows[i]
		ps.cursor = max(ps.cursor, row.Seq)
		if r.flights[row.ID] != nil || r.marked[row.ID] {
			continue
		}
		if row.PrevPending && r.markedKeys[row.CorrelationID] >= row.KeySeq-1 {
			// The row below was marked after this read began: it was
			// pending when read, and is not now.
			row.PrevPending = false
		}
		k := ps.key(row.CorrelationID)
		if e := ps.queued[row.ID]; e != nil {
			// The database's word is newer than ours only if the read
			// began after our last failure record for the key.
			if k.writing == 0 && k.lastWrite <= r.readFrom {
				e.row = row
			}
			e.seen = ps.pass
			r.pushReadyLocked(k)
			continue
		}
		if len(k.queue) > 0 && k.queue[0].row.Parked && row.KeySeq > k.queue[0].row.KeySeq {
			continue
		}
		e := &entry{row: row, seen: ps.pass, size: rowSize(&row)}
		at, _ := slices.BinarySearchFunc(k.queue, row.KeySeq, func(x *entry, ks int64) int {
			return int(min(max(x.row.KeySeq-ks, -1), 1))
		})
		if at > 0 && r.bytes >= r.cfg.ReadAheadBytes {
			// Memory is full and the row waits behind others of its key
			// (blocked ones, say): leave it for a later pass.
			ps.dirty = true
			continue
		}
		k.queue = slices.Insert(k.queue, at, e)
		ps.queued[row.ID] = e
		r.bytes += e.size
		if at == 0 && row.Parked {
			r.dropFollowersLocked(k)
		}
		r.pushReadyLocked(k)
	}
}

// dropFollowersLocked forgets the queued rows behind k's parked head.
func (r *Relay) dropFollowersLocked(k *keyState) {
	for _, e := range k.queue[1:] {
		delete(k.part.queued, e.row.ID)
		r.bytes -= e.size
	}
	clear(k.queue[1:]) // the backing array would keep them alive
	k.queue = k.queue[:1]
}

// sweepLocked ends a pass of ps: queued rows the pass did not see are no
// longer pending (an operator skipped or purged them, or another owner
// published them) and are forgotten.
func (r *Relay) sweepLocked(ps *partState) {
	for id, e := range ps.queued {
		if e.seen >= ps.pass {
			continue
		}
		k := ps.keys[e.row.CorrelationID]
		k.queue = slices.DeleteFunc(k.queue, func(x *entry) bool { return x == e })
		delete(ps.queued, id)
		r.bytes -= e.size
		r.pushReadyLocked(k)
		if e.row.Parked {
			// An operator skipped or purged it: this pass left its
			// followers out, so read them in the next.
			ps.dirty = true
		}
	}
	for _, k := range ps.keys {
		r.forgetIfIdleLocked(k)
	}
}

// forgetIfIdleLocked drops k once nothing of it is queued, in flight or
// backing off: a key's memory lasts as long as its work, not its
// partition's pass. Its next row, read later, is judged by the database
// (the row below it is marked by then).
func (r *Relay) forgetIfIdleLocked(k *keyState) {
	if len(k.queue) > 0 || k.flights > 0 || k.writing > 0 || r.blocked[k] || r.leaseWait[k] || k.inReady {
		return
	}
	if ps := k.part; ps.keys[k.name] == k {
		delete(ps.keys, k.name)
	}
}

// headLocked returns k's next row if the per-key rule lets it go now:
// not parked or backing off, nothing of the key unsettled (fewer than
// perKeyLimit, which only a test raises), and the row below it confirmed
// by this relay in this epoch or already processed when the row was read
// (at perKeyLimit > 1, merely published: what tests use to show the rule
// matters). A head that backs off is
// remembered, and the retry timer wakes the relay for it.
func (r *Relay) headLocked(k *keyState, now time.Time) (*entry, bool) {
	if len(k.queue) == 0 || k.writing > 0 || k.inFlight >= r.perKeyLimit {
		return nil, false
	}
	e := k.queue[0]
	if e.row.Parked {
		return nil, false
	}
	if now.Before(e.row.NextAttemptAt) {
		r.blocked[k] = true
		return nil, false
	}
	prev := e.row.KeySeq - 1
	switch {
	case k.inFlight == 0 && (!e.row.PrevPending || prev <= k.confirmed):
	case r.perKeyLimit > 1 && (!e.row.PrevPending || prev <= k.published):
	default:
		return nil, false
	}
	return e, true
}

// earliestRetryLocked returns when the first backing-off key may go again
// (zero if none), and puts the keys whose time has come back in line
// (due: at least one).
func (r *Relay) earliestRetryLocked(now time.Time) (first time.Time, due bool) {
	for k := range r.blocked {
		if !r.currentLocked(k) || len(k.queue) == 0 {
			delete(r.blocked, k)
			continue
		}
		at := k.queue[0].row.NextAttemptAt
		if !now.Before(at) {
			delete(r.blocked, k)
			r.pushReadyLocked(k)
			due = true
			continue
		}
		if first.IsZero() || at.Before(first) {
			first = at
		}
	}
	return first, due
}

// eligibleLocked counts queued heads that nothing but a lease or a stall
// keeps from going: the measure of a silent stall.
func (r *Relay) eligibleLocked(now time.Time) int {
	if len(r.flights) >= r.cfg.Window {
		return 0 // the window is full: confirms will free it
	}
	n := 0
	for _, ps := range r.parts {
		for _, k := range ps.keys {
			if _, ok := r.headLocked(k, now); ok {
				n++
			}
		}
	}
	return n
}
