package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/ordo-relay/ordo/inbox"
	"github.com/ordo-relay/ordo/internal/testkit"
)

// TestQueuedBatchRoundTrips: with a QueueHandler, a batch whose messages
// are all their keys' next takes three round trips whatever its size:
// BEGIN with the decision, every handler's insert with the advance,
// COMMIT. A batch with a gap in it takes the per-message path (each
// message's statements sent on their own) and still ends right.
func TestQueuedBatchRoundTrips(t *testing.T) {
	pool, trips := tripPool(t, 1) // one connection: its statements prepared once
	cfg := inbox.LocalConfig("t")
	cfg.BatchTime = time.Minute
	s := newStore(t, cfg, pool, nil)
	q := recordQueue("")
	inbox.SetQueue(s, q)
	h := q.Handler()
	batch := batcher(t, s, h)
	batch(msg("warm", 1, 0), msg("warm", 2, 0))
	for _, tc := range []struct {
		name string
		ms   []*inbox.Message
		want []inbox.Outcome
	}{
		{"one message", []*inbox.Message{msg("z", 1, 0)}, []inbox.Outcome{inbox.Handled}},
		{"new keys", []*inbox.Message{msg("a", 1, 0), msg("b", 1, 0), msg("a", 2, 0), msg("c", 1, 0)},
			[]inbox.Outcome{inbox.Handled, inbox.Handled, inbox.Handled, inbox.Handled}},
		{"known keys and a duplicate", []*inbox.Message{msg("a", 3, 0), msg("b", 2, 0), msg("b", 1, 0), msg("c", 2, 0), msg("d", 1, 0), msg("a", 4, 0)},
			[]inbox.Outcome{inbox.Handled, inbox.Handled, inbox.Duplicate, inbox.Handled, inbox.Handled, inbox.Handled}},
	} {
		before := trips.n.Load()
		if outs := batch(tc.ms...); !slices.Equal(outs, tc.want) {
			t.Fatalf("%s: %v, want %v", tc.name, outs, tc.want)
		}
		if n := trips.n.Load() - before; n != 3 {
			t.Errorf("%s: %d round trips, want 3", tc.name, n)
		}
	}
	if outs := batch(msg("e", 1, 0), msg("a", 6, 0), msg("b", 3, 0)); !slices.Equal(outs, []inbox.Outcome{inbox.Handled, inbox.Stored, inbox.Handled}) {
		t.Fatalf("a batch with a gap: %v, want handled, stored, handled", outs)
	}
	if outs := batch(msg("a", 5, 0), msg("e", 2, 0)); !slices.Equal(outs, []inbox.Outcome{inbox.Handled, inbox.Handled}) {
		t.Fatalf("the gap filled: %v", outs)
	}
	checkOnceInOrder(t, handledSeqs(t, pool), map[string]int64{"warm": 2, "z": 1, "a": 5, "b": 3, "c": 2, "d": 1, "e": 2})
}

// TestQueuedHandlerFailsAlone: in a batch handled with a QueueHandler, a
// message whose handler fails (its queueing returns an error, a statement
// it queued fails in PostgreSQL, or a callback it set returns an error)
// is the only one that fails: the batch's other messages are committed
// once, the failure is stored for a retry after one run of the handler
// (the per-message path replays it rather than run it again), the key's
// later message waits behind it, and the retry handles both in order.
func TestQueuedHandlerFailsAlone(t *testing.T) {
	for _, way := range []string{"queueing", "statement", "callback"} {
		t.Run(way, func(t *testing.T) {
			pool, _ := tripPool(t, 4)
			cfg := inbox.LocalConfig("t")
			cfg.BatchTime = time.Minute
			s := newStore(t, cfg, pool, nil)
			var (
				mu     sync.Mutex
				runs   = map[string]int{}
				failed atomic.Bool
			)
			rec := recordQueue("")
			q := inbox.QueueHandler(func(ctx context.Context, m *inbox.Message, b *pgx.Batch) error {
				id := fmt.Sprintf("%s/%d", m.CorrelationID, m.KeySeq)
				mu.Lock()
				runs[id]++
				mu.Unlock()
				if err := rec(ctx, m, b); err != nil {
					return err
				}
				if id != "b/1" || !failed.CompareAndSwap(false, true) {
					return nil
				}
				switch way {
				case "queueing":
					return errors.New("fails once: " + id)
				case "statement":
					b.Queue(`SELECT 1 / 0`) // a data exception, of the handler's own statement
				case "callback":
					b.Queue(`SELECT 1`).Exec(func(pgconn.CommandTag) error { return errors.New("fails once: " + id) })
				}
				return nil
			})
			inbox.SetQueue(s, q)
			h := q.Handler()
			ctx := testkit.Context(t, 30*time.Second)
			outs, errs, err := inbox.HandleBatch(ctx, s, inbox.Fence{},
				[]*inbox.Message{msg("a", 1, 0), msg("b", 1, 0), msg("c", 1, 0), msg("a", 2, 0), msg("b", 2, 0)}, h)
			if err != nil {
				t.Fatal(err)
			}
			want := []inbox.Outcome{inbox.Handled, inbox.Retrying, inbox.Handled, inbox.Handled, inbox.Stored}
			if !slices.Equal(outs, want) || errors.Join(errs...) != nil {
				t.Fatalf("outcomes %v %v, want %v", outs, errs, want)
			}
			mu.Lock()
			bRuns := runs["b/1"]
			mu.Unlock()
			if bRuns != 1 {
				t.Fatalf("b/1's handler ran %d times in the batch, want once (its failure replayed)", bRuns)
			}
			if st := s.Stats(); st.Retries != 1 {
				t.Fatalf("stats %+v: want the failure counted once", st)
			}
			checkOnceInOrder(t, handledSeqs(t, pool), map[string]int64{"a": 2, "c": 1})
			var lastErr string
			if err := pool.QueryRow(ctx, `SELECT last_error FROM ordo_inbox_messages WHERE correlation_id = 'b' AND key_seq = 1`).Scan(&lastErr); err != nil {
				t.Fatal(err)
			}
			if wantErr := map[string]string{"queueing": "fails once", "statement": "division by zero", "callback": "fails once"}[way]; !strings.Contains(lastErr, wantErr) {
				t.Fatalf("b/1 stored with error %q, want one saying %q", lastErr, wantErr)
			}
			testkit.WaitFor(t, 10*time.Second, "b retried", func() bool {
				if _, err := s.RetryDue(ctx, inbox.Fence{}, 0, 10, h); err != nil {
					t.Fatal(err)
				}
				return len(handledSeqs(t, pool)["b"]) == 2
			})
			checkOnceInOrder(t, handledSeqs(t, pool), map[string]int64{"a": 2, "b": 2, "c": 1})
		})
	}
}

// TestQueuedThroughConsumer: a Consumer from NewQueued handles a backlog
// of 40 keys × 5 messages once each, each key in order, with handlers
// whose statement fails the first time PostgreSQL runs it on four
// messages (a key's first among them), and its deliveries share commits.
//
// The failure is decided in PostgreSQL, by a sequence that a rollback
// does not undo: a handler's queueing runs again for each message after
// a batch's first failure (the batch is handled message by message then),
// so a failure decided in the queueing would be spent on a statement that
// PostgreSQL never ran.
func TestQueuedThroughConsumer(t *testing.T) {
	pool, cc := countedPool(t, 6)
	cfg, want := backlogOnOneShard(t)
	fails := map[string]string{}
	for _, id := range []string{"k03/1", "k07/2", "k11/5", "k20/3"} {
		seq := "fail_" + strings.ReplaceAll(id, "/", "_")
		if _, err := pool.Exec(context.Background(), `CREATE SEQUENCE `+seq); err != nil {
			t.Fatal(err)
		}
		fails[id] = seq
	}
	rec := recordQueue("a")
	q := inbox.QueueHandler(func(ctx context.Context, m *inbox.Message, b *pgx.Batch) error {
		if err := rec(ctx, m, b); err != nil {
			return err
		}
		if seq, ok := fails[fmt.Sprintf("%s/%d", m.CorrelationID, m.KeySeq)]; ok {
			b.Queue(`SELECT 1 / (nextval('` + seq + `') - 1)`) // division by zero at its first run only
		}
		return nil
	})
	commits := cc.commits.Load()
	r := startWith(t, cfg, "a", func(cfg inbox.Config) (*inbox.Consumer, error) { return inbox.NewQueued(cfg, pool, q) })
	waitHandled(t, pool, want)
	checkOnceInOrder(t, handledSeqs(t, pool), want)
	// Each injected statement failed once and then ran again: its
	// sequence moved twice at least.
	for id, seq := range fails {
		var runs int64
		if err := pool.QueryRow(context.Background(), `SELECT last_value FROM `+seq).Scan(&runs); err != nil {
			t.Fatal(err)
		}
		if runs < 2 {
			t.Fatalf("%s's injected statement ran %d time(s): want a failure and a retry", id, runs)
		}
	}
	// Every injected failure is counted as a retry: one lost by the
	// per-message path that follows a fast path's failure is what
	// TestQueuedFailureRecordedPastBatchTime guards.
	checkSharedCommits(t, r, cc.commits.Load()-commits, int64(len(fails)))
}

// TestQueuedFailureRecordedPastBatchTime: a batch whose fast path saw a
// handler fail is handled message by message, and that failure is
// recorded even when the messages before it outlast BatchTime there:
// cut before it, the message ran again in a later batch, succeeded, and
// its failure was never counted.
func TestQueuedFailureRecordedPastBatchTime(t *testing.T) {
	pool, _ := tripPool(t, 4)
	cfg := inbox.LocalConfig("t")
	cfg.BatchTime = 20 * time.Millisecond
	s := newStore(t, cfg, pool, nil)
	var (
		mu   sync.Mutex
		runs = map[string]int{}
	)
	rec := recordQueue("")
	q := inbox.QueueHandler(func(ctx context.Context, m *inbox.Message, b *pgx.Batch) error {
		id := fmt.Sprintf("%s/%d", m.CorrelationID, m.KeySeq)
		mu.Lock()
		runs[id]++
		n := runs[id]
		mu.Unlock()
		if id == "a/1" && n == 2 {
			time.Sleep(2 * cfg.BatchTime) // its run again, on the per-message path
		}
		if err := rec(ctx, m, b); err != nil {
			return err
		}
		if id == "b/1" && n == 1 {
			return errors.New("fails once: " + id)
		}
		return nil
	})
	inbox.SetQueue(s, q)
	ctx := testkit.Context(t, 30*time.Second)
	outs, _, err := inbox.HandleBatch(ctx, s, inbox.Fence{}, []*inbox.Message{msg("a", 1, 0), msg("b", 1, 0), msg("c", 1, 0)}, q.Handler())
	if err != nil {
		t.Fatal(err)
	}
	if len(outs) < 2 || outs[1] != inbox.Retrying {
		t.Fatalf("outcomes %v: want b/1 retrying in this batch", outs)
	}
	if st := s.Stats(); st.Retries != 1 {
		t.Fatalf("stats %+v: want b/1's failure counted once", st)
	}
}
