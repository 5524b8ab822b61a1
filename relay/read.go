package relay

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/ordo-relay/ordo/internal/backoff"
	"github.com/ordo-relay/ordo/internal/outage"
)

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
		soonest(r.nextPassLocked(ps))
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
		for _, ps := range r.parts {
			// The safety net: a tail read of every partition, and a pass
			// of those not read from the start for passEvery. An
			// operator's retry or skip notifies the partition (admin), so
			// a parked key needs no faster look than this.
			ps.hot = true
			if time.Since(ps.lastPass) >= passEvery {
				ps.dirty = true
			}
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

// readState is what one read asked of one partition.
type readState struct {
	ps       *partState
	pass     bool  // a page of a pass, not a tail read
	before   int64 // the partition's cursor when the read began
	first    bool  // the first page of a pass
	notified bool  // a tail read for a notification
}

// readOnce reads one page of every held partition that wants one (a tail
// read or a page of a pass), while the read-ahead budget has room, and
// reports whether it read.
func (r *Relay) readOnce(ctx context.Context) (bool, error) {
	now := time.Now()
	r.mu.Lock()
	if r.bytes >= r.cfg.ReadAheadBytes && (len(r.ready) > 0 || len(r.flights) > 0) {
		r.mu.Unlock()
		return false, nil // memory is full: publishing and marks free it
	}
	r.pollDueLocked(now)
	var cursors []Cursor
	states := map[int]readState{}
	for p, ps := range r.parts {
		// A notified commit is read by a pass when the gap allows (it
		// finds a commit below the cursor too, at the cost of one read),
		// by a tail read now and a pass after the gap otherwise.
		pass := ps.reading || r.passDueLocked(ps, now) || (ps.notified && now.Sub(ps.lastPass) >= r.passGapLocked(ps))
		if !pass && !ps.hot {
			continue // nothing to read
		}
		if l, ok := r.own.Lease(p); !ok || l.Epoch != ps.epoch || !l.Valid(now) {
			continue
		}
		st := readState{ps: ps, pass: pass, before: ps.cursor}
		switch {
		case !pass:
			st.notified, ps.notified = ps.notified, false
			cursors = append(cursors, Cursor{Partition: p, After: ps.cursor})
		case !ps.reading:
			// A pass reads the tail too, up to its last page.
			ps.pass++
			ps.passCursor, ps.reading, ps.dirty, ps.lastPass, ps.passAt = 0, true, false, now, time.Time{}
			st.notified, st.first, ps.hot, ps.notified, ps.polledNew = ps.notified, true, false, false, false
			r.stats.Passes++
			fallthrough
		default:
			cursors = append(cursors, Cursor{Partition: p, After: ps.passCursor})
		}
		states[p] = st
	}
	clear(r.marked)
	clear(r.markedKeys)
	r.readFrom = r.writes
	r.mu.Unlock()
	if len(cursors) == 0 {
		return false, nil
	}
	limit := max(32, min(r.cfg.BatchSize, 2*r.cfg.BatchSize/len(cursors)))
	rctx, cancel := context.WithTimeout(ctx, r.cfg.ReadTimeout)
	began := time.Now()
	rows, err := r.store.ReadPending(rctx, cursors, limit)
	took := time.Since(began)
	cancel()
	r.progress.read(err)
	if err != nil {
		if rctx.Err() != nil && ctx.Err() == nil {
			err = fmt.Errorf("%w (the read took longer than %v)", err, r.cfg.ReadTimeout)
		}
		r.mu.Lock()
		for _, st := range states {
			st.ps.hot = st.ps.hot || !st.pass // read it again
			st.ps.notified = st.ps.notified || st.notified
		}
		r.mu.Unlock()
		return false, err
	}
	r.progress.leaseSkipped(r.ingestRead(states, rows, took, limit))
	return true, nil
}

// ingestRead stores what one read returned for the partitions in states
// and returns how many rows it left out because their partition was
// revoked or assigned again during the read.
func (r *Relay) ingestRead(states map[int]readState, rows []Row, took time.Duration, limit int) (skipped int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	r.stats.Reads++
	r.stats.ReadRows += int64(len(rows))
	r.stats.ReadSeconds += took.Seconds()
	r.lastReadTook = took
	byPart := map[int][]Row{}
	for _, row := range rows {
		byPart[row.Partition] = append(byPart[row.Partition], row)
	}
	for p, st := range states {
		got, ps := byPart[p], st.ps
		if r.parts[p] != ps {
			// The lease moved during the read: read again under the new one.
			skipped += len(got)
			continue
		}
		r.ingestLocked(ps, got)
		fresh := len(got) > 0 && got[len(got)-1].Seq > st.before
		short := len(got) < limit
		if st.pass {
			if len(got) > 0 {
				ps.passCursor = max(ps.passCursor, got[len(got)-1].Seq)
			}
			if fresh && st.notified {
				r.rateLocked(now, countAbove(got, st.before)) // commits, not a backlog
			}
			if fresh && !ps.armed && st.first && short {
				// New rows found by a pass of one short page (a relay
				// that has just started, say) may be overtaken as well; a
				// backlog's pass is not repeated for it (tail reads soon
				// find what commits next, and schedule the follow-ups).
				r.scheduleFollowUpsLocked(ps, now)
			}
			if short {
				ps.reading = false
				r.sweepLocked(ps)
				r.followUpLocked(ps)
			}
			continue
		}
		ps.hot = !short
		switch {
		case st.notified:
			// The notified commit may have landed below the cursor.
			r.rateLocked(now, len(got))
			ps.dirty = true
		case fresh:
			r.rateLocked(now, len(got)) // busy: poll, do not arm (wake.go)
			if !ps.armed {
				// Producers of an armed partition notify, and arming
				// waited for those that did not: follow-ups only while
				// it is polled.
				ps.polledNew = true
				r.scheduleFollowUpsLocked(ps, now)
			}
		}
	}
	r.stats.LeaseSkipped += int64(skipped)
	return skipped
}

// dispatch publishes every queued row the per-key rule and the window let
// go now, and returns how many it published. A Publish error (the broker
// went away) ends it; the row stays queued. So does ctx's end: a
// Publisher that settles or refuses every message inside Publish never
// fills the window, and Run must still stop.
func (r *Relay) dispatch(ctx context.Context) (int, error) {
	n := 0
	for {
		if ctx.Err() != nil {
			return n, nil // Run is stopping; readLoop sees it
		}
		f, leaseLost := r.nextFlight()
		if leaseLost {
			r.progress.leaseSkipped(1)
			continue
		}
		if f == nil {
			if n > 0 {
				r.progress.published()
			}
			return n, nil
		}
		if err := r.publish(ctx, f); err != nil {
			if n > 0 {
				r.progress.published()
			}
			return n, err
		}
		n++
	}
}

// nextFlight takes the next publishable head off the ready list and
// registers it as a flight, after checking its partition's live lease: the
// last check before the publish (docs/design.md, invariant 3). A Revoked is
// applied under r.mu too, so a handoff either finds this flight and waits
// for it, or the Ownership has already taken the lease away (before
// sending the Revoked) and this check refuses.
func (r *Relay) nextFlight() (f *flight, leaseLost bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	for len(r.flights) < r.cfg.Window && len(r.ready) > 0 {
		k := r.ready[0]
		r.ready[0] = nil
		r.ready = r.ready[1:]
		k.inReady = false
		if !r.currentLocked(k) {
			continue
		}
		e, ok := r.headLocked(k, now)
		if !ok {
			r.forgetIfIdleLocked(k)
			continue
		}
		l, held := r.own.Lease(k.part.id)
		if !held || l.Epoch != k.part.epoch || !l.Valid(now) {
			// Tried again on the next poll or ownership change: a late
			// renewal may bring the lease back.
			r.leaseWait[k] = true
			r.stats.LeaseSkipped++
			return nil, true
		}
		k.queue[0] = nil // the backing array would keep it alive
		k.queue = k.queue[1:]
		delete(k.part.queued, e.row.ID)
		f = &flight{key: k, e: e, size: e.size, attempts: e.row.Attempts, msg: Message{
			ID: e.row.ID, Partition: e.row.Partition, Epoch: k.part.epoch,
			CorrelationID: e.row.CorrelationID, KeySeq: e.row.KeySeq, PrevKeySeq: e.row.PrevKeySeq,
			Exchange: e.row.Exchange, RoutingKey: e.row.RoutingKey, Type: e.row.Type,
			Payload: e.row.Payload, OccurredAt: e.row.OccurredAt, Deadline: l.Deadline,
		}}
		r.startFlightLocked(f)
		k.inFlight++
		k.published = max(k.published, e.row.KeySeq)
		r.unconfirmed++
		r.stats.Published++
		r.lastPublish = now
		if r.perKeyLimit > 1 && !k.inReady && len(k.queue) > 0 {
			// Its next row goes right behind this one (tests only: the
			// rule is 1).
			k.inReady = true
			r.ready = append([]*keyState{k}, r.ready...)
		}
		return f, false
	}
	return nil, false
}

// publish hands f to the publisher, with the deadline of the lease it was
// checked against: the publisher's waits (for the broker, for confirms)
// can outlast the lease, and it must not write after the deadline. A row
// that cannot become a message (headers a plain INSERT wrote that AMQP
// cannot carry) fails like a nack: it backs off, is parked after
// MaxAttempts, and only its key waits.
func (r *Relay) publish(ctx context.Context, f *flight) error {
	if f.e.row.PrevDead {
		lctx, cancel := context.WithTimeout(ctx, r.cfg.ReadTimeout)
		prev, err := r.store.PrevKeySeq(lctx, f.msg.CorrelationID, f.msg.KeySeq)
		cancel()
		if err != nil {
			r.unsend(f)
			return err
		}
		f.msg.PrevKeySeq = prev
		// A check followed by a wait is not a check: the lease again.
		l, held := r.own.Lease(f.msg.Partition)
		if !held || l.Epoch != f.msg.Epoch || !l.Valid(time.Now()) {
			r.unsend(f)
			r.progress.leaseSkipped(1)
			return nil
		}
		f.msg.Deadline = l.Deadline
	}
	headers, bad := decodeHeaders(f.e.row.Headers)
	if bad != nil {
		r.settle(f, Result{Outcome: Failed, Err: fmt.Errorf("unpublishable row: %w", bad)})
		return nil
	}
	f.msg.Headers = headers
	ctx = r.startSpan(ctx, f)
	if err := r.pub.Publish(ctx, &f.msg, func(res Result) { r.settle(f, res) }); err != nil {
		spanNotSent(f, err)
		r.unsend(f)
		if errors.Is(err, ErrLeaseExpired) {
			// The publisher waited past the lease deadline and sent
			// nothing: the row waits for a valid lease, like one that
			// found it lapsed before the publish.
			r.progress.leaseSkipped(1)
			return nil
		}
		return &publishError{err}
	}
	return nil
}

// publishError is a Publish failure: the message was not sent.
type publishError struct{ err error }

func (e *publishError) Error() string { return e.err.Error() }
func (e *publishError) Unwrap() error { return e.err }

// countAbove counts the rows of got (in seq order) above seq.
func countAbove(got []Row, seq int64) int {
	i, _ := slices.BinarySearchFunc(got, seq+1, func(r Row, s int64) int { return cmp.Compare(r.Seq, s) })
	return len(got) - i
}
