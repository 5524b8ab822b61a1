package relay

import "sync"

// Budget is a node's confirm window W and read-ahead budget shared by
// several relays: one per source, all over the node's one publisher
// (docs/design.md, "Sharing W and the read-ahead budget"). The node
// creates it and gives it to each relay's Config.
//
// The sharing is work-conserving and fair. With k relays, a relay's fair
// share is ⌈W/k⌉ flights (and ⌈bytes/k⌉ of read-ahead). A relay may take
// a slot while the relays' total is under W; beyond its fair share only
// while no other relay is waiting: one that stopped dispatching with rows
// left to publish (the budget refused it a slot, or its own Window is
// full), and has not run out of them since. So a busy
// source alone uses all of W, two busy sources get at least their fair
// share each, and the node never has more than W in flight. Read-ahead
// bytes follow the same rule, a relay waiting for bytes being one whose
// read the budget refused; like ReadAheadBytes the byte bound is checked
// before a read, which may pass it by a page.
//
// A Budget is safe for concurrent use. Its lock is taken under a relay's
// and never takes one: it only signals a waiting relay's wake-up channel.
type Budget struct {
	window int
	bytes  int64

	mu      sync.Mutex
	members []*share
	flights int   // the members' live flights
	used    int64 // the members' bytes read ahead or in flight
}

// NewBudget returns a budget of window flights and bytes of read-ahead, to
// be shared by the relays whose Config names it. Both are at least 1.
func NewBudget(window int, bytes int64) *Budget {
	return &Budget{window: max(window, 1), bytes: max(bytes, 1)}
}

// BudgetStats is a snapshot of a Budget: its window and bytes, what its
// relays use of them, and how many relays wait for a slot or for bytes.
type BudgetStats struct {
	Window, InFlight, Relays  int
	Bytes, BytesUsed          int64
	WaitingSlot, WaitingBytes int
}

// Stats returns a snapshot of b.
func (b *Budget) Stats() BudgetStats {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := BudgetStats{Window: b.window, InFlight: b.flights, Relays: len(b.members), Bytes: b.bytes, BytesUsed: b.used}
	for _, m := range b.members {
		if m.wantsSlot {
			s.WaitingSlot++
		}
		if m.wantsBytes {
			s.WaitingBytes++
		}
	}
	return s
}

// share is one relay's part of a Budget. Its fields are guarded by the
// Budget's mu.
type share struct {
	b          *Budget
	wakeSlots  chan struct{} // the relay's wake.dispatch: a slot freed up
	wakeBytes  chan struct{} // the relay's wake.read: bytes freed up
	flights    int
	bytes      int64
	wantsSlot  bool // rows wait to be published (refused a slot, or its own window full), until it runs dry
	wantsBytes bool // a read was refused, and none was allowed since
}

// join adds a relay, woken through wakeSlots when a slot it waits for
// frees up (its dispatch loop publishes) and through wakeBytes when bytes
// do (its read loop reads).
func (b *Budget) join(wakeSlots, wakeBytes chan struct{}) *share {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := &share{b: b, wakeSlots: wakeSlots, wakeBytes: wakeBytes}
	b.members = append(b.members, s)
	return s
}

// fair is ⌈total/k⌉ for the k relays of the budget.
func fair[T int | int64](total T, k int) T {
	return (total + T(k) - 1) / T(k)
}

// othersWant reports whether a member other than s waits for a slot
// (bytes false) or for bytes (bytes true).
func (b *Budget) othersWant(s *share, bytes bool) bool {
	for _, m := range b.members {
		if m != s && (bytes && m.wantsBytes || !bytes && m.wantsSlot) {
			return true
		}
	}
	return false
}

// slotFree reports whether s may take a slot now.
func (s *share) slotFree() bool {
	b := s.b
	return b.flights < b.window && (s.flights < fair(b.window, len(b.members)) || !b.othersWant(s, false))
}

// takeSlot takes a slot of the window for a flight, or reports false and
// marks s as waiting for one.
func (s *share) takeSlot() bool {
	s.b.mu.Lock()
	defer s.b.mu.Unlock()
	if !s.slotFree() {
		s.wantsSlot = true
		return false
	}
	s.flights++
	s.b.flights++
	return true
}

// releaseSlot gives back the slot of an ended flight, and wakes the
// relays waiting for one.
func (s *share) releaseSlot() {
	b := s.b
	b.mu.Lock()
	defer b.mu.Unlock()
	s.flights--
	b.flights--
	for _, m := range b.members {
		if m != s && m.wantsSlot {
			signal(m.wakeSlots)
		}
	}
}

// windowFull reports whether s would be refused a slot now, without
// marking it as waiting.
func (s *share) windowFull() bool {
	s.b.mu.Lock()
	defer s.b.mu.Unlock()
	return !s.slotFree()
}

// wantSlots records whether s's relay has rows to publish that it could
// not (on) or has run dry (off). While it wants slots, the other relays
// may not take more than their fair share.
func (s *share) wantSlots(on bool) {
	s.b.mu.Lock()
	defer s.b.mu.Unlock()
	s.wantsSlot = on
}

// bytesFree reports whether s may read now.
func (s *share) bytesFree() bool {
	b := s.b
	return b.used < b.bytes && (s.bytes < fair(b.bytes, len(b.members)) || !b.othersWant(s, true))
}

// mayRead reports whether s may read now; when not, s waits for bytes.
func (s *share) mayRead() bool {
	s.b.mu.Lock()
	defer s.b.mu.Unlock()
	ok := s.bytesFree()
	s.wantsBytes = !ok
	return ok
}

// memoryFull reports whether s would be refused a read now, without
// marking it as waiting.
func (s *share) memoryFull() bool {
	s.b.mu.Lock()
	defer s.b.mu.Unlock()
	return !s.bytesFree()
}

// addBytes counts d more bytes (fewer when negative) for s, and wakes the
// relays waiting for bytes when some are freed.
func (s *share) addBytes(d int64) {
	b := s.b
	b.mu.Lock()
	defer b.mu.Unlock()
	s.bytes += d
	b.used += d
	if d >= 0 || b.used >= b.bytes {
		return
	}
	for _, m := range b.members {
		if m != s && m.wantsBytes {
			signal(m.wakeBytes)
		}
	}
}

// counts returns the flights and bytes s counts for its relay.
func (s *share) counts() (flights int, bytes int64) {
	s.b.mu.Lock()
	defer s.b.mu.Unlock()
	return s.flights, s.bytes
}

// leave is s's relay stopping: it waits for nothing any more.
func (s *share) leave() {
	s.b.mu.Lock()
	defer s.b.mu.Unlock()
	s.wantsSlot, s.wantsBytes = false, false
}
