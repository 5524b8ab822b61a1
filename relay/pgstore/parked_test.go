package pgstore_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/ordo-relay/ordo/admin"
	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/relay"
	"github.com/ordo-relay/ordo/relay/pgstore"
)

// Parked keys leave the read (docs/outbox-table.md, "Rows held behind a
// parked row").

// readPass reads every partition of 8 from its first pending row, a page
// of limit rows at a time, as a relay's pass does, and returns the rows.
func readPass(t *testing.T, s *pgstore.Store, limit int) []relay.Row {
	t.Helper()
	var all []relay.Row
	for p := range 8 {
		after := int64(0)
		for {
			rows, err := s.ReadPending(testkit.Context(t, 30*time.Second), []relay.Cursor{{Partition: p, After: after}}, limit)
			if err != nil {
				t.Fatalf("ReadPending: %v", err)
			}
			all = append(all, rows...)
			if len(rows) < limit {
				break
			}
			after = rows[len(rows)-1].Seq
		}
	}
	return all
}

func parkedCount(t *testing.T, h *pgHarness, where string) int {
	t.Helper()
	var n int
	if err := h.pool.QueryRow(testkit.Context(t, 30*time.Second), `SELECT count(*) FROM outbox WHERE `+where).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestParkedKeysLeaveTheRead: the first pass over partitions with 400
// parked keys (two rows waiting behind each) reads their followers once,
// marked BehindParked and without payload, and holds them; later passes
// read only the other keys' rows, so a parked key costs each pass
// nothing. A row a producer adds to a parked key is held too: by the
// numbering without the trigger, read once and held with it. An operator's retry (through the admin API) releases the key's
// rows, which read in order again; a skip lets the next row go.
func TestParkedKeysLeaveTheRead(t *testing.T) {
	testkit.RequirePostgres(t)
	for _, trigger := range []bool{true, false} {
		t.Run(map[bool]string{true: "key_seq trigger", false: "owner numbers"}[trigger], func(t *testing.T) {
			t.Parallel()
			parkedKeysLeaveTheRead(t, trigger)
		})
	}
}

func parkedKeysLeaveTheRead(t *testing.T, trigger bool) {
	const parkedKeys, others = 400, 100
	h := newHarness(t, trigger)
	for p := range 8 {
		h.Grant(t, "n1", p)
	}
	ctx := testkit.Context(t, time.Minute)
	heads := map[string]uuid.UUID{}
	tx := begin(t, h)
	for i := range parkedKeys {
		key := fmt.Sprintf("parked-%d", i)
		heads[key] = insertIn(t, ctx, tx, i%8, key)
		insertIn(t, ctx, tx, i%8, key)
		insertIn(t, ctx, tx, i%8, key)
		if i < others {
			insertIn(t, ctx, tx, i%8, fmt.Sprintf("other-%d", i))
		}
	}
	commit(t, tx)
	readPass(t, h.store, 64) // numbers the rows, without the trigger
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := h.pool.Exec(testkit.Context(t, 30*time.Second), sql, args...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	// Parked as a relay parks them (RecordFailures at the attempt cap,
	// which writes the owner's number into the row).
	exec(`WITH p AS (
		    SELECT o.id, coalesce(o.key_seq, n.key_seq) AS key_seq FROM outbox AS o
		    LEFT JOIN outbox_numbers AS n ON n.id = o.id WHERE o.correlation_id LIKE 'parked-%'),
		j AS (DELETE FROM outbox_numbers AS n USING p WHERE n.id = p.id AND p.key_seq = 1)
		UPDATE outbox AS o SET parked_at = clock_timestamp(), attempts = 5, last_error = 'injected', key_seq = p.key_seq
		FROM p WHERE o.id = p.id AND p.key_seq = 1`)

	first := readPass(t, h.store, 64)
	behind := 0
	for _, r := range first {
		switch {
		case r.CorrelationID[:6] == "other-":
			if r.BehindParked || len(r.Payload) == 0 {
				t.Fatalf("another key's row reads as behind=%v payload %q", r.BehindParked, r.Payload)
			}
		case r.KeySeq == 1:
			t.Fatalf("a parked row is read: %+v", r)
		default:
			if !r.BehindParked || r.Payload != nil || r.Headers != nil || !r.PrevPending {
				t.Fatalf("a row behind a parked one reads as behind=%v prev pending %v payload %q", r.BehindParked, r.PrevPending, r.Payload)
			}
			behind++
		}
	}
	held := parkedCount(t, h, `held_behind IS NOT NULL`)
	t.Logf("first pass: %d rows read, %d of them behind a parked row; %d rows held", len(first), behind, held)
	if held != 2*parkedKeys {
		t.Fatalf("%d rows held, want %d", held, 2*parkedKeys)
	}
	second := readPass(t, h.store, 64)
	t.Logf("second pass: %d rows read", len(second))
	if len(second) != others {
		t.Fatalf("the second pass read %d rows: want only the %d other keys' rows", len(second), others)
	}

	// A row added to a parked key is held: numbered by the trigger, it
	// is read once, behind the parked row, and held by the read;
	// numbered by the owner, the numbering holds it and no read returns
	// it.
	tx = begin(t, h)
	late := insertIn(t, ctx, tx, 3, "parked-3")
	commit(t, tx)
	got := readPass(t, h.store, 64)
	i := slices.IndexFunc(got, func(r relay.Row) bool { return r.ID == late })
	switch {
	case trigger && (i < 0 || !got[i].BehindParked):
		t.Fatalf("a row added to a parked key: not read behind it (%d rows read)", len(got))
	case !trigger && i >= 0:
		t.Fatalf("a row added to a parked key is read (%+v): the numbering holds it", got[i])
	}
	if n := parkedCount(t, h, fmt.Sprintf(`id = '%s' AND held_behind = 1 AND key_seq = 4
		AND NOT EXISTS (SELECT 1 FROM outbox_numbers AS n WHERE n.id = outbox.id)`, late)); n != 1 {
		t.Fatal("a row added to a parked key is not held behind it with its number, 4, in the row")
	}
	if n := len(readPass(t, h.store, 64)); n != others {
		t.Fatalf("after a row was added to a parked key a pass read %d rows, want %d", n, others)
	}

	ops := admin.NewStore(h.pool)
	who := admin.Actor{Operator: "test", RemoteAddr: "local"}
	if err := ops.Retry(ctx, who, heads["parked-7"]); err != nil {
		t.Fatal(err)
	}
	if err := ops.Skip(ctx, who, heads["parked-15"]); err != nil {
		t.Fatal(err)
	}
	exec(`DELETE FROM outbox WHERE id = $1`, heads["parked-23"]) // by hand
	if held := parkedCount(t, h, `held_behind IS NOT NULL`); held != 2*(parkedKeys-3)+1 {
		t.Fatalf("after a retry, a skip and a delete %d rows are held, want %d", held, 2*(parkedKeys-3)+1)
	}
	got = readPass(t, h.store, 64)
	byKey := map[string][]relay.Row{}
	for _, r := range got {
		if r.BehindParked || r.Parked || r.CorrelationID[:6] == "parked" && len(r.Payload) == 0 {
			t.Fatalf("after the operator acted a row reads as %+v", r)
		}
		byKey[r.CorrelationID] = append(byKey[r.CorrelationID], r)
	}
	if n := len(got) - others; n != 3+2+2 {
		t.Fatalf("after the operator acted a pass read %d rows of parked keys, want 7", n)
	}
	retried := byKey["parked-7"]
	if len(retried) != 3 || retried[0].KeySeq != 1 || retried[0].PrevPending || !retried[1].PrevPending || !retried[2].PrevPending {
		t.Fatalf("the retried key reads as %+v", retried)
	}
	if skipped := byKey["parked-15"]; len(skipped) != 2 || skipped[0].KeySeq != 2 || skipped[0].PrevPending || !skipped[0].PrevDead || !skipped[1].PrevPending {
		t.Fatalf("the skipped key reads as %+v", skipped)
	}
	if deleted := byKey["parked-23"]; len(deleted) != 2 || deleted[0].KeySeq != 2 || deleted[0].PrevPending || !deleted[1].PrevPending {
		t.Fatalf("the key whose parked row was deleted reads as %+v", deleted)
	}
}
