package relaytest

import (
	"context"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/ordo-relay/ordo/relay"
)

// RowState is what the Store suite checks of a stored row.
type RowState struct {
	Processed, Parked, Dead bool
	Attempts                int
	LastError               string
}

// StoreHarness is what the Store conformance suite needs of one
// implementation, on storage of its own (a fresh database, say).
type StoreHarness interface {
	// Store is the implementation under test, bound to node "n1".
	Store() relay.Store
	// Insert commits one pending row per key, in order, in partition, as
	// a producer's transaction would, and returns their ids.
	Insert(t testing.TB, partition int, keys ...string) []uuid.UUID
	// Grant makes node the holder of partition at a new epoch, as a claim
	// does, and returns the epoch.
	Grant(t testing.TB, node string, partition int) int64
	// Skip makes a pending row dead (processed and never published), as an
	// operator's skip does.
	Skip(t testing.TB, id uuid.UUID)
	// State returns a row's state.
	State(t testing.TB, id uuid.UUID) RowState
	// Retry makes a parked row pending again, with its attempts reset, as
	// an operator's retry does.
	Retry(t testing.TB, id uuid.UUID)
}

// StoreSuite runs the relay.Store contract against the implementation
// newHarness makes, one fresh harness per case. Every Store (the
// PostgreSQL one, the in-memory one) must pass it.
func StoreSuite(t *testing.T, newHarness func(t *testing.T) StoreHarness) {
	cases := []struct {
		name string
		run  func(t *testing.T, h StoreHarness)
	}{
		{"pending rows in seq order, with the row below's state", storePendingInSeqOrder},
		{"cursor and limit per partition", storeCursorAndLimit},
		{"mark releases the key", storeMarkReleasesKey},
		{"marks refused at a stale epoch", storeMarkRefusedAtStaleEpoch},
		{"failures back off and park", storeFailuresBackOffAndPark},
		{"a parked row is left out, and its key's rows above it", storeParkedLeftOut},
		{"a peek reads rows without payloads", storePeekWithoutPayload},
		{"failure records refused at a stale epoch", storeFailureRefusedAtStaleEpoch},
		{"prev key_seq steps over dead rows", storePrevKeySeqOverDead},
		{"retention deletes only held, processed, live rows", storeRetention},
		{"listen wakes the armed partitions", storeListen},
		{"a notification disarms its partition", storeNotifyDisarms},
		{"arm fails while not listening", storeArmNotListening},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.run(t, newHarness(t))
		})
	}
}

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func read(t *testing.T, h StoreHarness, limit int, cursors ...relay.Cursor) []relay.Row {
	t.Helper()
	rows, err := h.Store().ReadPending(ctxFor(t), cursors, limit)
	if err != nil {
		t.Fatalf("ReadPending: %v", err)
	}
	return rows
}

func from(p int) relay.Cursor { return relay.Cursor{Partition: p} }

func ids(rows []relay.Row) []uuid.UUID {
	out := make([]uuid.UUID, len(rows))
	for i, r := range rows {
		out[i] = r.ID
	}
	return out
}

func wantIDs(t *testing.T, what string, got, want []uuid.UUID) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Fatalf("%s: got %v, want %v", what, got, want)
	}
}

func settled(part int, epoch int64, id ...uuid.UUID) []relay.Settled {
	out := make([]relay.Settled, len(id))
	for i, x := range id {
		out[i] = relay.Settled{ID: x, Partition: part, Epoch: epoch, Err: "injected"}
	}
	return out
}

func storePendingInSeqOrder(t *testing.T, h StoreHarness) {
	id := h.Insert(t, 1, "a", "b", "a", "c", "b")
	rows := read(t, h, 100, from(1))
	wantIDs(t, "pending rows", ids(rows), id)
	for i, r := range rows {
		if i > 0 && r.Seq <= rows[i-1].Seq {
			t.Fatalf("row %d: seq %d after %d", i, r.Seq, rows[i-1].Seq)
		}
	}
	a1, a2 := rows[0], rows[2]
	if a1.CorrelationID != "a" || a1.KeySeq != 1 || a1.PrevKeySeq != 0 || a1.Partition != 1 || a1.PrevPending || a1.PrevDead || a1.Attempts != 0 || a1.Parked {
		t.Fatalf("first row: %+v", a1)
	}
	if a2.KeySeq != 2 || a2.PrevKeySeq != 1 || !a2.PrevPending || a2.PrevDead {
		t.Fatalf("a's second row: %+v (want key_seq 2 with the row below pending)", a2)
	}
}

func storeCursorAndLimit(t *testing.T, h StoreHarness) {
	one := h.Insert(t, 1, "a", "b", "c")
	two := h.Insert(t, 2, "d")
	rows := read(t, h, 2, from(1), from(2))
	got := map[int][]uuid.UUID{}
	for _, r := range rows {
		got[r.Partition] = append(got[r.Partition], r.ID)
	}
	wantIDs(t, "partition 1, limit 2", got[1], one[:2])
	wantIDs(t, "partition 2", got[2], two)
	after := rows[1].Seq
	if rows[1].Partition != 1 {
		after = rows[0].Seq
		for _, r := range rows {
			if r.Partition == 1 {
				after = r.Seq
			}
		}
	}
	wantIDs(t, "partition 1 after the cursor", ids(read(t, h, 10, relay.Cursor{Partition: 1, After: after})), one[2:])
	if rows := read(t, h, 10, from(3)); len(rows) != 0 {
		t.Fatalf("partition 3 is empty, read %d rows", len(rows))
	}
}

func storeMarkReleasesKey(t *testing.T, h StoreHarness) {
	e := h.Grant(t, "n1", 1)
	id := h.Insert(t, 1, "a", "a")
	marked, err := h.Store().MarkPublished(ctxFor(t), settled(1, e, id[0]))
	if err != nil {
		t.Fatal(err)
	}
	wantIDs(t, "marked", marked, id[:1])
	if !h.State(t, id[0]).Processed {
		t.Fatal("marked row not processed")
	}
	rows := read(t, h, 100, from(1))
	wantIDs(t, "pending after the mark", ids(rows), id[1:])
	if rows[0].PrevPending {
		t.Fatal("the row above a marked one still says the row below is pending")
	}
	again, err := h.Store().MarkPublished(ctxFor(t), settled(1, e, id[0]))
	if err != nil || len(again) != 0 {
		t.Fatalf("marking a processed row again: %v, %v", again, err)
	}
}

func storeMarkRefusedAtStaleEpoch(t *testing.T, h StoreHarness) {
	e1 := h.Grant(t, "n1", 1)
	id := h.Insert(t, 1, "a", "b")
	// The same node, a newer epoch: the epoch alone refuses (a paused
	// process of the same name, say).
	e2 := h.Grant(t, "n1", 1)
	marked, err := h.Store().MarkPublished(ctxFor(t), settled(1, e1, id[0]))
	if err != nil || len(marked) != 0 {
		t.Fatalf("mark at epoch %d after epoch %d was claimed: %v, %v", e1, e2, marked, err)
	}
	// Another node now: the owner refuses.
	h.Grant(t, "n2", 1)
	marked, err = h.Store().MarkPublished(ctxFor(t), settled(1, e2, id[1]))
	if err != nil || len(marked) != 0 {
		t.Fatalf("mark by a node that lost the lease: %v, %v", marked, err)
	}
	if h.State(t, id[0]).Processed || h.State(t, id[1]).Processed {
		t.Fatal("a refused mark processed a row")
	}
}

func storeFailuresBackOffAndPark(t *testing.T, h StoreHarness) {
	e := h.Grant(t, "n1", 1)
	id := h.Insert(t, 1, "a", "a", "b")
	s := settled(1, e, id[0])
	s[0].Delay = time.Hour
	parked, err := h.Store().RecordFailures(ctxFor(t), s, 2)
	if err != nil || len(parked) != 0 {
		t.Fatalf("first failure: parked %v, %v", parked, err)
	}
	if st := h.State(t, id[0]); st.Attempts != 1 || st.LastError != "injected" || st.Parked || st.Processed {
		t.Fatalf("after one failure: %+v", st)
	}
	rows := read(t, h, 100, from(1))
	wantIDs(t, "while a backs off", ids(rows), id)
	if wait := time.Until(rows[0].NextAttemptAt); wait < 50*time.Minute || rows[0].Attempts != 1 || rows[0].Parked {
		t.Fatalf("a backing off for an hour reads as %+v (next attempt in %v)", rows[0], wait)
	}
	s[0].Delay = 0
	parked, err = h.Store().RecordFailures(ctxFor(t), s, 2)
	if err != nil {
		t.Fatal(err)
	}
	wantIDs(t, "parked", parked, id[:1])
	if st := h.State(t, id[0]); st.Attempts != 2 || !st.Parked {
		t.Fatalf("after the second failure: %+v", st)
	}
	// The row behind it is left out (held when it parked), or read
	// marked BehindParked; b reads as before.
	rows = read(t, h, 100, from(1))
	if len(rows) == 2 && rows[0].ID == id[1] && rows[0].BehindParked {
		rows = rows[1:]
	}
	if len(rows) != 1 || rows[0].ID != id[2] || rows[0].BehindParked {
		t.Fatalf("with a parked: read %+v; want b's row, and a's second only marked BehindParked", rows)
	}
}

// storeParkedLeftOut: a parked row is not read, and the rows of its key
// above it come, if at all, marked BehindParked and without payload and
// headers, which a read must not fetch again and again while nothing
// publishes them (one huge parked row once slowed every read of its
// node past the read timeout); an operator's retry brings them back, and
// a skip lets the row above go. Another key's rows read as before.
func storeParkedLeftOut(t *testing.T, h StoreHarness) {
	e := h.Grant(t, "n1", 1)
	id := h.Insert(t, 1, "a", "b", "a", "a")
	read(t, h, 100, from(1)) // as a relay does before it publishes (and an owner numbers rows)
	if _, err := h.Store().RecordFailures(ctxFor(t), settled(1, e, id[0]), 1); err != nil {
		t.Fatal(err)
	}
	for pass := range 2 {
		for _, r := range read(t, h, 100, from(1)) {
			switch {
			case r.ID == id[0]:
				t.Fatalf("pass %d: the parked row is read: %+v", pass, r)
			case r.ID == id[1] && (r.BehindParked || len(r.Payload) == 0 || len(r.Headers) == 0):
				t.Fatalf("pass %d: another key's row reads with behind=%v, payload %q, headers %q", pass, r.BehindParked, r.Payload, r.Headers)
			case r.ID != id[1] && (!r.BehindParked || r.Payload != nil || r.Headers != nil || !r.PrevPending):
				t.Fatalf("pass %d: a row behind the parked one reads with behind=%v, prev pending %v, payload %q, headers %q",
					pass, r.BehindParked, r.PrevPending, r.Payload, r.Headers)
			}
		}
	}
	h.Retry(t, id[0])
	rows := read(t, h, 100, from(1))
	wantIDs(t, "after the retry", ids(rows), id)
	for i, r := range rows {
		if r.BehindParked || r.Parked || len(r.Payload) == 0 || len(r.Headers) == 0 || r.PrevPending != (i >= 2) {
			t.Fatalf("after the retry, row %d reads with behind=%v, parked=%v, prev pending %v, payload %q, headers %q",
				i, r.BehindParked, r.Parked, r.PrevPending, r.Payload, r.Headers)
		}
	}
	if _, err := h.Store().RecordFailures(ctxFor(t), settled(1, e, id[0]), 1); err != nil {
		t.Fatal(err)
	}
	read(t, h, 100, from(1))
	h.Skip(t, id[0])
	rows = read(t, h, 100, from(1))
	wantIDs(t, "after the skip", ids(rows), id[1:])
	if a := rows[1]; a.BehindParked || a.PrevPending || !a.PrevDead || len(a.Payload) == 0 {
		t.Fatalf("the row above a skipped one reads with behind=%v, prev pending %v, prev dead %v, payload %q",
			a.BehindParked, a.PrevPending, a.PrevDead, a.Payload)
	}
}

// storePeekWithoutPayload: PeekPending reads one partition's pending
// rows above the cursor, as ReadPending does but with no payload or
// headers (the relay peeks at a row too slow to read).
func storePeekWithoutPayload(t *testing.T, h StoreHarness) {
	e := h.Grant(t, "n1", 1)
	id := h.Insert(t, 1, "a", "b", "a")
	h.Insert(t, 2, "c")
	s := settled(1, e, id[0])
	s[0].Delay = time.Hour
	if _, err := h.Store().RecordFailures(ctxFor(t), s, 5); err != nil {
		t.Fatal(err)
	}
	full := read(t, h, 100, from(1))
	peek, err := h.Store().PeekPending(ctxFor(t), from(1), 2)
	if err != nil {
		t.Fatalf("PeekPending: %v", err)
	}
	wantIDs(t, "peek of two", ids(peek), id[:2])
	for i, p := range peek {
		if p.Payload != nil || p.Headers != nil {
			t.Fatalf("peeked row %d has payload %q, headers %q", i, p.Payload, p.Headers)
		}
		f := full[i]
		f.Payload, f.Headers, f.NextAttemptAt, p.NextAttemptAt = nil, nil, time.Time{}, time.Time{}
		if !reflect.DeepEqual(p, f) {
			t.Fatalf("peeked row %d reads as %+v, ReadPending's as %+v", i, p, f)
		}
	}
	if wait := time.Until(peek[0].NextAttemptAt); peek[0].Attempts != 1 || wait < 50*time.Minute {
		t.Fatalf("a backing off for an hour peeks as attempts %d, next attempt in %v", peek[0].Attempts, wait)
	}
	peek, err = h.Store().PeekPending(ctxFor(t), relay.Cursor{Partition: 1, After: full[0].Seq}, 100)
	if err != nil {
		t.Fatal(err)
	}
	wantIDs(t, "peek above the cursor", ids(peek), id[1:])
}

func storeFailureRefusedAtStaleEpoch(t *testing.T, h StoreHarness) {
	e := h.Grant(t, "n1", 1)
	id := h.Insert(t, 1, "a")
	h.Grant(t, "n1", 1)
	if _, err := h.Store().RecordFailures(ctxFor(t), settled(1, e, id...), 1); err != nil {
		t.Fatal(err)
	}
	if st := h.State(t, id[0]); st.Attempts != 0 || st.Parked {
		t.Fatalf("a failure recorded at a stale epoch: %+v", st)
	}
}

func storePrevKeySeqOverDead(t *testing.T, h StoreHarness) {
	e := h.Grant(t, "n1", 1)
	id := h.Insert(t, 1, "a", "a", "a", "a")
	read(t, h, 100, from(1)) // as a relay does before it publishes (and an owner numbers rows)
	if _, err := h.Store().MarkPublished(ctxFor(t), settled(1, e, id[0])); err != nil {
		t.Fatal(err)
	}
	h.Skip(t, id[1])
	h.Skip(t, id[2])
	rows := read(t, h, 100, from(1))
	wantIDs(t, "pending after dead rows", ids(rows), id[3:])
	if !rows[0].PrevDead || rows[0].PrevPending {
		t.Fatalf("row above a dead one: %+v (want PrevDead, not PrevPending)", rows[0])
	}
	prev, err := h.Store().PrevKeySeq(ctxFor(t), "a", 4)
	if err != nil || prev != 1 {
		t.Fatalf("PrevKeySeq(a, 4) = %d, %v; want 1", prev, err)
	}
	if prev, err := h.Store().PrevKeySeq(ctxFor(t), "a", 1); err != nil || prev != 0 {
		t.Fatalf("PrevKeySeq(a, 1) = %d, %v; want 0", prev, err)
	}
}

func storeRetention(t *testing.T, h StoreHarness) {
	e := h.Grant(t, "n1", 1)
	id := h.Insert(t, 1, "a", "b", "c")
	if _, err := h.Store().MarkPublished(ctxFor(t), settled(1, e, id[0], id[1])); err != nil {
		t.Fatal(err)
	}
	h.Skip(t, id[2])
	time.Sleep(20 * time.Millisecond) // processed "more than 10ms ago" by the store's clock
	if n, err := h.Store().DeleteProcessed(ctxFor(t), 1, e+1, 10*time.Millisecond, 10); err != nil || n != 0 {
		t.Fatalf("retention at a stale epoch deleted %d (%v)", n, err)
	}
	if n, err := h.Store().DeleteProcessed(ctxFor(t), 1, e, time.Hour, 10); err != nil || n != 0 {
		t.Fatalf("retention of rows younger than its age deleted %d (%v)", n, err)
	}
	n, err := h.Store().DeleteProcessed(ctxFor(t), 1, e, 10*time.Millisecond, 1)
	if err != nil || n != 1 {
		t.Fatalf("retention with limit 1 deleted %d (%v)", n, err)
	}
	n, err = h.Store().DeleteProcessed(ctxFor(t), 1, e, 10*time.Millisecond, 10)
	if err != nil || n != 1 {
		t.Fatalf("second retention pass deleted %d (%v), want the other processed row", n, err)
	}
	if !h.State(t, id[2]).Dead {
		t.Fatal("retention deleted a dead row")
	}
}

// listen runs h's Store's Listen until the returned stop, which checks
// its error; each wake-up goes to woke (size buffered). With strict, a
// wake-up that finds woke full fails the test; else it is dropped.
func listen(t *testing.T, h StoreHarness, size int, strict bool) (woke chan int, stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	woke = make(chan int, size)
	done := make(chan error, 1)
	go func() {
		done <- h.Store().Listen(ctx, func(p int) {
			select {
			case woke <- p:
			default:
				if strict {
					t.Errorf("more than %d notifications unread", size)
				}
			}
		})
	}()
	return woke, func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Listen: %v", err)
		}
	}
}

// storeArmNotListening: Arm fails while no Listen is connected (the relay
// then arms once Listen connects: its wake(-1) asks again).
func storeArmNotListening(t *testing.T, h StoreHarness) {
	if got, err := h.Store().Arm(ctxFor(t), []int{1, 2}); err == nil {
		t.Fatalf("Arm without Listen = %v, nil; want an error", got)
	}
}

func storeListen(t *testing.T, h StoreHarness) {
	woke, stop := listen(t, h, 16, false)
	defer stop()
	// wait returns once partition want is notified, failing on any
	// partition in not (not armed: its commits must not notify).
	wait := func(want int, not ...int) {
		t.Helper()
		deadline := time.After(30 * time.Second)
		for {
			select {
			case p := <-woke:
				if p == want {
					return
				}
				if slices.Contains(not, p) {
					t.Fatalf("partition %d was notified, but it was not armed", p)
				}
			case <-deadline:
				t.Fatalf("no wake-up for partition %d", want)
			}
		}
	}
	arm := func(arm bool, parts ...int) {
		t.Helper()
		if !arm {
			if err := h.Store().Disarm(ctxFor(t), parts); err != nil {
				t.Fatalf("Disarm: %v", err)
			}
			return
		}
		got, err := h.Store().Arm(ctxFor(t), parts)
		if err != nil || !slices.Equal(got, parts) {
			t.Fatalf("Arm(%v) = %v, %v; want all armed", parts, got, err)
		}
	}
	wait(-1) // once listening: notifications sent before are gone, nothing is armed
	// Notifications come in commit order, so a commit to an unarmed
	// partition before one to an armed partition would be seen first.
	h.Insert(t, 6, "b")
	arm(true, 5)
	arm(true, 5) // armed already: still armed
	h.Insert(t, 5, "a")
	wait(5, 6)
	arm(false, 5)
	h.Insert(t, 5, "c")
	arm(true, 7)
	h.Insert(t, 7, "d")
	wait(7, 5, 6)
}
