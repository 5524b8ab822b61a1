package relay_test

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/relay"
)

// TestCoreSynchronousUnsentWaits: a Publisher may
// settle a message inside Publish, Unsent included (its channel closed
// under it). The relay used to put the row back at its key's head and
// publish it again at once, in the same dispatch, forever: 100 % CPU, and
// Run ignored its context. Now a row's first Unsent goes again at once
// (a channel closed under innocent messages), but every further Unsent in
// a row waits RetryMin, doubling, up to a second, and nothing counts an
// attempt. Over a window of 500 ms that is at most 8 publishes (0, 0, ≥10,
// ≥30, ≥70, ≥150, ≥310 ms at RetryMin 20 ms); a hot loop makes millions.
func TestCoreSynchronousUnsentWaits(t *testing.T) {
	c := newCore(t, 0, func(cfg *relay.Config) { cfg.RetryMin, cfg.RetryMax = 20*time.Millisecond, time.Second })
	c.pub.SetFault(func(*relay.Message) (relay.Result, bool) {
		return relay.Result{Outcome: relay.Unsent, Err: errors.New("injected: channel closed inside Publish")}, true
	})
	ids := c.store.Insert(1, "k")
	c.start()
	testkit.WaitFor(t, waitTimeout, "the row published twice", func() bool { return len(c.pub.Sent()) >= 2 })
	before := len(c.pub.Sent())
	time.Sleep(500 * time.Millisecond) // the window publishes are counted over
	n := len(c.pub.Sent()) - before
	if n > 12 {
		t.Fatalf("%d publishes of one row settled Unsent within 500ms: the relay republishes it without waiting", n)
	}
	t.Logf("%d publishes of the row within the 500ms window", n)
	c.stop() // fails the test if Run does not return within 10 s
	if r, _ := c.store.Get(ids[0]); r.Processed || r.Attempts != 0 {
		t.Fatalf("row after %d Unsent publishes: processed %v, attempts %d; want pending, no attempt", len(c.pub.Sent()), r.Processed, r.Attempts)
	}
}

// TestCoreRunStopsWhileDispatching: a Publisher that refuses every
// publish synchronously (here: it finds each message's deadline passed,
// while the relay's lease is valid) keeps the relay's dispatch busy; Run
// still returns soon after its context ends, because dispatch checks it
// between publishes.
func TestCoreRunStopsWhileDispatching(t *testing.T) {
	c := newCore(t, 0, nil)
	var refused atomic.Int64
	c.pub.SetBeforeSend(func(m *relay.Message) {
		refused.Add(1)
		m.Deadline = time.Now().Add(-time.Second)
	})
	c.store.Insert(1, "k")
	c.start()
	testkit.WaitFor(t, waitTimeout, "publishes refused", func() bool { return refused.Load() >= 100 })
	c.stop() // fails the test if Run does not return within 10 s
}
