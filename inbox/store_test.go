package inbox_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ordo-relay/ordo/inbox"
	"github.com/ordo-relay/ordo/internal/testkit"
)

func newStore(tb testing.TB, cfg inbox.Config, db inbox.DB, dead inbox.DeadLetterer) *inbox.Store {
	tb.Helper()
	s, err := inbox.NewStore(cfg, db, dead)
	if err != nil {
		tb.Fatal(err)
	}
	return s
}

func handle(tb testing.TB, s *inbox.Store, f inbox.Fence, m *inbox.Message, h inbox.Handler) inbox.Outcome {
	tb.Helper()
	out, err := s.Handle(context.Background(), f, m, h)
	if err != nil {
		tb.Fatalf("handle %s/%d: %v", m.CorrelationID, m.KeySeq, err)
	}
	return out
}

func TestHandleDecisions(t *testing.T) {
	_, pool := newDB(t)
	s := newStore(t, inbox.LocalConfig("t"), pool, nil)
	h := recordHandler("")
	steps := []struct {
		name string
		m    *inbox.Message
		want inbox.Outcome
	}{
		{"first message of a new key", msg("a", 1, 0), inbox.Handled},
		{"the same message again", msg("a", 1, 0), inbox.Duplicate},
		{"k+2 before k+1 is a gap", msg("a", 3, 0), inbox.Stored},
		{"the gap message again", msg("a", 3, 0), inbox.Duplicate},
		{"a gap on a new key", msg("b", 2, 1), inbox.Stored},
		{"k+1 fills the gap and k+2 follows", msg("a", 2, 0), inbox.Handled},
		{"k+2 again after both", msg("a", 3, 0), inbox.Duplicate},
		{"a skip announced by the producer", &inbox.Message{ID: "a-5", CorrelationID: "a", KeySeq: 5, PrevKeySeq: 3, Body: []byte("{}")}, inbox.Handled},
	}
	for _, st := range steps {
		if got := handle(t, s, inbox.Fence{}, st.m, h); got != st.want {
			t.Fatalf("%s: %v, want %v", st.name, got, st.want)
		}
	}
	got := handledSeqs(t, pool)
	if want := []int64{1, 2, 3, 5}; !equal(got["a"], want) || len(got["b"]) != 0 {
		t.Fatalf("handled %v, want a %v and nothing of b", got, want)
	}
	st := s.Stats()
	if st.Handled != 4 || st.Duplicates != 3 || st.GapsStored != 2 {
		t.Fatalf("stats %+v", st)
	}
}

func equal(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestHandleModes(t *testing.T) {
	for _, tc := range []struct {
		mode inbox.Mode
		want []int64 // handled key_seqs after 5, 7, 6, 4 of a key never seen
	}{
		{inbox.Ordered, nil},
		{inbox.Bootstrap, []int64{5, 6, 7}},
		{inbox.Partial, []int64{5, 7}},
	} {
		t.Run(tc.mode.String(), func(t *testing.T) {
			_, pool := newDB(t)
			cfg := inbox.LocalConfig("t")
			cfg.Mode = tc.mode
			s := newStore(t, cfg, pool, nil)
			for _, seq := range []int64{5, 7, 6, 4} {
				handle(t, s, inbox.Fence{}, msg("k", seq, 0), recordHandler(""))
			}
			if got := handledSeqs(t, pool)["k"]; !equal(got, tc.want) {
				t.Fatalf("handled %v, want %v", got, tc.want)
			}
		})
	}
}

func TestHandlerErrorRollsBackAndRetries(t *testing.T) {
	_, pool := newDB(t)
	cfg := inbox.LocalConfig("t")
	cfg.MaxAttempts = 3
	dead := &fakeDead{}
	s := newStore(t, cfg, pool, dead)
	failing := func(ctx context.Context, tx pgx.Tx, m *inbox.Message) error {
		if err := recordHandler("")(ctx, tx, m); err != nil {
			return err
		}
		if m.CorrelationID == "poison" {
			return errors.New("boom")
		}
		return nil
	}
	if out := handle(t, s, inbox.Fence{}, msg("poison", 1, 0), failing); out != inbox.Retrying {
		t.Fatalf("first attempt: %v", out)
	}
	handle(t, s, inbox.Fence{}, msg("poison", 2, 0), failing) // waits behind 1
	handle(t, s, inbox.Fence{}, msg("ok", 1, 0), failing)
	ctx := testkit.Context(t, 30*time.Second)
	waitFor(t, 30*time.Second, "poison dead-lettered", func() bool {
		if _, err := s.RetryDue(ctx, inbox.Fence{}, 0, 10, failing); err != nil {
			t.Fatal(err)
		}
		return len(dead.list()) > 0
	})
	if got := dead.list(); len(got) != 1 || got[0] != "poison/1 after 3" {
		t.Fatalf("dead-lettered %v", got)
	}
	handle(t, s, inbox.Fence{}, msg("ok", 2, 0), failing)
	checkOnceInOrder(t, handledSeqs(t, pool), map[string]int64{"ok": 2})
	dl, err := inbox.Dead(ctx, pool, "t")
	if err != nil || len(dl) != 1 || dl[0].Key != "poison" || dl[0].KeySeq != 1 || dl[0].Attempts != 3 || dl[0].Waiting != 1 {
		t.Fatalf("dead %+v, %v", dl, err)
	}
	// Held by a dead message, the key is not stuck, and not resolvable.
	if stuck, err := inbox.Stuck(ctx, pool, "t", 0); err != nil || len(stuck) != 0 {
		t.Fatalf("stuck %+v %v, want none: the key is dead-lettered, not missing a message", stuck, err)
	}
	if err := inbox.Resolve(ctx, pool, "t", "default", "poison"); !errors.Is(err, inbox.ErrNothingToResolve) {
		t.Fatalf("resolve of a dead key: %v", err)
	}
	// The operator retries it with a fixed handler: both messages go.
	if err := inbox.Retry(ctx, pool, "t", "default", "poison"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.RetryDue(ctx, inbox.Fence{}, 0, 10, recordHandler("")); err != nil {
		t.Fatal(err)
	}
	checkOnceInOrder(t, handledSeqs(t, pool), map[string]int64{"ok": 2, "poison": 2})
}

// TestRedeliveryCountsAttempt: each redelivery of a message whose handler
// crashed counts one attempt, so a crash loop reaches the dead-letter queue.
func TestRedeliveryCountsAttempt(t *testing.T) {
	_, pool := newDB(t)
	cfg := inbox.LocalConfig("t")
	cfg.MaxAttempts = 2
	dead := &fakeDead{}
	s := newStore(t, cfg, pool, dead)
	crashes := 0
	crash := func(context.Context, pgx.Tx, *inbox.Message) error {
		crashes++
		return errors.New("crash") // stands for a process that dies here
	}
	m := msg("k", 1, 0)
	m.Redelivered = true
	if out := handle(t, s, inbox.Fence{}, m, crash); out != inbox.Retrying {
		t.Fatalf("redelivery: %v", out)
	}
	ctx := testkit.Context(t, 30*time.Second)
	waitFor(t, 30*time.Second, "dead-lettered", func() bool {
		if _, err := s.RetryDue(ctx, inbox.Fence{}, 0, 10, crash); err != nil {
			t.Fatal(err)
		}
		return len(dead.list()) > 0
	})
	// One attempt counted for the redelivery, one run: M = 2.
	if crashes != 1 {
		t.Fatalf("handler ran %d times, want 1 (the redelivery counts as an attempt)", crashes)
	}
}

func TestFencedWriteRefused(t *testing.T) {
	_, pool := newDB(t)
	s := newStore(t, inbox.LocalConfig("t"), pool, nil)
	ctx := testkit.Context(t, 30*time.Second)
	if _, err := pool.Exec(ctx, `INSERT INTO ordo_inbox_leases (consumer, shard, owner, epoch, expires_at)
		VALUES ('t', 0, 'b', 2, now() + interval '1 minute')`); err != nil {
		t.Fatal(err)
	}
	stale := inbox.Fence{Shard: 0, Owner: "a", Epoch: 1}
	for _, m := range []*inbox.Message{msg("k", 1, 0), msg("g", 2, 0)} {
		_, err := s.Handle(ctx, stale, m, recordHandler("a"))
		if !errors.Is(err, inbox.ErrFenced) {
			t.Fatalf("%s/%d under a stale epoch: %v, want ErrFenced", m.CorrelationID, m.KeySeq, err)
		}
	}
	if got := handledSeqs(t, pool); len(got) != 0 {
		t.Fatalf("a fenced handler's writes were committed: %v", got)
	}
	var stored int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM ordo_inbox_messages`).Scan(&stored); err != nil || stored != 0 {
		t.Fatalf("a fenced gap was stored: %d %v", stored, err)
	}
	current := inbox.Fence{Shard: 0, Owner: "b", Epoch: 2}
	if out := handle(t, s, current, msg("k", 1, 0), recordHandler("b")); out != inbox.Handled {
		t.Fatalf("under the current epoch: %v", out)
	}
	if st := s.Stats(); st.Fenced != 2 {
		t.Fatalf("fenced count %d, want 2", st.Fenced)
	}
}

func TestInvalidDelivery(t *testing.T) {
	for _, tc := range []struct {
		name    string
		corr    string
		headers map[string]any
	}{
		{"no correlation id", "", map[string]any{"x-ordo-key-seq": int64(1), "x-ordo-prev-key-seq": int64(0), "x-ordo-partition": int32(0)}},
		{"no key_seq", "k", map[string]any{"x-ordo-prev-key-seq": int64(0), "x-ordo-partition": int32(0)}},
		{"text key_seq", "k", map[string]any{"x-ordo-key-seq": "1", "x-ordo-prev-key-seq": int64(0), "x-ordo-partition": int32(0)}},
		{"prev not below key_seq", "k", map[string]any{"x-ordo-key-seq": int64(1), "x-ordo-prev-key-seq": int64(1), "x-ordo-partition": int32(0)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := deliveryOf(tc.corr, tc.headers)
			if _, err := inbox.FromDelivery(d); !errors.Is(err, inbox.ErrInvalidMessage) || !strings.Contains(err.Error(), "m1") {
				t.Fatalf("FromDelivery: %v", err)
			}
		})
	}
	d := deliveryOf("k", map[string]any{"x-ordo-key-seq": int32(7), "x-ordo-prev-key-seq": int8(6), "x-ordo-partition": int64(3)})
	m, err := inbox.FromDelivery(d)
	if err != nil || m.KeySeq != 7 || m.PrevKeySeq != 6 || m.Partition != 3 {
		t.Fatalf("other integer widths: %+v %v", m, err)
	}
}

// TestRewindDetected: the key's last key_seq seen again under another
// message id (a producer whose key_seq went back) is dropped, as any
// duplicate, but counted; a republish (same id) is not.
func TestRewindDetected(t *testing.T) {
	_, pool := newDB(t)
	s := newStore(t, inbox.LocalConfig("t"), pool, nil)
	h := recordHandler("")
	handle(t, s, inbox.Fence{}, msg("a", 1, 0), h)
	handle(t, s, inbox.Fence{}, msg("a", 2, 0), h)
	if out := handle(t, s, inbox.Fence{}, msg("a", 2, 0), h); out != inbox.Duplicate || s.Stats().Rewinds != 0 {
		t.Fatalf("republish: %v, rewinds %d", out, s.Stats().Rewinds)
	}
	rewound := msg("a", 2, 0)
	rewound.ID = "a-2-after-failover"
	if out := handle(t, s, inbox.Fence{}, rewound, h); out != inbox.Duplicate || s.Stats().Rewinds != 1 {
		t.Fatalf("rewound: %v, rewinds %d", out, s.Stats().Rewinds)
	}
}
