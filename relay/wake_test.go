package relay_test

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/relay"
)

// allArmed reports whether every partition of c is armed in its store.
func (c *core) allArmed() bool {
	for p := range coreParts {
		if !c.store.Armed(p) {
			return false
		}
	}
	return true
}

func (c *core) delivered(id uuid.UUID) bool {
	return slices.ContainsFunc(c.pub.Delivered(), func(m relay.Message) bool { return m.ID == id })
}

// TestCoreBusyRelayIsNotNotified: while commits come fast the relay
// disarms its partitions and polls, so most commits send no notification
// (each would take NOTIFY's database-wide lock in the producer's commit);
// once they stop it arms them again. Every row is delivered in order.
func TestCoreBusyRelayIsNotNotified(t *testing.T) {
	t.Parallel()
	c := newCore(t, time.Hour, func(cfg *relay.Config) { cfg.PollInterval = time.Minute })
	c.start()
	testkit.WaitFor(t, waitTimeout, "every partition armed", c.allArmed)
	// The relay needs a read and a disarm to notice the rate (longer on
	// a loaded machine): what counts is the second half of the burst.
	const n = 4000
	var before int
	for i := range n {
		if i == n/2 {
			before = c.store.Notifications()
		}
		c.store.Insert(i%coreParts, fmt.Sprintf("key-%d", i%100))
		if i%10 == 9 {
			// Paced like fast producers (at most ~10,000 commits a
			// second), not a loop of map inserts.
			time.Sleep(time.Millisecond)
		}
	}
	c.waitDrained()
	notified := c.store.Notifications() - before
	t.Logf("the second half of a burst of %d commits sent %d notifications", n, notified)
	if notified > n/2/5 {
		t.Fatalf("%d of the last %d commits of a burst notified: a busy relay must poll, not keep its partitions armed", notified, n/2)
	}
	testkit.WaitFor(t, waitTimeout, "the partitions armed again once the burst is over", c.allArmed)
}

// TestCoreArmReadsOnceMore: a commit that lands between the relay's last
// read and its arm sends no notification (nothing was armed when it
// wrote); the relay reads the partitions it has just armed once more and
// publishes it, without waiting for the poll (a minute here).
func TestCoreArmReadsOnceMore(t *testing.T) {
	t.Parallel()
	c := newCore(t, time.Hour, func(cfg *relay.Config) { cfg.PollInterval = time.Minute })
	ids := make(chan uuid.UUID, 1)
	c.store.SetBeforeArm(func() {
		c.store.SetBeforeArm(nil)
		ids <- c.store.Insert(2, "between")[0]
	})
	c.start()
	id := <-ids
	testkit.WaitFor(t, waitTimeout, "the commit made just before the arm delivered", func() bool { return c.delivered(id) })
}

// TestCoreLateCommitBelowCursor: a row whose transaction commits after a
// row with a higher seq was read lies below the cursor, where tail reads
// never look; a pass finds it, whether the relay polls (the follow-up
// passes after new rows) or is armed (a notified commit not found above
// the cursor), without waiting for the poll's 5-second pass (never here:
// the poll is a minute).
func TestCoreLateCommitBelowCursor(t *testing.T) {
	for _, armed := range []bool{false, true} {
		t.Run(fmt.Sprintf("armed=%v", armed), func(t *testing.T) {
			t.Parallel()
			c := newCore(t, time.Hour, func(cfg *relay.Config) { cfg.PollInterval = time.Minute })
			if !armed {
				c.store.RefuseArm(0, true) // a producer's open transaction, as far as arming goes
			}
			c.start()
			if armed {
				testkit.WaitFor(t, waitTimeout, "every partition armed", c.allArmed)
			}
			late, commit := c.store.Reserve(0, "late")
			later := c.store.Insert(0, "later")[0]
			testkit.WaitFor(t, waitTimeout, "the later row delivered", func() bool { return c.delivered(later) })
			if armed {
				// Past the follow-up passes after the later row (10 and 80
				// ms), and armed again: only the notification
				// can lead to the late row now.
				time.Sleep(time.Second)
				testkit.WaitFor(t, waitTimeout, "partition 0 armed again", func() bool { return c.store.Armed(0) })
			}
			commit()
			testkit.WaitFor(t, waitTimeout, "the row committed late delivered", func() bool { return c.delivered(late) })
		})
	}
}

// gatedReads holds every read, once gated, until the gate opens, and
// says when one has begun.
type gatedReads struct {
	relay.Store
	on      atomic.Bool
	started chan struct{}
	gate    chan struct{}
}

func (g *gatedReads) ReadPending(ctx context.Context, cursors []relay.Cursor, limit int) ([]relay.Row, error) {
	if g.on.Load() {
		select {
		case g.started <- struct{}{}:
		default:
		}
		select {
		case <-g.gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return g.Store.ReadPending(ctx, cursors, limit)
}

// TestCoreConfirmDoesNotWaitForRead: a key's next row goes the moment its
// previous one is confirmed, even while a read of its partition is under
// way (reads and publishes are separate loops). With one loop for both,
// every hot key waited for the read in progress, a round trip per read.
func TestCoreConfirmDoesNotWaitForRead(t *testing.T) {
	t.Parallel()
	// The held read must outlast the wait below, not time out.
	c := newCore(t, time.Hour, func(cfg *relay.Config) { cfg.ReadTimeout = time.Minute })
	g := &gatedReads{Store: c.store.ForNode(c.cfg.Node), started: make(chan struct{}, 1), gate: make(chan struct{})}
	c.withStore(g)
	c.pub.Hold(true)
	c.store.Insert(0, "hot", "hot", "hot")
	c.start()
	testkit.WaitFor(t, waitTimeout, "the key's first row held", func() bool { now, _ := c.pub.Held(); return now == 1 })
	g.on.Store(true)
	<-g.started // a poll's read, held at the gate
	c.pub.Release(1, relay.Result{Outcome: relay.Confirmed})
	testkit.WaitFor(t, waitTimeout, "the key's second row published while a read is held", func() bool {
		return len(c.pub.Sent()) == 2
	})
	close(g.gate)
	c.pub.Hold(false)
	c.pub.Release(-1, relay.Result{Outcome: relay.Confirmed})
	c.waitDrained()
}

// TestCoreArmsOnceListening: a relay idle before its Listen connects (a
// slow connection at start) cannot arm then (Arm fails while not
// listening); it arms once Listen connects, and a commit after that is
// delivered by its notification, without waiting for the poll (a minute
// here). It waited for the poll when the failed arm had used up the
// reason to arm (relay TestNotifyWakesWithoutPolling, about one run in
// three under load).
func TestCoreArmsOnceListening(t *testing.T) {
	t.Parallel()
	c := newCore(t, time.Hour, func(cfg *relay.Config) { cfg.PollInterval = time.Minute })
	release := c.store.HoldListen()
	first := c.store.Insert(1, "first")[0]
	c.start()
	testkit.WaitFor(t, waitTimeout, "the first row delivered", func() bool { return c.delivered(first) })
	testkit.WaitFor(t, waitTimeout, "an arm tried (and failed) before Listen connects", func() bool { return c.store.ArmCalls() > 0 })
	release()
	testkit.WaitFor(t, waitTimeout, "every partition armed once Listen connected", c.allArmed)
	id := c.store.Insert(2, "later")[0]
	testkit.WaitFor(t, waitTimeout, "the commit after the arm delivered", func() bool { return c.delivered(id) })
}

// TestCoreRefusedArmIsTriedAgainSoon: a partition that cannot be armed at
// start (a producer's transaction is open on it) is polled, and arming
// tried again, at half the time since the last new row, counted from the
// relay's start when none came yet: not only at the poll (a minute here).
func TestCoreRefusedArmIsTriedAgainSoon(t *testing.T) {
	t.Parallel()
	c := newCore(t, time.Hour, func(cfg *relay.Config) { cfg.PollInterval = time.Minute })
	c.store.RefuseArm(2, true)
	c.start()
	testkit.WaitFor(t, waitTimeout, "the other partitions armed", func() bool {
		for p := range coreParts {
			if p != 2 && !c.store.Armed(p) {
				return false
			}
		}
		return true
	})
	// Each refusal brings the next try closer (pollGapLocked).
	testkit.WaitFor(t, waitTimeout, "refused arms counted", func() bool { return c.r.RefusedArms() > 0 })
	c.store.RefuseArm(2, false) // the producer's transaction ended
	testkit.WaitFor(t, waitTimeout, "partition 2 armed once it may be", c.allArmed)
	testkit.WaitFor(t, waitTimeout, "the count of refusals reset", func() bool { return c.r.RefusedArms() == 0 })
	id := c.store.Insert(2, "later")[0]
	testkit.WaitFor(t, waitTimeout, "the commit after the arm delivered", func() bool { return c.delivered(id) })
}

// TestCoreSteadyRateIsNotNotified: commits at a steady 250 a second, a
// rate a relay once kept its partitions armed through (it polled only
// from 500 a second), so that every commit notified and, on a loaded
// machine, producers queued on NOTIFY's lock (docs/design.md, "Wake-ups").
// The relay must poll at such a rate: few of the second half's commits
// notify. Every row is delivered in order.
func TestCoreSteadyRateIsNotNotified(t *testing.T) {
	t.Parallel()
	const n, every = 500, 4 * time.Millisecond
	var before int
	c := steadyCommits(t, n, every, func(c *core) { before = c.store.Notifications() })
	c.waitDrained()
	notified := c.store.Notifications() - before
	t.Logf("the second half of %d commits, one every %v, sent %d notifications", n, every, notified)
	if notified > n/2/5 {
		t.Fatalf("%d of the last %d commits at a steady %v notified: at this rate the relay must poll, not keep its partitions armed",
			notified, n/2, every)
	}
}

// TestCoreSteadyRateReadsWithPolls: at a steady rate above busyRate the
// relay polls, and each new row's follow-up pass (a late commit below the
// cursor) is read with the next poll's tail reads, not in a read of its
// own between two polls: about one read per commit, where a pass of its
// own for each commit made it 1.6. A relay that keeps up marks what was
// confirmed over caughtUpLinger in one statement: not a mark per confirm
// (0.7 marks per commit before).
func TestCoreSteadyRateReadsWithPolls(t *testing.T) {
	t.Parallel()
	const n, every = 600, 4 * time.Millisecond
	var before relay.Stats
	c := steadyCommits(t, n, every, func(c *core) { before = c.r.Stats() })
	after := c.r.Stats()
	c.waitDrained()
	reads, passes, marks := after.Reads-before.Reads, after.Passes-before.Passes, after.Marks-before.Marks
	t.Logf("the second half of %d commits, one every %v: %d reads, %d of them passes; %d marks", n, every, reads, passes, marks)
	if perCommit := float64(reads) / float64(n/2); perCommit > 1.3 {
		t.Errorf("%.2f reads per commit at a steady %v (%d reads, %d passes): passes must wait for the next poll's read", perCommit, every, reads, passes)
	}
	if perCommit := float64(marks) / float64(n/2); perCommit > 0.55 {
		t.Errorf("%.2f marks per commit at a steady %v: a relay that keeps up must gather confirms for a mark", perCommit, every)
	}
}

// steadyCommits starts a core relay (polling at most once a minute),
// waits until it has armed every partition, and commits n rows over 50
// keys, one every every; half runs just before the second half's first
// commit. It returns the core with the commits made.
func steadyCommits(t *testing.T, n int, every time.Duration, half func(c *core)) *core {
	t.Helper()
	c := newCore(t, time.Hour, func(cfg *relay.Config) { cfg.PollInterval = time.Minute })
	c.start()
	testkit.WaitFor(t, waitTimeout, "every partition armed", c.allArmed)
	tick := time.NewTicker(every)
	defer tick.Stop()
	for i := range n {
		<-tick.C
		if i == n/2 {
			half(c)
		}
		c.store.Insert(i%coreParts, fmt.Sprintf("key-%d", i%50))
	}
	return c
}

// TestCoreEveryCommitNotifiedStaysArmed: over a Store whose every commit
// notifies (an adopted table's intake), a burst faster than busyRate
// neither disarms the partitions nor arms them again after each
// notification: the relay reads the partitions it is told of, polls none
// (the safety poll is a minute away), and delivers every row in order,
// the one after the burst too.
func TestCoreEveryCommitNotifiedStaysArmed(t *testing.T) {
	t.Parallel()
	c := newCore(t, time.Hour, func(cfg *relay.Config) { cfg.PollInterval = time.Minute })
	c.store.NotifyEveryCommit()
	c.withStore(c.store.ForNode(c.cfg.Node))
	c.start()
	testkit.WaitFor(t, waitTimeout, "every partition armed", c.allArmed)
	arms := c.store.ArmCalls()
	const n = 2000
	for i := range n {
		c.store.Insert(i%coreParts, fmt.Sprintf("key-%d", i%100))
		if i%10 == 9 {
			time.Sleep(time.Millisecond)
		}
	}
	c.waitDrained()
	id := c.store.Insert(1, "after")[0]
	testkit.WaitFor(t, waitTimeout, "the commit after the burst delivered", func() bool { return c.delivered(id) })
	if d, a := c.store.DisarmCalls(), c.store.ArmCalls()-arms; d != 0 || a != 0 {
		t.Fatalf("a burst of %d commits, each notified: %d disarms and %d arms; want none (the partitions stay armed)", n, d, a)
	}
	if !c.allArmed() {
		t.Fatal("a partition is not armed after the burst")
	}
}
