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
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ordo-relay/ordo/inbox"
	"github.com/ordo-relay/ordo/internal/testkit"
)

// commitCounter is a pgx tracer counting the statements and the COMMITs a
// pool sends.
type commitCounter struct{ statements, commits atomic.Int64 }

func (c *commitCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	c.statements.Add(1)
	if strings.EqualFold(strings.TrimSpace(d.SQL), "commit") {
		c.commits.Add(1)
	}
	return ctx
}

func (c *commitCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (c *commitCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

func (c *commitCounter) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {
	c.statements.Add(1)
}

func (c *commitCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// countedPool is newDB's database through a pool of size conns whose
// statements and commits are counted.
func countedPool(tb testing.TB, conns int32) (*pgxpool.Pool, *commitCounter) {
	tb.Helper()
	url, _ := newDB(tb)
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		tb.Fatal(err)
	}
	cc := &commitCounter{}
	pc.ConnConfig.Tracer = cc
	pc.MaxConns = conns
	pool, err := pgxpool.NewWithConfig(context.Background(), pc)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(pool.Close)
	return pool, cc
}

// writeThenFailOnce wraps h so that its first run of each message in fail writes
// its row and then fails (the row must roll back with it).
func writeThenFailOnce(h inbox.Handler, fail ...string) inbox.Handler {
	var mu sync.Mutex
	failed := map[string]bool{}
	return func(ctx context.Context, tx pgx.Tx, m *inbox.Message) error {
		if err := h(ctx, tx, m); err != nil {
			return err
		}
		id := fmt.Sprintf("%s/%d", m.CorrelationID, m.KeySeq)
		mu.Lock()
		defer mu.Unlock()
		if slices.Contains(fail, id) && !failed[id] {
			failed[id] = true
			return errors.New("fails once: " + id)
		}
		return nil
	}
}

// TestBatchFailureRollsBackAlone: in one batch (one COMMIT), a handler
// that writes its row and then fails is rolled back to its savepoint
// alone: the others are committed once, the failure is stored for a
// retry (and the key's later message behind it), and the retry handles
// both in order. The same batch delivered again after its commit (a
// crash before the acks: the broker redelivers it, flagged) is dropped
// whole as duplicates.
func TestBatchFailureRollsBackAlone(t *testing.T) {
	pool, cc := countedPool(t, 4)
	cfg := inbox.LocalConfig("t")
	cfg.BatchTime = time.Minute // the whole batch in one transaction
	s := newStore(t, cfg, pool, nil)
	h := writeThenFailOnce(recordHandler(""), "b/1")
	ctx := testkit.Context(t, 30*time.Second)
	batch := func() []*inbox.Message {
		return []*inbox.Message{msg("a", 1, 0), msg("b", 1, 0), msg("c", 1, 0), msg("a", 2, 0), msg("b", 2, 0)}
	}
	commits := cc.commits.Load()
	outs, errs, err := inbox.HandleBatch(ctx, s, inbox.Fence{}, batch(), h)
	if err != nil {
		t.Fatal(err)
	}
	want := []inbox.Outcome{inbox.Handled, inbox.Retrying, inbox.Handled, inbox.Handled, inbox.Stored}
	if !slices.Equal(outs, want) || errors.Join(errs...) != nil {
		t.Fatalf("outcomes %v %v, want %v", outs, errs, want)
	}
	if n := cc.commits.Load() - commits; n != 1 {
		t.Fatalf("%d commits for the batch, want 1", n)
	}
	checkOnceInOrder(t, handledSeqs(t, pool), map[string]int64{"a": 2, "c": 1})
	testkit.WaitFor(t, 10*time.Second, "b retried", func() bool {
		if _, err := s.RetryDue(ctx, inbox.Fence{}, 0, 10, h); err != nil {
			t.Fatal(err)
		}
		return len(handledSeqs(t, pool)["b"]) == 2
	})
	checkOnceInOrder(t, handledSeqs(t, pool), map[string]int64{"a": 2, "b": 2, "c": 1})
	// A transaction's first message has no savepoint: when it fails, the
	// transaction rolls back, the failure is stored on its own, and the
	// batch ends there.
	h = writeThenFailOnce(recordHandler(""), "x/1")
	outs, _, err = inbox.HandleBatch(ctx, s, inbox.Fence{}, []*inbox.Message{msg("x", 1, 0), msg("y", 1, 0)}, h)
	if err != nil || !slices.Equal(outs, []inbox.Outcome{inbox.Retrying}) {
		t.Fatalf("a batch whose first message fails: %v %v, want [retrying] alone", outs, err)
	}
	if outs, _, err = inbox.HandleBatch(ctx, s, inbox.Fence{}, []*inbox.Message{msg("y", 1, 0)}, h); err != nil || outs[0] != inbox.Handled {
		t.Fatalf("the rest of that batch: %v %v", outs, err)
	}
	testkit.WaitFor(t, 10*time.Second, "x retried", func() bool {
		if _, err := s.RetryDue(ctx, inbox.Fence{}, 0, 10, h); err != nil {
			t.Fatal(err)
		}
		return len(handledSeqs(t, pool)["x"]) == 1
	})
	checkOnceInOrder(t, handledSeqs(t, pool), map[string]int64{"a": 2, "b": 2, "c": 1, "x": 1, "y": 1})
	again := batch()
	for _, m := range again {
		m.Redelivered = true
	}
	outs, _, err = inbox.HandleBatch(ctx, s, inbox.Fence{}, again, h)
	if err != nil {
		t.Fatal(err)
	}
	if slices.ContainsFunc(outs, func(o inbox.Outcome) bool { return o != inbox.Duplicate }) {
		t.Fatalf("the batch redelivered after its commit: %v, want every one a duplicate", outs)
	}
	checkOnceInOrder(t, handledSeqs(t, pool), map[string]int64{"a": 2, "b": 2, "c": 1, "x": 1, "y": 1})
}

// TestBatchFenceRefusesWholeBatch: the lease moves while a batch is in
// its transaction, after its first messages passed the fence: the next
// fenced write refuses the whole batch, and nothing of it is committed,
// the messages handled before the move included. Both paths: a batch
// with a gap in it (the per-message path, a fenced write per message)
// and one whose messages are all next (the fast path, one fenced advance).
func TestBatchFenceRefusesWholeBatch(t *testing.T) {
	for _, tc := range []struct {
		name   string
		ms     []*inbox.Message
		queued bool
	}{
		{"per-message path", []*inbox.Message{msg("k", 1, 0), msg("g", 2, 0), msg("move", 1, 0), msg("j", 1, 0)}, false},
		{"fast path", []*inbox.Message{msg("k", 1, 0), msg("g", 1, 0), msg("move", 1, 0), msg("j", 1, 0)}, false},
		{"fast path, queued", []*inbox.Message{msg("k", 1, 0), msg("g", 1, 0), msg("move", 1, 0), msg("j", 1, 0)}, true},
	} {
		t.Run(tc.name, func(t *testing.T) { batchAcrossLeaseMove(t, tc.ms, tc.queued) })
	}
}

// batchAcrossLeaseMove handles ms as one batch under a lease that moves
// while the handler of the message of key "move" runs (queued: queues
// its statements, with the Store's QueueHandler).
func batchAcrossLeaseMove(t *testing.T, ms []*inbox.Message, queued bool) {
	_, pool := newDB(t)
	cfg := inbox.LocalConfig("t")
	cfg.BatchTime = time.Minute
	s := newStore(t, cfg, pool, nil)
	ctx := testkit.Context(t, 30*time.Second)
	if _, err := pool.Exec(ctx, `INSERT INTO ordo_inbox_leases (consumer, shard, owner, epoch, expires_at)
		VALUES ('t', 0, 'a', 1, now() + interval '1 minute')`); err != nil {
		t.Fatal(err)
	}
	// Another instance takes the lease when "move" is handled, on a
	// connection of its own (a plain update of non-key columns does not
	// wait for the batch's FOR KEY SHARE lock on the row).
	move := func(ctx context.Context, m *inbox.Message) error {
		if m.CorrelationID != "move" {
			return nil
		}
		_, err := pool.Exec(ctx, `UPDATE ordo_inbox_leases SET owner = 'b', epoch = 2 WHERE consumer = 't' AND shard = 0`)
		return err
	}
	rec := recordHandler("a")
	h := func(ctx context.Context, tx pgx.Tx, m *inbox.Message) error {
		if err := move(ctx, m); err != nil {
			return err
		}
		return rec(ctx, tx, m)
	}
	if queued {
		recq := recordQueue("a")
		q := inbox.QueueHandler(func(ctx context.Context, m *inbox.Message, b *pgx.Batch) error {
			if err := move(ctx, m); err != nil {
				return err
			}
			return recq(ctx, m, b)
		})
		inbox.SetQueue(s, q)
		h = q.Handler()
	}
	f := inbox.Fence{Shard: 0, Owner: "a", Epoch: 1}
	_, _, err := inbox.HandleBatch(ctx, s, f, ms, h)
	if !errors.Is(err, inbox.ErrFenced) {
		t.Fatalf("batch across a lease move: %v, want ErrFenced", err)
	}
	if got := handledSeqs(t, pool); len(got) != 0 {
		t.Fatalf("a fenced batch committed handler writes: %v", got)
	}
	var keys, stored int
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM ordo_inbox_keys), (SELECT count(*) FROM ordo_inbox_messages)`).
		Scan(&keys, &stored); err != nil || keys != 0 || stored != 0 {
		t.Fatalf("a fenced batch left %d key rows and %d stored messages (%v)", keys, stored, err)
	}
	if st := s.Stats(); st.Fenced != 1 || st.Handled != 0 {
		t.Fatalf("stats %+v: want 1 fenced, none handled", st)
	}
}

// TestBatchInvalidDataAlone: a message whose data PostgreSQL refuses
// (SQLSTATE class 22) in a batch is rolled back to its savepoint and
// reported invalid; the batch's other messages commit, its key included.
func TestBatchInvalidDataAlone(t *testing.T) {
	_, pool := newDB(t)
	cfg := inbox.LocalConfig("t")
	cfg.BatchTime = time.Minute
	s := newStore(t, cfg, pool, nil)
	ctx := testkit.Context(t, 30*time.Second)
	bad := msg("k", 1, 0)
	bad.Timestamp = time.Date(300000, 1, 1, 0, 0, 0, 0, time.UTC)
	outs, errs, err := inbox.HandleBatch(ctx, s, inbox.Fence{}, []*inbox.Message{msg("a", 1, 0), bad, msg("k", 1, 0), msg("a", 2, 0)}, recordHandler(""))
	if err != nil {
		t.Fatal(err)
	}
	if !errors.Is(errs[1], inbox.ErrInvalidMessage) || outs[1] != 0 {
		t.Fatalf("the bad message: %v %v, want ErrInvalidMessage", outs[1], errs[1])
	}
	if want := []inbox.Outcome{inbox.Handled, 0, inbox.Handled, inbox.Handled}; !slices.Equal(outs, want) {
		t.Fatalf("outcomes %v, want %v", outs, want)
	}
	checkOnceInOrder(t, handledSeqs(t, pool), map[string]int64{"a": 2, "k": 1})
}

// TestBatchTimeBoundsHandlers: a batch stops taking messages once its
// handlers have run BatchTime; the rest are left to the caller. A
// QueueHandler's runs count as a Handler's.
func TestBatchTimeBoundsHandlers(t *testing.T) {
	for _, queued := range []bool{false, true} {
		t.Run(fmt.Sprintf("queued=%v", queued), func(t *testing.T) {
			_, pool := newDB(t)
			cfg := inbox.LocalConfig("t")
			cfg.BatchTime = 30 * time.Millisecond
			s := newStore(t, cfg, pool, nil)
			ctx := testkit.Context(t, 30*time.Second)
			h := sleepRecord(40 * time.Millisecond)
			if queued {
				rec := recordQueue("a")
				q := inbox.QueueHandler(func(ctx context.Context, m *inbox.Message, b *pgx.Batch) error {
					select {
					case <-ctx.Done():
						return ctx.Err()
					case <-time.After(40 * time.Millisecond):
					}
					return rec(ctx, m, b)
				})
				inbox.SetQueue(s, q)
				h = q.Handler()
			}
			outs, _, err := inbox.HandleBatch(ctx, s, inbox.Fence{}, []*inbox.Message{msg("a", 1, 0), msg("b", 1, 0), msg("c", 1, 0)}, h)
			if err != nil {
				t.Fatal(err)
			}
			if len(outs) != 1 {
				t.Fatalf("%d messages in a batch whose first handler outlasted BatchTime, want 1", len(outs))
			}
			checkOnceInOrder(t, handledSeqs(t, pool), map[string]int64{"a": 1})
		})
	}
}

// TestGroupCommitThroughConsumer: a backlog on one shard, drained by a
// consumer with 2 lanes and a handler that fails once on some messages
// (a key's first among them) and panics once on one: every message is
// handled once, in key order, no key ever has two handlers at once, and
// the deliveries share commits (fewer COMMITs than messages handled).
func TestGroupCommitThroughConsumer(t *testing.T) {
	pool, cc := countedPool(t, 6)
	cfg, want := backlogOnOneShard(t)
	var panicked atomic.Bool
	rec := writeThenFailOnce(recordHandler("a"), "k03/1", "k07/2", "k11/5", "k20/3")
	h := func(ctx context.Context, tx pgx.Tx, m *inbox.Message) error {
		if m.CorrelationID == "k30" && m.KeySeq == 2 && panicked.CompareAndSwap(false, true) {
			panic("handler panics once")
		}
		return rec(ctx, tx, m)
	}
	w := newKeyWatch()
	commits := cc.commits.Load()
	r := startConsumer(t, cfg, "a", pool, w.wrap(h))
	waitHandled(t, pool, want)
	checkOnceInOrder(t, handledSeqs(t, pool), want)
	w.mu.Lock()
	problems := w.problems
	w.mu.Unlock()
	if len(problems) > 0 {
		t.Fatalf("per-key violations: %v", problems[:min(5, len(problems))])
	}
	checkSharedCommits(t, r, cc.commits.Load()-commits, 5)
}

// backlogOnOneShard publishes 40 keys × 5 messages to a consumer group
// of one shard whose instances run 2 lanes, before any instance runs (so
// that the backlog is queued, and delivered in prefetched batches when
// one attaches). It returns the group's config and each key's last seq.
func backlogOnOneShard(t *testing.T) (inbox.Config, map[string]int64) {
	t.Helper()
	cfg := consumerConfig(t, 1)
	cfg.Lanes = 2
	pub := newPublisher(t, cfg.Exchange)
	testkit.WithChannel(t, inbox.TopologyOf(cfg).Declare)
	want := map[string]int64{}
	for s := 1; s <= 5; s++ {
		for k := range 40 {
			key := fmt.Sprintf("k%02d", k)
			pub.publish(key, int64(s))
			want[key] = int64(s)
		}
	}
	return cfg, want
}

// checkSharedCommits fails t unless r retried at least the failures
// injected and its deliveries shared the commits it made.
func checkSharedCommits(t *testing.T, r *running, commits int64, injected int64) {
	t.Helper()
	// A delivery is counted once its transaction committed, and a retry
	// of it can be handled (and seen handled) before that count: wait for
	// the counts to catch up with what the database shows.
	var st inbox.Stats
	testkit.WaitFor(t, 10*time.Second, fmt.Sprintf("at least the %d injected failures counted as retries", injected), func() bool {
		st = r.c.Stats()
		return st.Retries >= injected
	})
	t.Logf("%d handled, %d retries, %d commits in all", st.Handled, st.Retries, commits)
	if commits >= st.Handled*3/4 {
		t.Fatalf("%d commits for %d handled messages: the deliveries did not share commits", commits, st.Handled)
	}
}

// TestStopFinishesTransactionNotBatch: a worker told to stop with a
// lane's batch in hand whose handlers are slower than BatchTime (a
// transaction each) finishes the transaction in hand and leaves the rest
// unacknowledged for the next owner, rather than handling the whole
// batch first: a handoff waits for one handler, not sixteen. What it
// handled is handled once, in order, and the rest are handled by a
// second instance started after it.
func TestStopFinishesTransactionNotBatch(t *testing.T) {
	_, pool := newDB(t)
	cfg := consumerConfig(t, 1)
	cfg.Lanes = 1
	pub := newPublisher(t, cfg.Exchange)
	testkit.WithChannel(t, inbox.TopologyOf(cfg).Declare)
	for s := 1; s <= 20; s++ {
		pub.publish("k", int64(s))
	}
	const delay = 200 * time.Millisecond
	r := startConsumer(t, cfg, "a", pool, sleepRecord(delay))
	testkit.WaitFor(t, 30*time.Second, "the first handled", func() bool { return len(handledSeqs(t, pool)["k"]) >= 1 })
	start := time.Now()
	r.stop(t)
	took := time.Since(start)
	n := len(handledSeqs(t, pool)["k"])
	t.Logf("stopped in %v with %d of 20 handled", took, n)
	if took > 8*delay {
		t.Fatalf("stopping took %v: the worker handled its batch (%d handled) instead of the transaction in hand", took, n)
	}
	startConsumer(t, cfg, "b", pool, recordHandler("b"))
	waitHandled(t, pool, map[string]int64{"k": 20})
	checkOnceInOrder(t, handledSeqs(t, pool), map[string]int64{"k": 20})
}
