package relay

import (
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
)

// TestIngestKeepsKeysContiguous: a key whose rows were left out for
// memory keeps no row above the first left out, even once memory has
// room again (a tail read above it, say), until that row is read and
// kept: memory holds each key's rows from its head without a gap.
func TestIngestKeepsKeysContiguous(t *testing.T) {
	rows := keyRows(30)
	size := rowSize(&rows[0])
	r, err := New(Config{Node: "t", ReadAheadBytes: 10 * size}, nil, nil, allLeases{})
	if err != nil {
		t.Fatal(err)
	}
	r.apply(Assigned{Lease: Lease{Partition: 0, Epoch: 1, Deadline: time.Now().Add(time.Hour)}})
	r.mu.Lock()
	defer r.mu.Unlock()
	ps := r.parts[0]
	k := ps.key("k")
	keySeqs := func() (first, last int64, n int) {
		return k.rows[0].row.KeySeq, k.rows[len(k.rows)-1].row.KeySeq, len(k.rows)
	}
	if left := r.ingestLocked(ps, rows[:20]); left == 0 {
		t.Fatal("a read of twice the read-ahead left nothing out")
	}
	first, last, n := keySeqs()
	t.Logf("first read: key_seq %d..%d kept (%d rows)", first, last, n)
	leftFrom := last + 1
	// Half of them go (published and marked): memory has room again.
	for _, e := range k.rows[:5] {
		delete(ps.queued, e.row.ID)
		r.mem.add(-e.size)
	}
	k.rows = k.rows[5:]
	r.ingestLocked(ps, rows[20:]) // a tail read above the rows left out
	first, last, n = keySeqs()
	if int(last-first+1) != n {
		t.Fatalf("memory holds key_seq %d..%d in %d rows: a gap", first, last, n)
	}
	if last >= leftFrom {
		t.Fatalf("key_seq %d kept above the rows left out from %d", last, leftFrom)
	}
	// Every row kept goes: the key, idle, is not forgotten while it has a
	// gap (a new key state would take the next row read, above the gap).
	for _, e := range k.rows {
		delete(ps.queued, e.row.ID)
		r.mem.add(-e.size)
	}
	k.rows = nil
	for r.queues.pop() != nil { // as the dispatch loop leaves it
	}
	r.forgetIfIdleLocked(k)
	r.ingestLocked(ps, rows[25:])
	if k2 := ps.keys["k"]; k2 != nil && len(k2.rows) > 0 {
		t.Fatalf("key_seq %d kept above the gap: the idle key was forgotten with it", k2.rows[0].row.KeySeq)
	}
	// The rows left out, read again, are kept while there is room.
	r.ingestLocked(ps, rows[leftFrom-1:20])
	if first, last, _ := keySeqs(); first != leftFrom || last < leftFrom+5 {
		t.Fatalf("the rows left out, read again with room, kept as key_seq %d..%d", first, last)
	}
}

// TestHalfFreeWaitUnderABudget: after a read left rows out for memory, the
// next read waits until half of what memory held then is free, also when
// memory was full at the relay's share of a Budget, far under its own
// ReadAheadBytes. The wait once ended at half of ReadAheadBytes, which a
// relay holding half of the Budget is always under, so it read again
// after every row freed (TestBudgetReadAheadFullReadsEachRowAboutOnce).
func TestHalfFreeWaitUnderABudget(t *testing.T) {
	rows := keyRows(40)
	size := rowSize(&rows[0])
	budget := NewBudget(8, 20*size)
	r, err := New(Config{Node: "t", ReadAheadBytes: 20 * size, Budget: budget}, nil, nil, allLeases{})
	if err != nil {
		t.Fatal(err)
	}
	other := budget.join(make(chan struct{}, 1), make(chan struct{}, 1))
	other.addBytes(10 * size) // the other relay holds its half
	r.apply(Assigned{Lease: Lease{Partition: 0, Epoch: 1, Deadline: time.Now().Add(time.Hour)}})
	r.mu.Lock()
	defer r.mu.Unlock()
	ps := r.parts[0]
	k := ps.key("k")
	if !other.mayRead() {
		t.Fatal("the other relay, at its share, may not read: the test's setup is off")
	}
	if left := r.ingestLocked(ps, rows); left == 0 {
		t.Fatal("a read past the relay's share left nothing out")
	}
	held := len(k.rows)
	r.queues.push(k) // rows to publish: a full read-ahead refuses reads
	t.Logf("kept %d rows (%d bytes, ReadAheadBytes %d)", held, r.mem.held(), r.cfg.ReadAheadBytes)
	free := func(n int) {
		for _, e := range k.rows[:n] {
			delete(ps.queued, e.row.ID)
			r.mem.add(-e.size)
		}
		k.rows = k.rows[n:]
	}
	free(held/2 - 1)
	if !r.readRefusedLocked() {
		t.Fatalf("read again with %d of %d rows still held: a read per freed row", len(k.rows), held)
	}
	free(len(k.rows) - held/2)
	if r.readRefusedLocked() {
		t.Fatalf("no read with %d of %d rows held: half of what memory held is free", len(k.rows), held)
	}
}

// keyRows returns n rows of key "k" in partition 0, key_seq and seq 1..n,
// each with a 300-byte payload.
func keyRows(n int) []Row {
	rows := make([]Row, n)
	for i := range rows {
		rows[i] = Row{ID: uuid.New(), Partition: 0, Seq: int64(i + 1), CorrelationID: "k", KeySeq: int64(i + 1),
			Exchange: "x", RoutingKey: "r", Type: "t", Payload: make([]byte, 300)}
	}
	return rows
}

// TestByPartitionGroupsWithoutClobbering: a read's rows grouped by
// partition keep their order within each partition, whether a
// partition's rows come together (a piece of the read) or apart (copied:
// appending to the first piece must not overwrite the rows after it).
func TestByPartitionGroupsWithoutClobbering(t *testing.T) {
	var rows []Row
	for i, p := range []int{3, 3, 5, 5, 5, 3, 7, 5} {
		rows = append(rows, Row{Partition: p, Seq: int64(i + 1)})
	}
	got := byPartition(rows, 3)
	want := map[int][]int64{3: {1, 2, 6}, 5: {3, 4, 5, 8}, 7: {7}}
	if len(got) != len(want) {
		t.Fatalf("%d partitions, want %d: %v", len(got), len(want), got)
	}
	for p, seqs := range want {
		var have []int64
		for _, r := range got[p] {
			have = append(have, r.Seq)
		}
		if !slices.Equal(have, seqs) {
			t.Errorf("partition %d: seqs %v, want %v", p, have, seqs)
		}
	}
	for i, r := range rows {
		if r.Seq != int64(i+1) {
			t.Fatalf("the read's row %d became seq %d: grouping overwrote it", i, r.Seq)
		}
	}
	if &got[7][0] != &rows[6] {
		t.Error("a partition whose rows came together was copied, not kept as a piece of the read")
	}
}
