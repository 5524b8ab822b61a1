package relay

import (
	"context"
	"errors"
	"time"

	"github.com/ordo-relay/ordo/internal/backoff"
	"github.com/ordo-relay/ordo/internal/outage"
)

// Two loops: the read loop reads what is wanted and waits for a reason to
// read again; the dispatch loop publishes what may go, whenever something
// may have become publishable. Apart, so that a confirmed key's next row
// never waits for a read, an arm or a pass of its partition: with a
// handful of hot keys every round trip counts. Dispatch is
// dispatch.go, reads read.go.

// readLoop reads pending rows while ctx lasts.
func (r *Relay) readLoop(ctx context.Context) {
	down := outage.New(r.cfg.Logger, "PostgreSQL (outbox reads)")
	bo := backoff.New(50*time.Millisecond, 2*time.Second)
	// No reads while there is nowhere to publish; check for the
	// publisher's return often.
	pubWait := backoff.New(20*time.Millisecond, 200*time.Millisecond)
	poll := time.NewTicker(r.cfg.PollInterval)
	defer poll.Stop()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	var published int64 // the publish count at the last round
	for {
		if !r.pub.Connected() {
			if !backoff.Sleep(ctx, pubWait.Next()) {
				return
			}
			continue
		}
		pubWait.Reset()
		read, err := r.readOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			down.Fail(err)
			if errors.As(err, new(*splitReadError)) {
				continue // it waited ReadTimeout, and the next read differs (slowread.go)
			}
			if !backoff.Sleep(ctx, bo.Next()) {
				return
			}
			continue
		}
		if read {
			down.OK()
			bo.Reset()
		}
		// Idle: nothing read, nothing published since the last round
		// (arming waits for a relay with nothing to do).
		idle := !read && !r.publishedSince(&published)
		if r.syncArms(ctx, idle) || read {
			continue // more to read, or read the partitions just armed once more
		}
		r.checkStall()
		if !r.waitRead(ctx, poll.C, timer) {
			return
		}
	}
}

// publishedSince reports whether the relay published since *seen was
// taken, and takes it again.
func (r *Relay) publishedSince(seen *int64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := r.stats.Published
	changed := n != *seen
	*seen = n
	return changed
}

// waitRead blocks until something may be readable: a notification, a
// poll, a pass coming due.
func (r *Relay) waitRead(ctx context.Context, poll <-chan time.Time, timer *time.Timer) bool {
	r.mu.Lock()
	r.wake.waitingForRead()
	now := time.Now()
	var next time.Time
	soonest := func(at time.Time) {
		if !at.IsZero() && (next.IsZero() || at.Before(next)) {
			next = at
		}
	}
	// While memory is full nothing may be read: a pass or poll coming
	// due must not wake the loop (it would find the read refused, find the
	// pass still due, and spin until memory frees), a mark or bytes given
	// back by another relay of the Budget do (wake.read). Under a Budget a
	// relay's dirty partitions stayed due for as long as it was full: the
	// two-source drain spent 2-2.7x the node CPU per message of
	// independent windows (TestBudgetReadAheadFullReadsEachRowAboutOnce).
	if !r.readRefusedLocked() {
		passesWait := r.passesWaitForPollLocked() // the next poll reads them
		for _, ps := range r.parts {
			if !passesWait {
				soonest(ps.rd.nextPass(r.passGapLocked(ps)))
			}
			if ps.slow.blocked(now) {
				soonest(ps.slow.notBefore) // its charged row's backoff ends
			}
		}
		soonest(r.nextPollLocked())
	}
	r.mu.Unlock()
	if !next.IsZero() {
		timer.Reset(max(time.Until(next), 0))
	}
	select {
	case <-ctx.Done():
		return false
	case <-r.wake.read:
	case <-timer.C:
	case <-poll:
		r.mu.Lock()
		now := time.Now()
		for _, ps := range r.parts {
			// The safety net: a tail read of every partition, and a pass
			// of those not read from the start for passEvery. An
			// operator's retry or skip notifies the partition (admin), so
			// a parked key needs no faster look than this.
			ps.rd.polled(now)
		}
		r.mu.Unlock()
		r.retryLeaseWait()
	}
	return true
}

// dispatchLoop publishes what the per-key rule and the window let go
// while ctx lasts. It is woken by wake.dispatch (a confirm, a read's rows,
// a requeue, a lease back: pushReadyLocked and settle) and by the retry
// timer of a key backing off.
func (r *Relay) dispatchLoop(ctx context.Context) {
	down := outage.New(r.cfg.Logger, "PostgreSQL (outbox dead-row lookups)")
	// The publisher reconnects on its own; check for it often so the first
	// publish follows a broker's return closely.
	pubWait := backoff.New(20*time.Millisecond, 200*time.Millisecond)
	retry := time.NewTimer(time.Hour)
	defer retry.Stop()
	for {
		if !r.pub.Connected() {
			if !backoff.Sleep(ctx, pubWait.Next()) {
				return
			}
			continue
		}
		_, err := r.dispatch(ctx)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			// The publisher reconnects and logs on its own; a database
			// error (the dead-row lookup) is an outage like a read's.
			if !errors.As(err, new(*publishError)) {
				down.Fail(err)
			}
			if !backoff.Sleep(ctx, pubWait.Next()) {
				return
			}
			continue
		}
		pubWait.Reset()
		down.OK()
		r.checkStall()
		if !r.waitDispatch(ctx, retry) {
			return
		}
	}
}

// waitDispatch blocks until something may be publishable.
func (r *Relay) waitDispatch(ctx context.Context, retry *time.Timer) bool {
	r.mu.Lock()
	next, due := r.earliestRetryLocked(time.Now())
	r.mu.Unlock()
	if due {
		return true // a key's backoff is over: publish it now
	}
	if !next.IsZero() {
		retry.Reset(max(time.Until(next), 0))
	}
	select {
	case <-ctx.Done():
		return false
	case <-r.wake.dispatch:
	case <-retry.C:
	}
	return true
}

// retryLeaseWait puts the keys that found their lease invalid back in line.
func (r *Relay) retryLeaseWait() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, k := range r.queues.takeLeaseWait() {
		if r.currentLocked(k) {
			r.pushReadyLocked(k)
		}
	}
}

// checkStall tells the progress tracker whether rows wait that could go.
// It looks at every key, so at most every stallCheckEvery.
func (r *Relay) checkStall() {
	now := time.Now()
	if !r.progress.checkDue(now) {
		return
	}
	r.mu.Lock()
	n := r.eligibleLocked(now)
	r.mu.Unlock()
	r.progress.idle(n)
	if n > 0 {
		r.mu.Lock()
		r.stats.IdleReads++
		r.mu.Unlock()
	}
}
