package relay_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/relay"
	"github.com/ordo-relay/ordo/relay/relaytest"
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

// heldUntilFlush is a relay.Flusher that sends nothing before Flush: each
// Publish is queued, and Flush hands the queue to the Publisher it wraps,
// as a corked connection sends what it holds only when uncorked.
type heldUntilFlush struct {
	*relaytest.Publisher
	mu      sync.Mutex
	queued  []func()
	flushes int
}

func (h *heldUntilFlush) Publish(ctx context.Context, m *relay.Message, settle func(relay.Result)) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.queued = append(h.queued, func() {
		if err := h.Publisher.Publish(ctx, m, settle); err != nil {
			settle(relay.Result{Outcome: relay.Unsent, Err: err})
		}
	})
	return nil
}

func (h *heldUntilFlush) Flush() {
	h.mu.Lock()
	q := h.queued
	h.queued = nil
	h.flushes++
	h.mu.Unlock()
	for _, send := range q {
		send()
	}
}

// TestCoreFlushesEveryRound: a Publisher may hold what it is given until
// Flush (relay/rabbitmq corks its connection); the relay flushes at the
// end of every round of publishes, so nothing it published waits while
// it waits for confirms. 2,000 rows over 50 keys go one per key at a
// time, so the drain needs at least 40 rounds, each flushed; without the
// flush the first round's messages are never sent and nothing is marked.
func TestCoreFlushesEveryRound(t *testing.T) {
	t.Parallel()
	c := newCore(t, time.Hour, nil)
	h := &heldUntilFlush{Publisher: c.pub}
	r, err := relay.New(c.cfg, c.store.ForNode(c.cfg.Node), h, c.own)
	if err != nil {
		t.Fatal(err)
	}
	c.r = r
	for i := range 2000 {
		c.store.Insert(i%50%coreParts, fmt.Sprintf("key-%d", i%50))
	}
	c.start()
	c.waitDrained()
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.flushes < 40 || h.flushes > 2000 {
		t.Fatalf("%d flushes for 2,000 messages in at least 40 rounds", h.flushes)
	}
	t.Logf("%d flushes for 2,000 messages", h.flushes)
}
