package relay

import (
	"context"
	"errors"
	"time"

	"github.com/ordo-relay/ordo/internal/backoff"
	"github.com/ordo-relay/ordo/internal/outage"
)

// The read loop: publish what may go, read what is wanted, wait for a
// reason to do either again. Dispatch is dispatch.go, reads read.go.

// readLoop reads pending rows and publishes them while ctx lasts.
func (r *Relay) readLoop(ctx context.Context) {
	down := outage.New(r.cfg.Logger, "PostgreSQL (outbox reads)")
	bo := backoff.New(50*time.Millisecond, 2*time.Second)
	// The publisher reconnects on its own; check for it often so the first
	// publish follows a broker's return closely.
	pubWait := backoff.New(20*time.Millisecond, 200*time.Millisecond)
	poll := time.NewTicker(r.cfg.PollInterval)
	defer poll.Stop()
	retry := time.NewTimer(time.Hour)
	defer retry.Stop()
	for {
		if !r.pub.Connected() {
			// No reads and no publishes while there is nowhere to publish.
			if !backoff.Sleep(ctx, pubWait.Next()) {
				return
			}
			continue
		}
		pubWait.Reset()
		published, err := r.dispatch(ctx)
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
		if r.syncArms(ctx, !read && published == 0) || read || published > 0 {
			continue // more to do, or read the partitions just armed once more
		}
		r.checkStall()
		if !r.wait(ctx, poll.C, retry) {
			return
		}
	}
}

// wait blocks until something may be readable or publishable.
func (r *Relay) wait(ctx context.Context, poll <-chan time.Time, retry *time.Timer) bool {
	r.mu.Lock()
	now := time.Now()
	next, due := r.earliestRetryLocked(now)
	if due {
		r.mu.Unlock()
		return true // a key's backoff is over: publish it now
	}
	soonest := func(at time.Time) {
		if !at.IsZero() && (next.IsZero() || at.Before(next)) {
			next = at
		}
	}
	for _, ps := range r.parts {
		soonest(ps.rd.nextPass(r.passGapLocked(ps)))
		if ps.slow.blocked(now) {
			soonest(ps.slow.notBefore) // its charged row's backoff ends
		}
	}
	soonest(r.nextPollLocked())
	r.mu.Unlock()
	if !next.IsZero() {
		retry.Reset(max(time.Until(next), 0))
	}
	select {
	case <-ctx.Done():
		return false
	case <-r.wakeRead:
	case <-retry.C:
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

// retryLeaseWait puts the keys that found their lease invalid back in line.
func (r *Relay) retryLeaseWait() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for k := range r.leaseWait {
		if r.currentLocked(k) {
			r.pushReadyLocked(k)
		}
		delete(r.leaseWait, k)
	}
}

// checkStall tells the progress tracker whether rows wait that could go.
// It looks at every key, so at most every stallCheckEvery.
func (r *Relay) checkStall() {
	r.mu.Lock()
	now := time.Now()
	if now.Sub(r.lastStallCheck) < stallCheckEvery {
		r.mu.Unlock()
		return
	}
	r.lastStallCheck = now
	n := r.eligibleLocked(now)
	r.mu.Unlock()
	r.progress.idle(n)
	if n > 0 {
		r.mu.Lock()
		r.stats.IdleReads++
		r.mu.Unlock()
	}
}
