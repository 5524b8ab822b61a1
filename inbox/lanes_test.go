package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ordo-relay/ordo/inbox"
	"github.com/ordo-relay/ordo/internal/testkit"
)

// keyWatch wraps a handler and records, per key, any two handler runs of
// one key that overlap, any key_seq run before its predecessor, and the
// most runs of different keys in progress at once.
type keyWatch struct {
	mu        sync.Mutex
	running   map[string]bool
	last      map[string]int64 // the highest key_seq whose run returned nil
	now, peak int
	problems  []string
}

func newKeyWatch() *keyWatch {
	return &keyWatch{running: map[string]bool{}, last: map[string]int64{}}
}

func (w *keyWatch) wrap(h inbox.Handler) inbox.Handler {
	return func(ctx context.Context, tx pgx.Tx, m *inbox.Message) (err error) {
		w.enter(m)
		panicked := true
		defer func() {
			if panicked {
				err = errors.New("handler panicked") // the panic goes on to the inbox
			}
			w.leave(m, err)
		}()
		err = h(ctx, tx, m)
		panicked = false
		return err
	}
}

func (w *keyWatch) enter(m *inbox.Message) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.running[m.CorrelationID] {
		w.problems = append(w.problems, fmt.Sprintf("%s/%d started while another message of its key ran", m.CorrelationID, m.KeySeq))
	}
	if m.KeySeq > w.last[m.CorrelationID]+1 {
		w.problems = append(w.problems, fmt.Sprintf("%s/%d started before %s/%d was handled", m.CorrelationID, m.KeySeq, m.CorrelationID, w.last[m.CorrelationID]+1))
	}
	w.running[m.CorrelationID] = true
	w.now++
	w.peak = max(w.peak, w.now)
}

func (w *keyWatch) leave(m *inbox.Message, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.running[m.CorrelationID] = false
	w.now--
	if err == nil {
		w.last[m.CorrelationID] = max(w.last[m.CorrelationID], m.KeySeq)
	}
}

func (w *keyWatch) check(tb testing.TB, lanes int) {
	tb.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.problems) > 0 {
		tb.Fatalf("%d per-key violations, first: %v", len(w.problems), w.problems[:min(5, len(w.problems))])
	}
	// Without concurrency the test would prove nothing about lanes.
	if w.peak < 2 || w.peak > lanes {
		tb.Fatalf("at most %d handlers ran at once, want 2..%d (Lanes)", w.peak, lanes)
	}
	tb.Logf("up to %d handlers at once", w.peak)
}

// sleepRecord is recordHandler after d of simulated work.
func sleepRecord(d time.Duration) inbox.Handler {
	rec := recordHandler("a")
	return func(ctx context.Context, tx pgx.Tx, m *inbox.Message) error {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(d):
		}
		return rec(ctx, tx, m)
	}
}

// publishRuns publishes keys × n messages, each key's n one after
// another (so that deliveries next to each other are mostly of one key,
// which a lane rule that did not serialise keys would run at once), and
// returns what should be handled.
func publishRuns(pub *publisher, keys, n int) map[string]int64 {
	want := map[string]int64{}
	for k := range keys {
		key := fmt.Sprintf("k%02d", k)
		for s := range n {
			pub.publish(key, int64(s+1))
		}
		want[key] = int64(n)
	}
	return want
}

// lanesDB is newDB with a pool large enough for one shard's lanes.
func lanesDB(tb testing.TB) *pgxpool.Pool {
	tb.Helper()
	_, pool := newDB(tb)
	return pool
}

// TestLanesKeepEachKeySerialInOrder: with Lanes 4 on one shard, keys are
// handled concurrently (up to 4 at once) while no key ever has two
// handlers running at once, or one run before its predecessor was
// handled; every message is handled once, in order, and as the
// deliveries of a key are in order, none is stored as a gap. In Partial
// mode the lanes are the only thing keeping a key's order (the inbox
// handles any key_seq above the last at once), so this test fails if the
// lanes let two deliveries of one key run at once.
func TestLanesKeepEachKeySerialInOrder(t *testing.T) {
	for _, mode := range []inbox.Mode{inbox.Ordered, inbox.Partial} {
		t.Run(mode.String(), func(t *testing.T) {
			pool := lanesDB(t)
			cfg := consumerConfig(t, 1)
			cfg.Mode, cfg.Lanes = mode, 4
			w := newKeyWatch()
			r := startConsumer(t, cfg, "a", pool, w.wrap(sleepRecord(5*time.Millisecond)))
			testkit.WaitFor(t, 30*time.Second, "shard owned", func() bool { return len(r.c.Owned()) == 1 })
			want := publishRuns(newPublisher(t, cfg.Exchange), 12, 8)
			// Every delivery settled: handled, or dropped (which, with no
			// redelivery, only a key run out of order does).
			testkit.WaitFor(t, 30*time.Second, "96 messages settled", func() bool {
				st := r.c.Stats()
				return st.Handled+st.Duplicates >= 96
			})
			checkOnceInOrder(t, handledSeqs(t, pool), want)
			w.check(t, cfg.Lanes)
			if st := r.c.Stats(); st.GapsStored != 0 || st.Handled != 96 {
				t.Fatalf("stats %+v: want 96 handled and no gap (deliveries were in order)", st)
			}
		})
	}
}

// TestLanesRetryKeepsOrder: handler failures (the first attempt of every
// key's 1st and 3rd message, and a panic on the 5th) with Lanes 4: each
// key still runs serially and in order, and every message is handled
// once.
func TestLanesRetryKeepsOrder(t *testing.T) {
	pool := lanesDB(t)
	cfg := consumerConfig(t, 1)
	cfg.Lanes = 4
	var mu sync.Mutex
	tried := map[string]bool{}
	// Handlers long enough to be most of the lanes' time even on a loaded
	// machine: with 2 ms ones the gate (gate.go) once saw the inbox's own
	// statements dominate, halved the lanes to 1, and the test saw no
	// concurrency to check.
	inner := sleepRecord(20 * time.Millisecond)
	flaky := func(ctx context.Context, tx pgx.Tx, m *inbox.Message) error {
		id := fmt.Sprintf("%s/%d", m.CorrelationID, m.KeySeq)
		mu.Lock()
		first := !tried[id]
		tried[id] = true
		mu.Unlock()
		switch {
		case first && (m.KeySeq == 1 || m.KeySeq == 3):
			return errors.New("transient")
		case first && m.KeySeq == 5:
			panic("transient panic")
		}
		return inner(ctx, tx, m)
	}
	w := newKeyWatch()
	r := startConsumer(t, cfg, "a", pool, w.wrap(flaky))
	testkit.WaitFor(t, 30*time.Second, "shard owned", func() bool { return len(r.c.Owned()) == 1 })
	want := publishRuns(newPublisher(t, cfg.Exchange), 10, 6)
	waitHandled(t, pool, want)
	checkOnceInOrder(t, handledSeqs(t, pool), want)
	w.check(t, cfg.Lanes)
	if st := r.c.Stats(); st.Retries < 10 {
		t.Fatalf("stats %+v: want at least 10 retries", st)
	}
}

// TestLanesShardLossWaitsForLanes: a shard whose lease is taken over
// while its 4 lanes are each in a handler keeps counting as owned until
// every lane has finished; none of their commits goes through (the
// fence refuses them), and nothing is handled.
func TestLanesShardLossWaitsForLanes(t *testing.T) {
	pool := lanesDB(t)
	cfg := consumerConfig(t, 1)
	cfg.Lanes = 4
	var (
		inFlight atomic.Int32
		stolen   = make(chan struct{})
		c        atomic.Pointer[inbox.Consumer]
		mu       sync.Mutex
		early    []string
	)
	h := func(ctx context.Context, tx pgx.Tx, m *inbox.Message) error {
		inFlight.Add(1)
		defer inFlight.Add(-1)
		select {
		case <-stolen:
		case <-ctx.Done():
			return ctx.Err()
		}
		// Give the lease loop three renewals to notice the loss; the
		// shard must stay owned while this lane is still running.
		deadline := time.Now().Add(cfg.LeaseTTL)
		for time.Now().Before(deadline) {
			if !slices.Contains(c.Load().Owned(), 0) {
				mu.Lock()
				early = append(early, fmt.Sprintf("%s/%d", m.CorrelationID, m.KeySeq))
				mu.Unlock()
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		return recordHandler("a")(ctx, tx, m)
	}
	r := startConsumer(t, cfg, "a", pool, h)
	c.Store(r.c)
	testkit.WaitFor(t, 30*time.Second, "shard owned", func() bool { return len(r.c.Owned()) == 1 })
	publishRuns(newPublisher(t, cfg.Exchange), 8, 2)
	testkit.WaitFor(t, 30*time.Second, "4 lanes in a handler", func() bool { return inFlight.Load() == 4 })
	ctx := testkit.Context(t, 30*time.Second)
	if _, err := pool.Exec(ctx, `UPDATE ordo_inbox_leases SET owner = 'thief', epoch = epoch + 1,
		expires_at = now() + interval '1 hour' WHERE consumer = $1`, cfg.Name); err != nil {
		t.Fatal(err)
	}
	close(stolen)
	testkit.WaitFor(t, 30*time.Second, "shard given up", func() bool { return len(r.c.Owned()) == 0 })
	if n := inFlight.Load(); n != 0 {
		t.Fatalf("shard given up with %d handlers still running", n)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(early) > 0 {
		t.Fatalf("shard given up while lanes still ran: %v", early)
	}
	if got := handledSeqs(t, pool); len(got) != 0 {
		t.Fatalf("handled under a lost lease: %v", got)
	}
}

// TestLanesLeavePoolConnectionsForLeases: with more lanes than the pool
// has connections (Lanes 8, a pool of 6), at most 6 − 2 handlers run at
// once, so the lease loop always finds a connection.
func TestLanesLeavePoolConnectionsForLeases(t *testing.T) {
	pool := lanesDB(t)
	cfg := consumerConfig(t, 1)
	cfg.Lanes = 8
	w := newKeyWatch()
	r := startConsumer(t, cfg, "a", pool, w.wrap(sleepRecord(20*time.Millisecond)))
	testkit.WaitFor(t, 30*time.Second, "shard owned", func() bool { return len(r.c.Owned()) == 1 })
	want := publishRuns(newPublisher(t, cfg.Exchange), 40, 1)
	waitHandled(t, pool, want)
	checkOnceInOrder(t, handledSeqs(t, pool), want)
	w.check(t, int(pool.Stat().MaxConns())-2)
}

// TestLanesAtWorkFollowTheHandlers: an instance's cap on lanes at work
// (ordo_inbox_lanes_limit) stays at 1 while its handlers do nothing, so
// one lane's batches take every key ready, and rises to the pool's
// connections less 2 while its handlers wait, so that they wait
// together.
func TestLanesAtWorkFollowTheHandlers(t *testing.T) {
	for _, c := range []struct {
		name string
		h    inbox.Handler
		want func(limit, most int) bool
	}{
		{"no work", func(context.Context, pgx.Tx, *inbox.Message) error { return nil },
			func(limit, _ int) bool { return limit == 1 }},
		{"waits 30ms", sleepRecord(30 * time.Millisecond),
			func(limit, most int) bool { return limit == most }},
	} {
		t.Run(c.name, func(t *testing.T) {
			pool := lanesDB(t)
			most := int(pool.Stat().MaxConns()) - 2
			cfg := consumerConfig(t, 1)
			cfg.Lanes = 8
			r := startConsumer(t, cfg, "a", pool, c.h)
			testkit.WaitFor(t, 30*time.Second, "shard owned", func() bool { return len(r.c.Owned()) == 1 })
			publishRuns(newPublisher(t, cfg.Exchange), 40, 5)
			var peak int
			testkit.WaitFor(t, 60*time.Second, "200 messages handled", func() bool {
				st := r.c.Stats()
				peak = max(peak, st.LaneLimit)
				return st.Handled >= 200
			})
			if st := r.c.Stats(); !c.want(st.LaneLimit, most) {
				t.Fatalf("lanes limit %d (peak %d) after 200 messages, pool of %d for lanes", st.LaneLimit, peak, most)
			}
			t.Logf("lanes limit %d (peak %d), pool of %d for lanes", r.c.Stats().LaneLimit, peak, most)
		})
	}
}
