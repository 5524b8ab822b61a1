package relay

import "github.com/google/uuid"

// readGen is the read generation: it tells whether what a read returned
// is newer than what the relay holds in memory. A read sees the database
// as of its start; a mark or a failure record written after that start is
// newer than the row the read returns, and memory has it already. So a
// read begins a generation (begin), the write-back tells it what it wrote
// (marked, failuresRecorded), and ingesting asks it (wasMarked,
// prevMarked, rowNewer). Guarded by Relay.mu.
type readGen struct {
	marked     map[uuid.UUID]bool // rows marked since the current read began
	markedKeys map[string]int64   // highest key_seq marked per key since the current read began
	recorded   uint64             // failure-record batches written so far
	readFrom   uint64             // recorded when the current read began
}

func newReadGen() readGen {
	return readGen{marked: map[uuid.UUID]bool{}, markedKeys: map[string]int64{}}
}

// begin starts the generation of a read about to be sent.
func (g *readGen) begin() {
	clear(g.marked)
	clear(g.markedKeys)
	g.readFrom = g.recorded
}

// mark records that row id, key_seq keySeq of key, was marked.
func (g *readGen) mark(id uuid.UUID, key string, keySeq int64) {
	g.marked[id] = true
	g.markedKeys[key] = max(g.markedKeys[key], keySeq)
}

// failuresRecorded counts one batch of failure records written and
// returns its generation, for the keys of the batch (keyState.failGen).
func (g *readGen) failuresRecorded() uint64 {
	g.recorded++
	return g.recorded
}

// wasMarked reports whether row id was marked after the read began: the
// read saw it pending, and it is not.
func (g *readGen) wasMarked(id uuid.UUID) bool { return g.marked[id] }

// prevMarked reports whether the row below row in its key was marked
// after the read began: row.PrevPending is stale then.
func (g *readGen) prevMarked(row *Row) bool {
	return g.markedKeys[row.CorrelationID] >= row.KeySeq-1
}

// rowNewer reports whether the read's copy of one of k's queued rows is
// newer than memory's: no failure of k is waiting to be recorded, and the
// last one recorded was written before the read began.
func (g *readGen) rowNewer(k *keyState) bool {
	return k.flights[flightFailed] == 0 && k.failGen <= g.readFrom
}
