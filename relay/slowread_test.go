package relay_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/relay"
	"github.com/ordo-relay/ordo/relay/relaytest"
)

// TestCoreSlowRowIsReadAlone: a row whose every read outlasts the read
// timeout (a huge payload) stalls only its own partition: the read of
// every partition times out, splits, and the other partitions flow; the
// row, read alone a row at a time, still times out, is charged an attempt
// per timeout (peeked at without its payload) and parks after
// MaxAttempts; then its partition's other keys flow too, and its key's
// next row waits for an operator.
func TestCoreSlowRowIsReadAlone(t *testing.T) {
	c := newCore(t, 0, func(cfg *relay.Config) {
		cfg.ReadTimeout, cfg.MaxAttempts = 100*time.Millisecond, 3
	})
	// Partition 1's first row is slow; the rest of partition 1 sits behind it.
	slow := c.store.Insert(1, "big", "big")
	c.store.SetSlowRow(slow[0], time.Hour)
	ids := c.insert(12, 3) // keys 1, 5 and 9 in partition 1
	c.start()
	testkit.WaitFor(t, waitTimeout, "the other partitions drained", c.marked(ids, 1))
	testkit.WaitFor(t, waitTimeout, "the slow row parked", func() bool { r, _ := c.store.Get(slow[0]); return r.Parked })
	testkit.WaitFor(t, waitTimeout, "every other row marked", c.marked(ids, -1))
	head, _ := c.store.Get(slow[0])
	next, _ := c.store.Get(slow[1])
	if head.Attempts != 3 || !strings.Contains(head.LastError, "longer than the read timeout (100ms)") {
		t.Fatalf("slow row: %d attempts (want 3), last error %q", head.Attempts, head.LastError)
	}
	if next.Processed || next.Attempts != 0 {
		t.Fatalf("the parked key's next row: processed %v, %d attempts (want pending, untried)", next.Processed, next.Attempts)
	}
	for _, m := range c.pub.Sent() {
		if m.CorrelationID == "big" {
			t.Fatalf("a row of the slow key was published: %+v", m)
		}
	}
	if err := relaytest.CheckOrder(c.pub.Delivered()); err != nil {
		t.Fatal(err)
	}
	if st := c.r.Stats(); st.SlowRows != 3 || st.SlowReads < 4 {
		t.Fatalf("%d slow reads (want 4 or more), %d rows charged (want 3)", st.SlowReads, st.SlowRows)
	}
}

// TestCoreNoConnectionIsNotASlowRead: a read that runs out of time waiting
// for a database connection (a server slow to take connections after a
// restart) says nothing of the rows it asked for: the relay
// backs off, splits nothing and charges nothing, and once connections
// come it reads the partitions together and drains them. (Taken for a
// slow read, it split every partition to be read alone, in turns, each
// read waiting for a connection.)
func TestCoreNoConnectionIsNotASlowRead(t *testing.T) {
	c := newCore(t, 0, func(cfg *relay.Config) { cfg.ReadTimeout = 50 * time.Millisecond })
	s := &noConnStore{Store: c.store.ForNode(c.cfg.Node)}
	s.down.Store(true)
	c.withStore(s)
	ids := c.insert(12, 3)
	c.start()
	testkit.WaitFor(t, waitTimeout, "reads that waited for a connection", func() bool { return s.waited.Load() >= 5 })
	s.down.Store(false)
	testkit.WaitFor(t, waitTimeout, "every row marked", c.marked(ids, -1))
	if st := c.r.Stats(); st.SlowReads != 0 || st.SlowRows != 0 {
		t.Fatalf("%d slow reads, %d rows charged after %d reads that waited for a connection (want none)",
			st.SlowReads, st.SlowRows, s.waited.Load())
	}
}

// noConnStore is a Store whose reads, while down, wait for a connection
// until their context ends, as pgstore's do when the pool cannot connect
// in time.
type noConnStore struct {
	relay.Store
	down   atomic.Bool
	waited atomic.Int64
}

func (s *noConnStore) ReadPending(ctx context.Context, cursors []relay.Cursor, limit int) ([]relay.Row, error) {
	if s.down.Load() {
		<-ctx.Done()
		s.waited.Add(1)
		return nil, fmt.Errorf("read pending rows: %w: %w", relay.ErrNoConnection, ctx.Err())
	}
	return s.Store.ReadPending(ctx, cursors, limit)
}

// marked reports whether every row of ids outside partition except is marked.
func (c *core) marked(ids []uuid.UUID, except int) func() bool {
	return func() bool {
		for _, id := range ids {
			if r, _ := c.store.Get(id); !r.Processed && r.Partition != except {
				return false
			}
		}
		return true
	}
}

// TestCoreRereadRowKeepsMemoryCount: a parked row, which reads leave
// out, is not held; once an operator retried it, it is read with its
// payload and counts at its size in ReadAheadBytes, and the count
// returns to zero once everything is marked.
func TestCoreRereadRowKeepsMemoryCount(t *testing.T) {
	c := newCore(t, 0, nil)
	const size = 1 << 20
	big := c.store.Insert(0, "big")[0]
	c.store.Update(big, func(r *relaytest.StoredRow) {
		r.Payload = []byte(`"` + strings.Repeat("x", size) + `"`)
		r.Parked, r.Attempts = true, c.cfg.MaxAttempts
	})
	c.pub.Hold(true)
	c.start()
	testkit.WaitFor(t, waitTimeout, "a read", func() bool { return c.r.Stats().Reads > 0 })
	if st := c.r.Stats(); st.ReadAhead != 0 || st.ReadAheadBytes != 0 {
		t.Fatalf("a parked row, which reads leave out, is held: %d rows, %d bytes", st.ReadAhead, st.ReadAheadBytes)
	}
	c.store.Update(big, func(r *relaytest.StoredRow) { r.Parked, r.Attempts = false, 0 }) // an operator's retry
	c.store.Insert(0, "other")                                                            // a new row: a pass follows
	testkit.WaitFor(t, waitTimeout, "the retried row published", func() bool {
		for _, m := range c.pub.HeldMessages() {
			if m.ID == big {
				return true
			}
		}
		return false
	})
	if b := c.r.Stats().ReadAheadBytes; b < size {
		t.Fatalf("ReadAheadBytes %d with the retried row of %d bytes in flight: its payload is not counted", b, size)
	}
	c.pub.Hold(false)
	c.pub.Release(10, relay.Result{})
	c.waitDrained()
	testkit.WaitFor(t, waitTimeout, "memory count back to zero", func() bool { return c.r.Stats().ReadAheadBytes == 0 })
}
