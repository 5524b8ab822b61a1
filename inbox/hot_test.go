package inbox_test

import (
	"testing"
	"time"

	"github.com/ordo-relay/ordo/inbox"
	"github.com/ordo-relay/ordo/internal/testkit"
)

// TestAdvanceIsHOT: handling a key's messages one transaction after
// another, on the fast path (Handle) and on the per-message path (a gap
// filled), updates the key's row in place (a HOT update, no new index
// entry): handled_at, the one indexed column an advance would change,
// moves at most once a minute.
func TestAdvanceIsHOT(t *testing.T) {
	_, pool := newDB(t)
	s := newStore(t, inbox.LocalConfig("t"), pool, nil)
	h := recordHandler("")
	ctx := testkit.Context(t, 60*time.Second)
	for seq := int64(1); seq <= 4; seq++ {
		if out := handle(t, s, inbox.Fence{}, msg("k", seq, 0), h); out != inbox.Handled {
			t.Fatalf("k/%d: %v", seq, out)
		}
	}
	if out := handle(t, s, inbox.Fence{}, msg("k", 6, 0), h); out != inbox.Stored {
		t.Fatalf("k/6: %v, want stored", out)
	}
	if out := handle(t, s, inbox.Fence{}, msg("k", 5, 0), h); out != inbox.Handled {
		t.Fatalf("k/5: %v", out)
	}
	checkOnceInOrder(t, handledSeqs(t, pool), map[string]int64{"k": 6})
	// The backends report their counts when idle, within seconds.
	var upd, hot int64
	testkit.WaitFor(t, 45*time.Second, "6 key updates counted", func() bool {
		if err := pool.QueryRow(ctx, `SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'ordo_inbox_keys'`).
			Scan(&upd, &hot); err != nil {
			t.Fatal(err)
		}
		return upd >= 6
	})
	if hot != upd {
		t.Fatalf("%d of %d key row updates were HOT, want all", hot, upd)
	}
}

// TestRetentionWaitsForTheCoarseClock: a key's handled_at may be up to a
// minute old while the key is busy, so retention deletes a key only a
// minute after handled_at passed the age: one 30 s past it is kept, one
// two minutes past it deleted.
func TestRetentionWaitsForTheCoarseClock(t *testing.T) {
	_, pool := newDB(t)
	s := newStore(t, inbox.LocalConfig("t"), pool, nil)
	h := recordHandler("")
	ctx := testkit.Context(t, 30*time.Second)
	handle(t, s, inbox.Fence{}, msg("recent", 1, 0), h)
	handle(t, s, inbox.Fence{}, msg("old", 1, 0), h)
	if _, err := pool.Exec(ctx, `UPDATE ordo_inbox_keys SET handled_at = now() - CASE correlation_id
		WHEN 'recent' THEN interval '1 hour 30 seconds' ELSE interval '1 hour 2 minutes' END`); err != nil {
		t.Fatal(err)
	}
	n, err := inbox.Retain(ctx, pool, "t", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	rows, err := pool.Query(ctx, `SELECT correlation_id FROM ordo_inbox_keys ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			t.Fatal(err)
		}
		left = append(left, k)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if n != 1 || len(left) != 1 || left[0] != "recent" {
		t.Fatalf("retention deleted %d, left %v: want the old key deleted and the recent one kept", n, left)
	}
}
