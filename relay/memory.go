package relay

// memory is the relay's count of the bytes it holds: rows read ahead and
// flights, bounded by Config.ReadAheadBytes and, with a Budget, by the
// relay's share of it. It is the one owner of that count, of the Budget's
// count of the relay's bytes (share.addBytes) and of the half-free mark:
// add is the one method that changes the counts, so the relay's and the
// Budget's never differ, and no other code writes its fields. Guarded by
// Relay.mu.
//
// Each entry and flight carries the bytes it was charged (entry.size,
// flight.size); what is taken in with a size is given back with the same
// size, and a size changes only through resize. A parked row is charged
// nothing (rowSize): it waits for an operator, and memory is for rows
// that may go (docs/operations.md, "Parked messages").
type memory struct {
	limit         int64  // Config.ReadAheadBytes
	share         *share // the relay's part of its Budget; nil without one
	bytes         int64  // held now
	halfFreeBelow int64  // a read left rows out for memory: read again at or below these bytes (half of what it held then); 0: not waiting
}

func newMemory(limit int64, s *share) memory {
	return memory{limit: limit, share: s}
}

// add counts d more bytes held (fewer when negative), in the relay's count
// and its Budget's, and lifts the half-free mark once memory is down to it.
func (m *memory) add(d int64) {
	if d == 0 {
		return
	}
	m.bytes += d
	if m.share != nil {
		m.share.addBytes(d)
	}
	if m.halfFreeBelow > 0 && m.bytes <= m.halfFreeBelow {
		m.halfFreeBelow = 0
	}
}

// resize charges *size the bytes to instead of what it was charged.
func (m *memory) resize(size *int64, to int64) {
	m.add(to - *size)
	*size = to
}

// leftOut records that a read left a row out because memory was full: the
// next read waits until half of what memory holds now is free (add lifts
// the mark, so that memory above a mark is always waiting for it).
func (m *memory) leftOut() {
	m.halfFreeBelow = m.bytes / 2 // 0, not waiting, when next to nothing is held
}

// full reports whether the read-ahead is full: the relay's own
// ReadAheadBytes, or its Budget's for it.
func (m *memory) full() bool {
	return m.bytes >= m.limit || m.share != nil && m.share.memoryFull()
}

// refused reports whether a read must wait for memory: it is full, or a
// read left rows out and half of what it held then is not free yet. With
// a Budget it asks for bytes every time, so that a relay refused them is
// known to be waiting for them (budget.go).
//
// Half of what it held, not half of ReadAheadBytes: with a Budget a relay
// may be full at its share, and a relay holding half of the Budget is
// always under half of its own ReadAheadBytes
// (TestBudgetReadAheadFullReadsEachRowAboutOnce).
func (m *memory) refused() bool {
	full := m.bytes >= m.limit || m.halfFreeBelow > 0
	if m.share != nil {
		full = !m.share.mayRead() || full
	}
	return full
}

// held is the bytes held now.
func (m *memory) held() int64 { return m.bytes }
