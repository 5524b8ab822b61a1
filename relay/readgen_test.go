package relay_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/relay"
	"github.com/ordo-relay/ordo/relay/relaytest"
)

// staleReads holds one read's rows, taken from the store when the read
// began, until the test lets them go: a read whose snapshot is older than
// the writes that follow it, as a slow ReadPending's is.
type staleReads struct {
	relay.Store
	mu      sync.Mutex
	hold    bool
	held    chan struct{} // a read is held
	release chan struct{} // closed by the test
}

func (s *staleReads) holdNext() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hold = true
}

func (s *staleReads) ReadPending(ctx context.Context, cursors []relay.Cursor, limit int) ([]relay.Row, error) {
	rows, err := s.Store.ReadPending(ctx, cursors, limit)
	s.mu.Lock()
	hold := s.hold
	s.hold = false
	s.mu.Unlock()
	if hold {
		s.held <- struct{}{}
		select {
		case <-s.release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return rows, err
}

// TestCoreStaleReadDoesNotUndoWrites: a read that began while a row was
// in flight returns it as it was then, pending and never attempted. If
// the row's failure was recorded (or its mark written) before the read
// returns, memory is newer than the read, and the read generation keeps
// it: the failed row keeps its backoff (an hour here) instead of going
// again at once, and the marked row is not published twice.
func TestCoreStaleReadDoesNotUndoWrites(t *testing.T) {
	for _, c := range []struct {
		name    string
		outcome relay.Result
		written func(row relaytest.StoredRow, st relay.Stats) bool
	}{
		{"failure recorded during the read", relay.Result{Outcome: relay.Nacked, Err: errors.New("nacked by the test")},
			func(row relaytest.StoredRow, st relay.Stats) bool { return row.Attempts == 1 && st.Failed == 1 }},
		{"mark written during the read", relay.Result{Outcome: relay.Confirmed},
			func(row relaytest.StoredRow, st relay.Stats) bool { return row.Processed && st.Marked == 1 }},
	} {
		t.Run(c.name, func(t *testing.T) {
			co := newCore(t, time.Hour, func(x *relay.Config) {
				x.RetryMin, x.RetryMax = time.Hour, time.Hour
				x.ReadTimeout = 10 * time.Second // longer than the test holds a read
			})
			store := &staleReads{Store: co.store.ForNode(co.cfg.Node), held: make(chan struct{}, 1), release: make(chan struct{})}
			co.withStore(store)
			co.pub.Hold(true)
			id := co.store.Insert(0, "k")[0]
			co.start()
			testkit.WaitFor(t, waitTimeout, "the row published and held", func() bool { now, _ := co.pub.Held(); return now == 1 })
			store.holdNext()
			select {
			case <-store.held:
			case <-time.After(waitTimeout):
				t.Fatal("no read began while the row was in flight")
			}
			co.pub.Release(1, c.outcome)
			testkit.WaitFor(t, waitTimeout, "the outcome written", func() bool {
				row, _ := co.store.Get(id)
				return c.written(row, co.r.Stats())
			})
			reads := co.r.Stats().Reads
			close(store.release)
			// The held read, then one more: a dispatch ran between them.
			testkit.WaitFor(t, waitTimeout, "two reads after the stale one returned", func() bool { return co.r.Stats().Reads >= reads+2 })
			if sent := co.pub.Sent(); len(sent) != 1 {
				t.Fatalf("the row was published %d times: a read begun before its outcome was written overwrote memory", len(sent))
			}
		})
	}
}
