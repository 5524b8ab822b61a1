package inbox_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ordo-relay/ordo/inbox"
	"github.com/ordo-relay/ordo/internal/testkit"
)

// tripCounter counts the statements a pool sends, each its own round
// trip (the Store sends no batches).
type tripCounter struct{ n atomic.Int64 }

func (c *tripCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}

func (c *tripCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TestHandleRoundTrips: handling the next message of a key, new or not,
// takes five round trips, the handler's one included: BEGIN, the
// decision (which creates a new key's row), the handler's insert, the
// advance (which says whether stored messages are left to follow), COMMIT.
// A gap stored and then filled is followed at once.
func TestHandleRoundTrips(t *testing.T) {
	url, _ := newDB(t)
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	trips := &tripCounter{}
	pc.ConnConfig.Tracer = trips
	pool, err := pgxpool.NewWithConfig(context.Background(), pc)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
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
		if n := trips.n.Load() - before; n != 5 {
			t.Errorf("%s: %d round trips, want 5", tc.name, n)
		}
	}
	handle(t, s, inbox.Fence{}, msg("a", 4, 0), h)
	handle(t, s, inbox.Fence{}, msg("a", 3, 0), h)
	checkOnceInOrder(t, handledSeqs(t, pool), map[string]int64{"warm": 2, "a": 4})
}
