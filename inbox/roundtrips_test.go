package inbox_test

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ordo-relay/ordo/inbox"
	"github.com/ordo-relay/ordo/internal/testkit"
)

// tripCounter counts the round trips a pool takes: a statement on its
// own, or a batch of them.
type tripCounter struct{ n atomic.Int64 }

func (c *tripCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	c.n.Add(1)
	return ctx
}

func (c *tripCounter) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

func (c *tripCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

func (c *tripCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}

func (c *tripCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// tripPool is newDB's database through a pool of at most conns
// connections (0: pgx's default) whose round trips trips counts.
func tripPool(tb testing.TB, conns int32) (*pgxpool.Pool, *tripCounter) {
	tb.Helper()
	url, _ := newDB(tb)
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		tb.Fatal(err)
	}
	trips := &tripCounter{}
	pc.ConnConfig.Tracer = trips
	if conns > 0 {
		pc.MaxConns = conns
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), pc)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(pool.Close)
	return pool, trips
}

// TestHandleRoundTrips: handling the next message of a key, new or not,
// takes four round trips, the handler's one included: BEGIN with the
// decision (which creates a new key's row) in one batch, the handler's
// insert, the advance (which says whether stored messages are left to
// follow), COMMIT.
// A gap stored and then filled is followed at once.
func TestHandleRoundTrips(t *testing.T) {
	pool, trips := tripPool(t, 0)
	s := newStore(t, inbox.LocalConfig("t"), pool, nil)
	h := recordHandler("")
	ctx := testkit.Context(t, 30*time.Second)
	if err := pool.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	for _, m := range []*inbox.Message{msg("warm", 1, 0), msg("warm", 2, 0)} {
		handle(t, s, inbox.Fence{}, m, h) // prepares the statements on the connection
	}
	for _, tc := range []struct {
		name string
		m    *inbox.Message
	}{{"a new key's first message", msg("a", 1, 0)}, {"its second", msg("a", 2, 0)}} {
		before := trips.n.Load()
		if out := handle(t, s, inbox.Fence{}, tc.m, h); out != inbox.Handled {
			t.Fatalf("%s: %v", tc.name, out)
		}
		if n := trips.n.Load() - before; n != 4 {
			t.Errorf("%s: %d round trips, want 4", tc.name, n)
		}
	}
	handle(t, s, inbox.Fence{}, msg("a", 4, 0), h)
	handle(t, s, inbox.Fence{}, msg("a", 3, 0), h)
	checkOnceInOrder(t, handledSeqs(t, pool), map[string]int64{"warm": 2, "a": 4})
}

// TestBatchRoundTrips: a batch whose messages are all their keys' next,
// new keys and known ones, two of one key among them, takes three round
// trips besides its handlers' statements, whatever its size: BEGIN and
// one decision for all in one batch, one advance for all, COMMIT. A batch with a gap in
// it takes the per-message path and still ends right: the gap stored
// and the rest handled.
func TestBatchRoundTrips(t *testing.T) {
	pool, trips := tripPool(t, 1) // one connection: its statements prepared once
	cfg := inbox.LocalConfig("t")
	cfg.BatchTime = time.Minute
	s := newStore(t, cfg, pool, nil)
	h := recordHandler("")
	ctx := testkit.Context(t, 30*time.Second)
	batch := batcher(t, s, h)
	batch(msg("warm", 1, 0), msg("warm", 2, 0))
	for _, tc := range []struct {
		name string
		ms   []*inbox.Message
	}{
		{"new keys", []*inbox.Message{msg("a", 1, 0), msg("b", 1, 0), msg("a", 2, 0), msg("c", 1, 0)}},
		{"known keys and a duplicate", []*inbox.Message{msg("a", 3, 0), msg("b", 2, 0), msg("b", 1, 0), msg("c", 2, 0), msg("d", 1, 0), msg("a", 4, 0)}},
	} {
		before := trips.n.Load()
		outs := batch(tc.ms...)
		handled := 0
		for _, o := range outs {
			if o == inbox.Handled {
				handled++
			}
		}
		if len(outs) != len(tc.ms) {
			t.Fatalf("%s: %d outcomes for %d messages", tc.name, len(outs), len(tc.ms))
		}
		if n := trips.n.Load() - before; n != int64(3+handled) {
			t.Errorf("%s: %d round trips for %d handled, want %d", tc.name, n, handled, 3+handled)
		}
	}
	if outs := batch(msg("e", 1, 0), msg("a", 6, 0), msg("b", 3, 0)); !slices.Equal(outs, []inbox.Outcome{inbox.Handled, inbox.Stored, inbox.Handled}) {
		t.Fatalf("a batch with a gap: %v, want handled, stored, handled", outs)
	}
	if outs := batch(msg("a", 5, 0), msg("e", 2, 0)); !slices.Equal(outs, []inbox.Outcome{inbox.Handled, inbox.Handled}) {
		t.Fatalf("the gap filled: %v", outs)
	}
	want := map[string]int64{"warm": 2, "a": 5, "b": 3, "c": 2, "d": 1, "e": 2}
	checkOnceInOrder(t, handledSeqs(t, pool), want)
	var stored int64
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM ordo_inbox_messages WHERE correlation_id = 'a' AND key_seq = 6`).Scan(&stored); err != nil || stored != 1 {
		t.Fatalf("a/6 stored %d times (%v), want once, waiting for the Consumer's follow-up", stored, err)
	}
}

// batcher returns a function that handles its messages as one batch of
// s with h, and returns their outcomes; an error fails t.
func batcher(t *testing.T, s *inbox.Store, h inbox.Handler) func(ms ...*inbox.Message) []inbox.Outcome {
	ctx := testkit.Context(t, 30*time.Second)
	return func(ms ...*inbox.Message) []inbox.Outcome {
		t.Helper()
		outs, errs, err := inbox.HandleBatch(ctx, s, inbox.Fence{}, ms, h)
		if err != nil || errors.Join(errs...) != nil {
			t.Fatalf("batch: %v %v", err, errs)
		}
		return outs
	}
}
