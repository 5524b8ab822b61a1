package relay

import (
	"context"
	"math"
	"time"
)

// How the relay learns of commits without every producer's transaction
// taking NOTIFY's lock (docs/design.md, "Wake-ups").
//
// A NOTIFY serialises the commits of every transaction that issued one,
// database-wide. So producers notify a partition only while its relay has
// armed it: Store.Arm takes a lock per partition that a producer's insert
// tests (and, when it is free, shares until its commit, so that Arm
// succeeds only once every producer that did not notify has ended).
//
// A notification disarms its partition (Notifications' contract): one
// commit notifies per arm, however many follow before the relay has read
// it; the relay polls the partition and arms it again as below. Without
// that, every commit to an armed partition notified for as long as the
// rate stayed under busyRate, and at a steady 200 commits a second on a
// loaded machine 32 producers queued on NOTIFY's lock (docs/design.md,
// "Wake-ups").
//
// The relay keeps its partitions armed while commits are few: each one
// notifies, the relay reads it at once, and a few dozen NOTIFYs a second
// cost the producers little. Once new rows come at busyRate or more (an
// estimate over the last rateWindow), it disarms them and polls instead: a
// tail read of every partition every 1/rate, between pollMin and pollMax,
// and never more than half the time (a poll waits at least as long as the
// last read took). There no producer notifies, and a commit is read
// within a poll. When the rate falls below idleRate it arms them again and
// reads them once more: a commit between the last read and the arm did
// not notify.
//
// A partition that a producer's open transaction keeps from arming is
// polled, and arming tried again, soon: pollMin after the first refusal,
// doubling with each refusal in a row, up to half the time since the last
// new row (and PollInterval). Such a transaction is most often a commit
// on its way (without the trigger, the sequence watch wakes the relay
// when a producer draws a seq, before its commit), and a retry at half
// the time since the last row made its commit wait about 50 ms at 10
// commits a second.
//
// A Store whose every commit notifies (EveryCommitNotified: the adopted
// table's intake) costs no producer a NOTIFY, so none of that applies:
// its partitions stay armed through notifications and at any rate, and
// the relay reads a partition when it is notified, not every poll. A
// poll of every partition every 2-5 ms, which the relay of an adopted
// table made while busy, read all of them to find the few an intake page
// had filled: 400 reads a second at 1,500 rows a second.
const (
	busyRate   = 100.0 // new rows a second: above, the relay polls
	idleRate   = 50.0  // below, it arms again
	rateWindow = 50 * time.Millisecond
	pollMin    = 2 * time.Millisecond
	pollMax    = 5 * time.Millisecond
)

// wakes is the relay's wake-ups, wake.go's state: the three coalesced
// signals its loops wait on, which any file may send (signal) and only
// their loop receives, and what decides whether a held partition is armed
// (a producer's commit notifies) or polled. Its other fields are written
// here only, under Relay.mu; other files tell it what happened through
// its methods.
type wakes struct {
	read     chan struct{} // something may be readable (the read loop)
	dispatch chan struct{} // something may be publishable (the dispatch loop)
	mark     chan struct{} // settlements are queued (the mark loop)

	lastNew      time.Time // when a read last found new rows or a commit was notified (at first: Run's start)
	rate         float64   // new rows a second, decaying
	rateAt       time.Time // when rate was last updated
	busy         bool      // polling, not armed
	lastReadTook time.Duration
	lastPoll     time.Time // when the unarmed partitions were last polled
	armDue       bool      // a poll ran: try to arm the unarmed partitions
	armGen       uint64    // Listen's (re)connects: an Arm begun before one is void
	strays       []int     // partitions dropped while armed, to disarm
	readWaits    int64     // waitRead calls: a read loop that spins shows here (tests)
	everyCommit  bool      // the Store notifies every commit (EveryCommitNotified): never busy, never disarmed by a notification
	refused      int       // arms in a row that left a partition unarmed: the next polls come sooner (pollGapLocked)
}

func newWakes() wakes {
	return wakes{read: make(chan struct{}, 1), dispatch: make(chan struct{}, 1), mark: make(chan struct{}, 1)}
}

// start is Run's: the polls of partitions that could not be armed back
// off from now, not from PollInterval at once.
func (w *wakes) start(now time.Time) { w.lastNew = now }

// readTook records how long the last read took: polls never come closer.
func (w *wakes) readTook(d time.Duration) { w.lastReadTook = d }

// stray records partition p, dropped while armed: the next syncArms
// disarms it.
func (w *wakes) stray(p int) { w.strays = append(w.strays, p) }

// waitingForRead counts one wait of the read loop.
func (w *wakes) waitingForRead() { w.readWaits++ }

// rateLocked returns the estimated rate of new rows (and notified
// commits) a second, after counting n more at now: an exponentially
// decaying count over rateWindow.
func (r *Relay) rateLocked(now time.Time, n int) float64 {
	decay := math.Exp(-float64(now.Sub(r.wake.rateAt)) / float64(rateWindow))
	r.wake.rate = r.wake.rate*decay + float64(n)/rateWindow.Seconds()
	r.wake.rateAt = now
	if n > 0 {
		r.wake.lastNew = now
	}
	return r.wake.rate
}

// notified is the Store's Listen callback: partition p has a new commit,
// or (p < 0) Listen has just (re)connected, so nothing is armed and any
// notification may have been lost.
func (r *Relay) notified(p int) {
	r.mu.Lock()
	hit := false
	for id, ps := range r.parts {
		switch {
		case p < 0:
			ps.rd.listenLost()
			hit = true
		case id == p && r.wake.everyCommit:
			ps.rd.notifyArmed()
			hit = true
		case id == p:
			ps.rd.notify()
			hit = true
		}
	}
	if hit && p >= 0 && !r.wake.everyCommit {
		// The notification disarmed p: arm it again once idle, after
		// the read it asks for, without waiting for a poll.
		r.wake.armDue = true
	}
	if p < 0 {
		r.wake.armGen++
		r.wake.strays = nil // their locks went with the connection
		// Listen has just connected: arm once idle. An arm tried
		// before it connected failed, and nothing else may ask again
		// before the poll (up to PollInterval).
		r.wake.armDue = true
	}
	r.mu.Unlock()
	// Another node's partition is another node's business: with N nodes,
	// waking on every notification would make N reads of every commit.
	if hit || p < 0 {
		signal(r.wake.read)
	}
}

// unarmedLocked reports whether some held partition is not armed.
func (r *Relay) unarmedLocked() bool {
	for _, ps := range r.parts {
		if !ps.rd.isArmed() {
			return true
		}
	}
	return false
}

// pollGapLocked is the time between two polls of the unarmed partitions:
// while busy 1/rate (between pollMin and pollMax), otherwise half the time
// since the last new row at that poll (at least pollMin, at most
// PollInterval), and after refused arms pollMin doubling with each
// refusal in a row, up to that; never less than the last read took.
func (r *Relay) pollGapLocked() time.Duration {
	var gap time.Duration
	if r.wake.busy {
		gap = min(max(time.Duration(float64(time.Second)/max(r.wake.rate, 1)), pollMin), pollMax)
	} else {
		gap = min(max(r.wake.lastPoll.Sub(r.wake.lastNew)/2, pollMin), r.cfg.PollInterval)
		if r.wake.refused > 0 {
			gap = min(gap, pollMin<<min(r.wake.refused-1, 20))
		}
	}
	return max(gap, r.wake.lastReadTook)
}

// pollDueLocked starts a poll when one is due: a tail read of every
// unarmed partition, after which syncArms tries to arm them. It reports
// whether it started one.
func (r *Relay) pollDueLocked(now time.Time) bool {
	if now.Before(r.wake.lastPoll.Add(r.pollGapLocked())) || !r.unarmedLocked() {
		return false
	}
	for _, ps := range r.parts {
		ps.rd.pollTail()
	}
	r.wake.armDue = true
	r.wake.lastPoll = now
	return true
}

// passesWaitForPollLocked reports whether a pass coming due waits for the
// next poll: while busy, polls come every pollMax at most, and a pass
// read with the poll's tail reads costs no statement of its own. Without
// it every new row's follow-up pass (pass.go) was a read between two
// polls: at a steady 200 commits a second, 1.6 reads per message.
func (r *Relay) passesWaitForPollLocked() bool {
	return r.wake.busy && r.unarmedLocked()
}

// nextPollLocked returns when the next poll is due (zero: every partition
// is armed, and a commit notifies).
func (r *Relay) nextPollLocked() time.Time {
	if !r.unarmedLocked() {
		return time.Time{}
	}
	return r.wake.lastPoll.Add(r.pollGapLocked())
}

// syncArms disarms the held partitions while the relay is busy (checked
// on every round: a busy relay may never wait) and, when it is about to
// wait (idle) and not busy, arms them after a poll. It reports whether it
// armed any: they must be read once more before the relay waits.
func (r *Relay) syncArms(ctx context.Context, idle bool) bool {
	r.mu.Lock()
	rate := r.rateLocked(time.Now(), 0)
	r.wake.busy = !r.wake.everyCommit && (rate >= busyRate || (r.wake.busy && rate >= idleRate))
	busy := r.wake.busy
	disarm := r.wake.strays
	r.wake.strays = nil
	var arm []int
	wakes := map[int]uint64{}
	for p, ps := range r.parts {
		switch {
		case busy && ps.rd.isArmed():
			ps.rd.disarm()
			disarm = append(disarm, p)
		case idle && !busy && !ps.rd.isArmed() && r.wake.armDue:
			arm = append(arm, p)
			wakes[p] = ps.rd.wakes
		}
	}
	if idle && !busy {
		r.wake.armDue = false
	}
	gen := r.wake.armGen
	r.mu.Unlock()
	if len(disarm) > 0 {
		// A failure means Listen's connection is gone, and the locks
		// with it; or they are held still, and producers notify a
		// partition nobody waits for: a cost to them, nothing lost.
		if err := r.store.Disarm(ctx, disarm); err != nil && ctx.Err() == nil {
			r.cfg.Logger.Debug("disarm partitions", "err", err)
		}
	}
	if len(arm) == 0 {
		return false
	}
	armed, err := r.store.Arm(ctx, arm)
	if err != nil {
		// Not listening: Listen's connect calls notified(-1), which
		// asks again. Otherwise the next poll does; the partitions are
		// polled meanwhile.
		if ctx.Err() == nil {
			r.cfg.Logger.Debug("arm partitions", "err", err)
		}
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(armed) < len(arm) {
		r.wake.refused++ // a producer's transaction is open: poll and try again soon
	} else {
		r.wake.refused = 0
	}
	if gen != r.wake.armGen {
		return false // Listen reconnected meanwhile: nothing is armed
	}
	n := 0
	for _, p := range armed {
		ps := r.parts[p]
		if ps == nil {
			r.wake.strays = append(r.wake.strays, p) // revoked meanwhile
			continue
		}
		if ps.rd.wakes != wakes[p] {
			// Notified since the arm began: that notification may have
			// disarmed it after the arm. It counts as not armed (it is
			// polled, and armed again), which costs at most a read.
			continue
		}
		ps.rd.armedNow() // and read once more
		n++
	}
	return n > 0
}
