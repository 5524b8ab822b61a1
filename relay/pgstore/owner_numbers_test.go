package pgstore_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/relay"
	"github.com/ordo-relay/ordo/relay/pgstore"
)

// What the partition owner's numbering keeps, whoever writes the numbers
// and whenever: a message id has one key_seq from its first read to its
// mark, a key's numbers have no gap and no repeat, and a row the relay
// parks takes its key's later rows out of the read.

// epochOf returns the epoch at which the partition is held now.
func epochOf(t *testing.T, h *pgHarness, p int) int64 {
	t.Helper()
	var epoch int64
	if err := h.pool.QueryRow(testkit.Context(t, 10*time.Second), `SELECT epoch FROM ordo_leases WHERE partition = $1`, p).Scan(&epoch); err != nil {
		t.Fatal(err)
	}
	return epoch
}

// TestNumbersGapFreeUnderConcurrentProducers: producers write a few keys
// of one partition in small transactions while read-heads of the
// owner read, number and mark the partition at once (three here), as the relay's
// passes overlap. Every id is read with one key_seq whatever read returns
// it, and each key ends numbered 1..n, each number once.
func TestNumbersGapFreeUnderConcurrentProducers(t *testing.T) {
	testkit.RequirePostgres(t)
	h := newHarness(t, false)
	const producers, readers, txs, keys = 4, 3, 100, 4
	epoch := epochOf(t, h, 1)
	ctx := testkit.Context(t, time.Minute)

	var wg sync.WaitGroup
	errs := make(chan error, producers+readers)
	done := make(chan struct{})
	var producing sync.WaitGroup
	for w := range producers {
		producing.Add(1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer producing.Done()
			for i := range txs {
				tx, err := h.pool.Begin(ctx)
				if err != nil {
					errs <- err
					return
				}
				for j := range 1 + (w+i)%3 {
					key := fmt.Sprintf("k%d", (w+i+j)%keys)
					if _, err := tx.Exec(ctx, `INSERT INTO outbox (id, partition, correlation_id, exchange, routing_key, type, payload)
						VALUES ($1, 1, $2, 'ex', 'rk', 't', '{}')`, uuid.Must(uuid.NewV7()), key); err != nil {
						_ = tx.Rollback(ctx)
						errs <- err
						return
					}
				}
				if err := tx.Commit(ctx); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	go func() { producing.Wait(); close(done) }()

	var mu sync.Mutex
	seen := map[uuid.UUID]int64{} // id -> key_seq, as first read
	for range readers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				finished := false
				select {
				case <-done:
					finished = true // one more pass sees every committed row
				default:
				}
				rows, err := h.store.ReadPending(ctx, []relay.Cursor{from(1)}, 20)
				if err != nil {
					errs <- fmt.Errorf("read: %w", err)
					return
				}
				var settled []relay.Settled
				mu.Lock()
				for _, r := range rows {
					if r.KeySeq < 1 {
						mu.Unlock()
						errs <- fmt.Errorf("row %s read without a number: %+v", r.ID, r)
						return
					}
					if ks, ok := seen[r.ID]; ok && ks != r.KeySeq {
						mu.Unlock()
						errs <- fmt.Errorf("row %s read as %s key_seq %d, earlier %d", r.ID, r.CorrelationID, r.KeySeq, ks)
						return
					}
					seen[r.ID] = r.KeySeq
					settled = append(settled, relay.Settled{ID: r.ID, Partition: 1, Epoch: epoch})
				}
				mu.Unlock()
				if len(settled) > 0 {
					if _, err := h.store.MarkPublished(ctx, settled); err != nil {
						errs <- fmt.Errorf("mark: %w", err)
						return
					}
				}
				if finished && len(rows) == 0 {
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}

	// A marked row's number is in the owner's journal, or in the row
	// where an owner write other than the mark put it.
	rows, err := h.pool.Query(ctx, `SELECT o.id, o.correlation_id, coalesce(o.key_seq, n.key_seq), o.processed_at IS NOT NULL
		FROM outbox AS o LEFT JOIN outbox_numbers AS n ON n.id = o.id WHERE o.partition = 1`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	perKey := map[string][]int64{}
	total := 0
	for rows.Next() {
		var id uuid.UUID
		var key string
		var ks *int64
		var processed bool
		if err := rows.Scan(&id, &key, &ks, &processed); err != nil {
			t.Fatal(err)
		}
		total++
		if ks == nil || !processed {
			t.Fatalf("row %s of %s left key_seq %v, processed %v", id, key, ks, processed)
		}
		if seen[id] != *ks {
			t.Fatalf("row %s of %s marked with key_seq %d, read as %d", id, key, *ks, seen[id])
		}
		perKey[key] = append(perKey[key], *ks)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if total != len(seen) {
		t.Fatalf("%d rows in the outbox, %d read", total, len(seen))
	}
	for key, seqs := range perKey {
		slices.Sort(seqs)
		for i, ks := range seqs {
			if ks != int64(i+1) {
				t.Fatalf("key %s numbered %v: want 1..%d", key, seqs, len(seqs))
			}
		}
	}
	t.Logf("%d rows over %d keys, each key numbered 1..n", total, len(perKey))
}

// TestParkingANumberedRowHoldsItsKey: a row numbered by a read and not
// yet marked is parked by the relay (RecordFailures at the attempt cap)
// with its number, and in the same statement its key's later rows are
// held behind it: the next read returns none of them, the other key's
// row still goes.
func TestParkingANumberedRowHoldsItsKey(t *testing.T) {
	testkit.RequirePostgres(t)
	h := newHarness(t, false)
	ids := h.Insert(t, 1, "a", "a", "b", "a")
	ctx := testkit.Context(t, 30*time.Second)
	rows := readAll(t, h.store, from(1))
	if got := byID(rows); len(rows) != 4 || got[ids[0]].KeySeq != 1 || got[ids[3]].KeySeq != 3 {
		t.Fatalf("read %+v; want a numbered 1, 2, 3 and b 1", rows)
	}
	parked, err := h.store.RecordFailures(ctx, []relay.Settled{{ID: ids[0], Partition: 1, Epoch: epochOf(t, h, 1), Err: "broker said no"}}, 1)
	if err != nil || len(parked) != 1 || parked[0] != ids[0] {
		t.Fatalf("RecordFailures parked %v (%v); want a's first row", parked, err)
	}
	var ks *int64
	if err := h.pool.QueryRow(ctx, `SELECT key_seq FROM outbox WHERE id = $1 AND parked_at IS NOT NULL`, ids[0]).Scan(&ks); err != nil || ks == nil || *ks != 1 {
		t.Fatalf("the parked row's key_seq: %v (%v); want 1", ks, err)
	}
	if held := parkedCount(t, h, `held_behind = 1 AND correlation_id = 'a'`); held != 2 {
		t.Fatalf("%d of a's later rows held behind the parked one, want 2", held)
	}
	rows = readAll(t, h.store, from(1))
	if len(rows) != 1 || rows[0].ID != ids[2] || rows[0].BehindParked {
		t.Fatalf("after the park the read returned %+v; want b's row alone", rows)
	}
}

// TestHandOffMidBatchKeepsNumbers: n1 reads a key's four rows and marks
// two of them, then loses the partition. Its mark of the third, at the
// old epoch, is refused; n2 reads the two left with the numbers n1 read
// (a republish carries the same key_seq and prev), and numbers a row
// committed after the hand-off above them. n1, no longer the owner,
// numbers nothing.
func TestHandOffMidBatchKeepsNumbers(t *testing.T) {
	testkit.RequirePostgres(t)
	h := newHarness(t, false)
	ctx := testkit.Context(t, 30*time.Second)
	ids := h.Insert(t, 1, "a", "a", "a", "a")
	e1 := epochOf(t, h, 1)
	first := byID(readAll(t, h.store, from(1)))
	for i, id := range ids {
		if first[id].KeySeq != int64(i+1) {
			t.Fatalf("n1 read %+v; want a numbered 1..4 in insert order", first)
		}
	}
	settle := func(epoch int64, ids ...uuid.UUID) []relay.Settled {
		out := make([]relay.Settled, len(ids))
		for i, id := range ids {
			out[i] = relay.Settled{ID: id, Partition: 1, Epoch: epoch}
		}
		return out
	}
	if marked, err := h.store.MarkPublished(ctx, settle(e1, ids[0], ids[1])); err != nil || len(marked) != 2 {
		t.Fatalf("n1 marked %v (%v); want 2 rows", marked, err)
	}
	h.Grant(t, "n2", 1)
	late := h.Insert(t, 1, "a")[0]
	if marked, err := h.store.MarkPublished(ctx, settle(e1, ids[2])); err != nil || len(marked) != 0 {
		t.Fatalf("n1 marked %v (%v) after the hand-off; want none", marked, err)
	}
	if rows := readAll(t, h.store, from(1)); slices.ContainsFunc(rows, func(r relay.Row) bool { return r.ID == late }) {
		t.Fatalf("n1, no longer the owner, read the late row numbered: %+v", rows)
	}
	n2 := pgstore.New(h.pool, "n2", nil)
	got := readAll(t, n2, from(1))
	if len(got) != 3 || got[0].ID != ids[2] || got[1].ID != ids[3] || got[2].ID != late {
		t.Fatalf("n2 read %+v; want a's rows 3 and 4 and the late row", got)
	}
	for i, r := range got[:2] {
		was := first[r.ID]
		if r.KeySeq != was.KeySeq || r.PrevKeySeq != was.PrevKeySeq {
			t.Fatalf("row %d: n1 read key_seq %d prev %d, n2 %d prev %d", i, was.KeySeq, was.PrevKeySeq, r.KeySeq, r.PrevKeySeq)
		}
	}
	if got[0].PrevPending || !got[1].PrevPending || got[2].KeySeq != 5 || !got[2].PrevPending {
		t.Fatalf("n2 read %+v; want row 3 free to go (2 is marked), 4 waiting, the late row numbered 5", got)
	}
}

// parkFirst parks row id of partition p as the relay parks it at the
// attempt cap (RecordFailures), which holds its key's numbered rows above
// it.
func parkFirst(t *testing.T, h *pgHarness, p int, id uuid.UUID) {
	t.Helper()
	parked, err := h.store.RecordFailures(testkit.Context(t, 30*time.Second), []relay.Settled{{ID: id, Partition: p, Epoch: epochOf(t, h, p), Err: "broker said no"}}, 1)
	if err != nil || len(parked) != 1 || parked[0] != id {
		t.Fatalf("RecordFailures parked %v (%v); want %s", parked, err, id)
	}
}

// parkedKeyWithLateRows returns a harness without the trigger whose key
// "a" has two rows numbered by a read, the first parked by the relay (the
// second held behind it), and then rows of keys late inserted, not yet
// read.
func parkedKeyWithLateRows(t *testing.T, late ...string) (h *pgHarness, first, after []uuid.UUID) {
	t.Helper()
	h = newHarness(t, false)
	first = h.Insert(t, 1, "a", "a")
	readAll(t, h.store, from(1))
	parkFirst(t, h, 1, first[0])
	return h, first, h.Insert(t, 1, late...)
}

// heldIn counts the rows of ids held behind key_seq head with their own
// number in the row (want[i] for ids[i]) and no journal entry.
func heldIn(t *testing.T, h *pgHarness, head int64, ids []uuid.UUID, want []int64) int {
	t.Helper()
	var n int
	err := h.pool.QueryRow(testkit.Context(t, 10*time.Second), `SELECT count(*)
		FROM outbox AS o JOIN unnest($1::uuid[], $2::bigint[]) AS w(id, ks) ON w.id = o.id
		WHERE o.held_behind = $3 AND o.key_seq = w.ks AND o.processed_at IS NULL
		  AND NOT EXISTS (SELECT 1 FROM outbox_numbers AS j WHERE j.id = o.id)`, ids, want, head).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestNumberingHoldsAParkedKeysRows: rows committed to a key whose
// parked row waits for an operator are held behind it by the numbering
// itself, their numbers in the rows and none in the journal: no read
// returns them (the read's hold would have read each once). Another
// key's rows go on; a retry releases the key, whose rows then read in
// order with the numbers they were given.
func TestNumberingHoldsAParkedKeysRows(t *testing.T) {
	testkit.RequirePostgres(t)
	h := newHarness(t, false)
	first := h.Insert(t, 1, "a", "a", "b")
	if rows := readAll(t, h.store, from(1)); len(rows) != 3 {
		t.Fatalf("read %d rows, want 3", len(rows))
	}
	parkFirst(t, h, 1, first[0])
	if n := heldIn(t, h, 1, first[1:2], []int64{2}); n != 1 {
		t.Fatal("a's second row is not held behind the parked one")
	}
	late := h.Insert(t, 1, "a", "b", "a")
	rows := readAll(t, h.store, from(1))
	for _, r := range rows {
		if r.CorrelationID == "a" {
			t.Fatalf("a row of the parked key is read (%+v): the numbering holds them", r)
		}
	}
	if len(rows) != 2 || rows[0].ID != first[2] || rows[1].ID != late[1] || rows[1].KeySeq != 2 {
		t.Fatalf("read %+v; want b's two rows", rows)
	}
	if n := heldIn(t, h, 1, []uuid.UUID{late[0], late[2]}, []int64{3, 4}); n != 2 {
		t.Fatalf("%d of a's two new rows held behind its parked row as 3 and 4, want both", n)
	}

	h.Retry(t, first[0])
	got := map[uuid.UUID]relay.Row{}
	for _, r := range readAll(t, h.store, from(1)) {
		got[r.ID] = r
	}
	for i, id := range []uuid.UUID{first[0], first[1], late[0], late[2]} {
		r, ok := got[id]
		if !ok || r.KeySeq != int64(i+1) || r.BehindParked || r.PrevPending != (i > 0) {
			t.Fatalf("after the retry a's row %d reads as %+v (read: %v); want key_seq %d", i+1, r, ok, i+1)
		}
	}
}

// TestRetryWaitsForTheNumberingsHold: a retry of a parked row that comes
// while a numbering is holding rows behind it waits for the numbering's
// commit, and then releases those rows too. Without the numbering's lock
// on the parked row, the retry's release ran first and missed them, and
// they stayed held behind a row no longer parked.
func TestRetryWaitsForTheNumberingsHold(t *testing.T) {
	testkit.RequirePostgres(t)
	h, first, late := parkedKeyWithLateRows(t, "a")
	ctx := testkit.Context(t, time.Minute)

	tx := begin(t, h)
	if _, err := tx.Exec(ctx, `SELECT outbox_journal_rows('n1', ARRAY[1], NULL)`); err != nil {
		t.Fatal(err)
	}
	retried := make(chan error, 1)
	go func() {
		_, err := h.pool.Exec(ctx, sqlRetryParked, first[0])
		retried <- err
	}()
	var done bool
	var err error
	testkit.WaitFor(t, 30*time.Second, "the retry to wait for a lock, or end", func() bool {
		select {
		case err = <-retried:
			done = true
			return true
		default:
		}
		var waiting bool
		if qerr := h.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE 'UPDATE outbox SET parked_at = NULL%')`).Scan(&waiting); qerr != nil {
			t.Fatal(qerr)
		}
		return waiting
	})
	commit(t, tx)
	if !done {
		err = <-retried
	}
	if err != nil {
		t.Fatal(err)
	}
	if n := parkedCount(t, h, `held_behind IS NOT NULL`); n != 0 {
		t.Fatalf("%d rows still held behind a row retried", n)
	}
	rows := readAll(t, h.store, from(1))
	if len(rows) != 3 || rows[2].ID != late[0] || rows[2].KeySeq != 3 {
		t.Fatalf("after the retry the read returned %+v; want a's three rows, the last numbered 3", rows)
	}
}

// TestNumberingPassesAParkedRowBeingChanged: a numbering that finds its
// key's parked row locked by an operator's change in progress does not
// wait for it: it numbers the key's new row in the journal, and the
// read returns within its time.
func TestNumberingPassesAParkedRowBeingChanged(t *testing.T) {
	testkit.RequirePostgres(t)
	h, first, late := parkedKeyWithLateRows(t, "a", "b")
	ctx := testkit.Context(t, time.Minute)

	tx := begin(t, h)
	if _, err := tx.Exec(ctx, `SELECT 1 FROM outbox WHERE id = $1 FOR UPDATE`, first[0]); err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	rows, err := h.store.ReadPending(rctx, []relay.Cursor{from(1)}, 100)
	if err != nil {
		t.Fatalf("the read beside a parked row being changed: %v", err)
	}
	if got := byID(rows); got[late[1]].KeySeq != 1 {
		t.Fatalf("read %+v; want b's row", rows)
	}
	if ks := numberOf(t, h, late[0]); ks == nil || *ks != 3 {
		t.Fatalf("a's new row is numbered %v; want 3", ks)
	}
	commit(t, tx)
}

// TestParkedKeyUnderConcurrentProducersAndRetries: producers add rows to
// a key whose first row is parked while reads number and hold them and an
// operator retries the parked row and the relay parks it again, over and
// over; then three more rows come while it is parked. At the end no row
// is held behind a row that is not parked and pending (such a row would
// wait for ever), the key is numbered 1..n, each number once, in the row
// or in the journal, and a last retry lets every row read.
func TestParkedKeyUnderConcurrentProducersAndRetries(t *testing.T) {
	testkit.RequirePostgres(t)
	h := newHarness(t, false)
	const producers, txs, rounds = 3, 60, 30
	ctx := testkit.Context(t, 2*time.Minute)
	head := h.Insert(t, 1, "a")[0]
	readAll(t, h.store, from(1))
	parkFirst(t, h, 1, head)

	var wg sync.WaitGroup
	errs := make(chan error, producers+2)
	stop := make(chan struct{})
	for range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range txs {
				if _, err := h.pool.Exec(ctx, `INSERT INTO outbox (id, partition, correlation_id, exchange, routing_key, type, payload)
					VALUES ($1, 1, 'a', 'ex', 'rk', 't', '{}')`, uuid.Must(uuid.NewV7())); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	var reading sync.WaitGroup
	reading.Add(1)
	go func() { // the relay's reads
		defer reading.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := h.store.ReadPending(ctx, []relay.Cursor{from(1)}, 16); err != nil {
				errs <- fmt.Errorf("read: %w", err)
				return
			}
		}
	}()
	// The operator retries, and the relay parks the row again at once.
	for range rounds {
		h.Retry(t, head)
		parked, err := h.store.RecordFailures(ctx, []relay.Settled{{ID: head, Partition: 1, Epoch: epochOf(t, h, 1), Err: "still no"}}, 1)
		if err != nil || len(parked) != 1 {
			t.Fatalf("park again: %v (%v)", parked, err)
		}
	}
	wg.Wait()
	close(stop)
	reading.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	// Three more rows while the row is parked: the next read's numbering
	// holds them.
	h.Insert(t, 1, "a", "a", "a")
	readAll(t, h.store, from(1))

	if n := parkedCount(t, h, `held_behind IS NOT NULL AND processed_at IS NULL AND NOT EXISTS (SELECT 1 FROM outbox AS p
		WHERE p.correlation_id = outbox.correlation_id AND p.key_seq = outbox.held_behind AND p.parked_at IS NOT NULL AND p.processed_at IS NULL)`); n != 0 {
		t.Fatalf("%d rows held behind a row that is not parked", n)
	}
	var total, distinct, top int64
	if err := h.pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT ks), coalesce(max(ks), 0) FROM (
		SELECT coalesce(o.key_seq, n.key_seq) AS ks FROM outbox AS o LEFT JOIN outbox_numbers AS n ON n.id = o.id
		WHERE o.correlation_id = 'a') AS x WHERE ks IS NOT NULL`).Scan(&total, &distinct, &top); err != nil {
		t.Fatal(err)
	}
	const rows = 1 + producers*txs + 3
	if want := int64(rows); total != want || distinct != want || top != want {
		t.Fatalf("key a: %d rows numbered, %d distinct numbers, highest %d; want %d, %d, %d", total, distinct, top, want, want, want)
	}
	// Released for good, every row reads in order.
	h.Retry(t, head)
	var ks []int64
	for _, r := range readPass(t, h.store, 100) {
		ks = append(ks, r.KeySeq)
	}
	slices.Sort(ks)
	for i, k := range ks {
		if k != int64(i+1) {
			t.Fatalf("after the last retry the reads return key_seq %v...; want 1..%d", ks[:min(len(ks), 10)], rows)
		}
	}
	if len(ks) != rows {
		t.Fatalf("after the last retry the reads return %d rows; want %d", len(ks), rows)
	}
}
