package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ordo-relay/ordo/inbox"
	"github.com/ordo-relay/ordo/internal/testkit"
)

// failOnce returns a handler that fails the first attempt of every message
// for which fail returns true, transiently (the next attempt succeeds), and
// records the others in the handled table.
func failOnce(instance string, fail func(m *inbox.Message) bool) inbox.Handler {
	var mu sync.Mutex
	failed := map[string]bool{}
	record := recordHandler(instance)
	return func(ctx context.Context, tx pgx.Tx, m *inbox.Message) error {
		id := fmt.Sprintf("%s/%d", m.CorrelationID, m.KeySeq)
		mu.Lock()
		first := !failed[id] && fail(m)
		failed[id] = true
		mu.Unlock()
		if first {
			return errors.New("transient failure of " + id)
		}
		return record(ctx, tx, m)
	}
}

// TestTransientFailureEveryMode: a transient failure, through the
// real consumer: a handler that fails once, on a key's first message or
// on any message, in every mode. Half the keys have a single message (an
// order placed and never changed). Every message must be handled exactly
// once, in key order.
func TestTransientFailureEveryMode(t *testing.T) {
	cases := []struct {
		name string
		fail func(m *inbox.Message) bool
	}{
		{"first message of each key", func(m *inbox.Message) bool { return m.KeySeq == 1 }},
		{"every message", func(*inbox.Message) bool { return true }},
	}
	for _, mode := range []inbox.Mode{inbox.Ordered, inbox.Bootstrap, inbox.Partial} {
		for _, tc := range cases {
			t.Run(mode.String()+"/"+tc.name, func(t *testing.T) {
				_, pool := newDB(t)
				cfg := consumerConfig(t, 4)
				cfg.Mode = mode
				r := startConsumer(t, cfg, "a", pool, failOnce("a", tc.fail))
				pub := newPublisher(t, cfg.Exchange)
				want := map[string]int64{}
				for k := range 20 {
					n := int64(1 + 2*(k%2)) // single-message keys and three-message keys
					key := fmt.Sprintf("k%d", k)
					want[key] = n
					for seq := int64(1); seq <= n; seq++ {
						pub.publish(key, seq)
					}
				}
				waitOnceInOrder(t, pool, want)
				if st := r.c.Stats(); st.DeadLettered != 0 {
					t.Fatalf("stats %+v: nothing may be dead-lettered", st)
				}
			})
		}
	}
}

// waitOnceInOrder waits until every key in want was handled 1..want[key]
// once each in order, failing with what was handled instead after 30 s (or
// at once when something was handled twice or out of order).
func waitOnceInOrder(tb testing.TB, pool *pgxpool.Pool, want map[string]int64) {
	tb.Helper()
	start := time.Now()
	for {
		got := handledSeqs(tb, pool)
		err := onceInOrder(got, want)
		if err == nil {
			tb.Logf("all handled once, in order, after %v", time.Since(start).Round(time.Millisecond))
			return
		}
		if broken(got, want) || time.Since(start) > 30*time.Second {
			tb.Fatalf("after %v: %v", time.Since(start).Round(time.Millisecond), err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// broken reports a key handled out of order, twice, or beyond want.
func broken(got map[string][]int64, want map[string]int64) bool {
	for k, seqs := range got {
		for i, s := range seqs {
			if s != int64(i+1) || s > want[k] {
				return true
			}
		}
	}
	return false
}

// TestPartialKeepsFailedMessage: in Partial mode a
// failed message stored for retry (or dead-lettered) holds its key, so a
// later message of the key arriving meanwhile waits behind it instead of
// being handled first and deleting it.
func TestPartialKeepsFailedMessage(t *testing.T) {
	for _, tc := range []struct {
		name        string
		maxAttempts int
		want        inbox.Outcome // of k/5's first attempt
	}{
		{"retrying", 5, inbox.Retrying},
		{"dead-lettered", 1, inbox.DeadLettered},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, pool := newDB(t)
			cfg := inbox.LocalConfig("t")
			cfg.Mode = inbox.Partial
			cfg.MaxAttempts = tc.maxAttempts
			cfg.RetryMin, cfg.RetryMax = time.Hour, time.Hour // k/7 arrives within the backoff
			dead := &fakeDead{}
			s := newStore(t, cfg, pool, dead)
			ok := recordHandler("")
			fail := func(context.Context, pgx.Tx, *inbox.Message) error { return errors.New("transient") }
			partial := func(seq int64) *inbox.Message { m := msg("k", seq, 0); m.PrevKeySeq = seq - 2; return m }
			handle(t, s, inbox.Fence{}, partial(1), ok)
			handle(t, s, inbox.Fence{}, partial(3), ok)
			if out := handle(t, s, inbox.Fence{}, partial(5), fail); out != tc.want {
				t.Fatalf("k/5 failing: %v, want %v", out, tc.want)
			}
			if out := handle(t, s, inbox.Fence{}, partial(7), ok); out != inbox.Stored {
				t.Fatalf("k/7 while k/5 is held: %v, want stored behind it; handled %v", out, handledSeqs(t, pool)["k"])
			}
			ctx := testkit.Context(t, 30*time.Second)
			if tc.want == inbox.DeadLettered {
				if err := inbox.Retry(ctx, pool, "t", "default", "k"); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := pool.Exec(ctx, `UPDATE ordo_inbox_messages SET next_attempt_at = now() WHERE key_seq = 5`); err != nil {
				t.Fatal(err)
			}
			if _, err := s.RetryDue(ctx, inbox.Fence{}, 0, 10, ok); err != nil {
				t.Fatal(err)
			}
			if got := handledSeqs(t, pool)["k"]; !equal(got, []int64{1, 3, 5, 7}) {
				t.Fatalf("handled %v, want [1 3 5 7]", got)
			}
		})
	}
}

// TestSkippedHeadsDoNotBlockRetries: a dead message
// skipped by the operator makes the next stored message of its key due
// even when that one is still a gap. Such rows, as many as a retry poll
// takes, must not keep the shard's real retries from running.
func TestSkippedHeadsDoNotBlockRetries(t *testing.T) {
	_, pool := newDB(t)
	ctx := testkit.Context(t, 30*time.Second)
	cfg := inbox.LocalConfig("t")
	cfg.MaxAttempts = 1
	once := newStore(t, cfg, pool, &fakeDead{}) // dead-letters at the first failure
	cfg.MaxAttempts = 5
	s := newStore(t, cfg, pool, &fakeDead{})
	fail := func(context.Context, pgx.Tx, *inbox.Message) error { return errors.New("transient") }
	const limit = 3 // the consumer's poll takes 64
	for i := range limit {
		key := fmt.Sprintf("g%d", i)
		if out := handle(t, once, inbox.Fence{}, msg(key, 1, 0), fail); out != inbox.DeadLettered {
			t.Fatalf("%s/1: %v", key, out)
		}
		if out := handle(t, once, inbox.Fence{}, msg(key, 3, 0), fail); out != inbox.Stored {
			t.Fatalf("%s/3: %v", key, out)
		}
		if err := inbox.Skip(ctx, pool, "t", "default", key); err != nil { // k/3 still waits for k/2
			t.Fatal(err)
		}
	}
	if out := handle(t, s, inbox.Fence{}, msg("r", 1, 0), fail); out != inbox.Retrying {
		t.Fatalf("r/1: %v", out)
	}
	if _, err := pool.Exec(ctx, `UPDATE ordo_inbox_messages SET next_attempt_at = now() WHERE correlation_id = 'r'`); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := s.RetryDue(ctx, inbox.Fence{}, 0, limit, recordHandler("")); err != nil {
			t.Fatal(err)
		}
	}
	if got := handledSeqs(t, pool); !equal(got["r"], []int64{1}) || len(got) != 1 {
		t.Fatalf("after 3 retry polls of %d: handled %v, want r/1 only", limit, got)
	}
}

// TestMaxAttemptsOne: MaxAttempts = 1 means one
// handler attempt, then the dead-letter queue. A redelivery (which the
// inbox counts as an attempt, since it cannot tell whether an earlier
// delivery's handler ran) still gets its one run: it is not dead-lettered
// unrun.
func TestMaxAttemptsOne(t *testing.T) {
	for _, tc := range []struct {
		name        string
		redelivered bool
		fails       bool
		want        inbox.Outcome // after the retry poll
		runs        int
	}{
		{"first delivery fails", false, true, inbox.DeadLettered, 1},
		{"redelivery succeeds", true, false, inbox.Handled, 1},
		{"redelivery fails", true, true, inbox.DeadLettered, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, pool := newDB(t)
			cfg := inbox.LocalConfig("t")
			cfg.MaxAttempts = 1
			dead := &fakeDead{}
			s := newStore(t, cfg, pool, dead)
			runs := 0
			h := func(ctx context.Context, tx pgx.Tx, m *inbox.Message) error {
				runs++
				if tc.fails {
					return errors.New("boom")
				}
				return recordHandler("")(ctx, tx, m)
			}
			m := msg("k", 1, 0)
			m.Redelivered = tc.redelivered
			handle(t, s, inbox.Fence{}, m, h)
			ctx := testkit.Context(t, 30*time.Second)
			testkit.WaitFor(t, 30*time.Second, "k/1 settled", func() bool {
				if _, err := s.RetryDue(ctx, inbox.Fence{}, 0, 10, h); err != nil {
					t.Fatal(err)
				}
				return len(dead.list()) > 0 || len(handledSeqs(t, pool)["k"]) > 0
			})
			gotDead := len(dead.list()) > 0
			if runs != tc.runs || gotDead != (tc.want == inbox.DeadLettered) {
				t.Fatalf("handler ran %d times (want %d), dead-lettered %v (want %v)", runs, tc.runs, dead.list(), tc.want)
			}
		})
	}
}

// TestBelowLowWaterHeldNotDropped: a message of a
// key the inbox does not know, older than the retention low-water mark,
// is either a redelivery of a key retention deleted or a first delivery
// that came late (a key's first row parked at the relay and retried after
// RetentionAge). The inbox cannot tell them apart, so it must not drop it
// silently: it is dead-lettered and its key held, listed by Dead, for the
// operator to retry (a late first delivery: handled, in order) or skip (a
// redelivery: dropped).
func TestBelowLowWaterHeldNotDropped(t *testing.T) {
	_, pool := newDB(t)
	ctx := testkit.Context(t, 30*time.Second)
	dead := &fakeDead{}
	s := newStore(t, inbox.LocalConfig("t"), pool, dead)
	ok := recordHandler("")
	// One clock for every message: a redelivery carries its message's
	// timestamp, so old/2 must have the same one both times (read from the
	// clock twice, a second boundary between them made the second one the
	// low-water mark itself, not below it).
	now := time.Now().Truncate(time.Second)
	at := func(m *inbox.Message, age time.Duration) *inbox.Message {
		m.Timestamp = now.Add(-age)
		return m
	}
	handle(t, s, inbox.Fence{}, at(msg("old", 1, 0), 2*time.Hour), ok)
	handle(t, s, inbox.Fence{}, at(msg("old", 2, 0), 2*time.Hour), ok)
	if _, err := pool.Exec(ctx, `UPDATE ordo_inbox_keys SET handled_at = now() - interval '2 hours'`); err != nil {
		t.Fatal(err)
	}
	if n, err := inbox.Retain(ctx, pool, "t", time.Hour); err != nil || n != 1 {
		t.Fatalf("retain: %d, %v", n, err)
	}
	for _, m := range []*inbox.Message{
		at(msg("late", 1, 0), 3*time.Hour), // a first delivery, late
		at(msg("late", 2, 0), 3*time.Hour),
		at(msg("old", 2, 0), 2*time.Hour), // a redelivery of the deleted key
	} {
		if out := handle(t, s, inbox.Fence{}, m, ok); out != inbox.DeadLettered {
			t.Fatalf("%s/%d below the low-water mark: %v, want dead-lettered (held for the operator)", m.CorrelationID, m.KeySeq, out)
		}
	}
	dl, err := inbox.Dead(ctx, pool, "t")
	if err != nil || len(dl) != 3 || len(dead.list()) != 3 {
		t.Fatalf("dead %+v %v, dead-letter queue %v: want the three held", dl, err, dead.list())
	}
	if err := inbox.Retry(ctx, pool, "t", "default", "late"); err != nil {
		t.Fatal(err)
	}
	if err := inbox.Skip(ctx, pool, "t", "default", "old"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.RetryDue(ctx, inbox.Fence{}, 0, 10, ok); err != nil {
		t.Fatal(err)
	}
	checkOnceInOrder(t, handledSeqs(t, pool), map[string]int64{"old": 2, "late": 2})
	if dl, err := inbox.Dead(ctx, pool, "t"); err != nil || len(dl) != 0 {
		t.Fatalf("dead after retry and skip: %+v %v", dl, err)
	}
}

// TestBootstrapRedeliveredFirstMessage: in Bootstrap mode the first
// message seen of a key, met mid-history, may come flagged redelivered
// (it is then stored with an attempt counted and run from the table): it
// must still be the key's next, not a gap waiting for the history the
// consumer never saw.
func TestBootstrapRedeliveredFirstMessage(t *testing.T) {
	_, pool := newDB(t)
	cfg := inbox.LocalConfig("t")
	cfg.Mode = inbox.Bootstrap
	s := newStore(t, cfg, pool, &fakeDead{})
	m := msg("k", 5, 0)
	m.Redelivered = true
	if out := handle(t, s, inbox.Fence{}, m, recordHandler("")); out != inbox.Retrying {
		t.Fatalf("redelivered k/5: %v", out)
	}
	ctx := testkit.Context(t, 30*time.Second)
	testkit.WaitFor(t, 30*time.Second, "k/5 handled", func() bool {
		if _, err := s.RetryDue(ctx, inbox.Fence{}, 0, 10, recordHandler("")); err != nil {
			t.Fatal(err)
		}
		return len(handledSeqs(t, pool)["k"]) > 0
	})
	handle(t, s, inbox.Fence{}, msg("k", 6, 0), recordHandler(""))
	if got := handledSeqs(t, pool)["k"]; !equal(got, []int64{5, 6}) {
		t.Fatalf("handled %v, want [5 6]", got)
	}
}
