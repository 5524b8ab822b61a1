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
// polled, and arming tried again, at half the time since the last new
// row, up to PollInterval.
const (
	busyRate   = 100.0 // new rows a second: above, the relay polls
	idleRate   = 50.0  // below, it arms again
	rateWindow = 50 * time.Millisecond
	pollMin    = 2 * time.Millisecond
	pollMax    = 5 * time.Millisecond
)

// rateLocked returns the estimated rate of new rows (and notified
// commits) a second, after counting n more at now: an exponentially
// decaying count over rateWindow.
func (r *Relay) rateLocked(now time.Time, n int) float64 {
	decay := math.Exp(-float64(now.Sub(r.rateAt)) / float64(rateWindow))
	r.rate = r.rate*decay + float64(n)/rateWindow.Seconds()
	r.rateAt = now
	if n > 0 {
		r.lastNew = now
	}
	return r.rate
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
		case id == p:
			ps.rd.notify()
			hit = true
		}
	}
	if hit && p >= 0 {
		// The notification disarmed p: arm it again once idle, after
		// the read it asks for, without waiting for a poll.
		r.armDue = true
	}
	if p < 0 {
		r.armGen++
		r.strays = nil // their locks went with the connection
		// Listen has just connected: arm once idle. An arm tried
		// before it connected failed, and nothing else may ask again
		// before the poll (up to PollInterval).
		r.armDue = true
	}
	r.mu.Unlock()
	// Another node's partition is another node's business: with N nodes,
	// waking on every notification would make N reads of every commit.
	if hit || p < 0 {
		signal(r.wakeRead)
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
// PollInterval); never less than the last read took.
func (r *Relay) pollGapLocked() time.Duration {
	var gap time.Duration
	if r.busy {
		gap = min(max(time.Duration(float64(time.Second)/max(r.rate, 1)), pollMin), pollMax)
	} else {
		gap = min(max(r.lastPoll.Sub(r.lastNew)/2, pollMin), r.cfg.PollInterval)
	}
	return max(gap, r.lastReadTook)
}

// pollDueLocked starts a poll when one is due: a tail read of every
// unarmed partition, after which syncArms tries to arm them.
func (r *Relay) pollDueLocked(now time.Time) {
	if now.Before(r.lastPoll.Add(r.pollGapLocked())) || !r.unarmedLocked() {
		return
	}
	for _, ps := range r.parts {
		ps.rd.pollTail()
	}
	r.armDue = true
	r.lastPoll = now
}

// nextPollLocked returns when the next poll is due (zero: every partition
// is armed, and a commit notifies).
func (r *Relay) nextPollLocked() time.Time {
	if !r.unarmedLocked() {
		return time.Time{}
	}
	return r.lastPoll.Add(r.pollGapLocked())
}

// syncArms disarms the held partitions while the relay is busy (checked
// on every round: a busy relay may never wait) and, when it is about to
// wait (idle) and not busy, arms them after a poll. It reports whether it
// armed any: they must be read once more before the relay waits.
func (r *Relay) syncArms(ctx context.Context, idle bool) bool {
	r.mu.Lock()
	rate := r.rateLocked(time.Now(), 0)
	r.busy = rate >= busyRate || (r.busy && rate >= idleRate)
	busy := r.busy
	disarm := r.strays
	r.strays = nil
	var arm []int
	wakes := map[int]uint64{}
	for p, ps := range r.parts {
		switch {
		case busy && ps.rd.isArmed():
			ps.rd.disarm()
			disarm = append(disarm, p)
		case idle && !busy && !ps.rd.isArmed() && r.armDue:
			arm = append(arm, p)
			wakes[p] = ps.rd.wakes
		}
	}
	if idle && !busy {
		r.armDue = false
	}
	gen := r.armGen
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
	if gen != r.armGen {
		return false // Listen reconnected meanwhile: nothing is armed
	}
	n := 0
	for _, p := range armed {
		ps := r.parts[p]
		if ps == nil {
			r.strays = append(r.strays, p) // revoked meanwhile
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
