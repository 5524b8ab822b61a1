package relay

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ordo-relay/ordo/internal/backoff"
	"github.com/ordo-relay/ordo/internal/outage"
)

// How reads find every pending row without walking the backlog.
//
// Each held partition is read in passes. A pass reads the partition's
// pending rows in seq order, a page at a time, each page continuing above
// the highest seq the last one returned, until a page comes back short.
// A cursor alone would miss a row whose transaction commits after a later
// row was read (DESIGN.md: never read seq > cursor and trust it), so the
// cursor is only where the current pass stands: order never depends on it
// (each row says whether the row below it in its key was pending, and a
// key goes on only once that row is confirmed here or was processed), and
// a new pass starts over from the partition's first pending row whenever a
// producer's commit notifies the partition (at most every minPassGap) and
// at least every passEvery while the relay polls. A pass that has read
// everything forgets the queued rows it did not see again.
//
// So a read costs the rows it returns; a pass costs the partition's
// pending rows, and passes run only when something was committed (or as a
// slow safety net), not after every publish.
const (
	minPassGap      = 100 * time.Millisecond
	passEvery       = 5 * time.Second
	stallCheckEvery = 100 * time.Millisecond
)

// notified is the Store's Listen callback: partition p (or every one, for
// -1) has new commits.
func (r *Relay) notified(p int) {
	r.mu.Lock()
	hit := false
	for id, ps := range r.parts {
		if p < 0 || id == p {
			ps.dirty, hit = true, true
		}
	}
	r.mu.Unlock()
	// Another node's partition is another node's business: with N nodes,
	// waking on every notification would make N reads of every commit.
	if hit || p < 0 {
		signal(r.wakeRead)
	}
}

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
			continue
		}
		if published > 0 {
			continue
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
	for _, ps := range r.parts {
		// A notification that came within minPassGap of the last pass
		// starts the next one when the gap is over.
		if ps.dirty && !ps.reading {
			if at := ps.lastPass.Add(minPassGap); at.After(now) && (next.IsZero() || at.Before(next)) {
				next = at
			}
		}
	}
	r.mu.Unlock()
	if !next.IsZero() {
		retry.Reset(max(time.Until(next), time.Millisecond))
	}
	select {
	case <-ctx.Done():
		return false
	case <-r.wakeRead:
	case <-retry.C:
	case <-poll:
		r.mu.Lock()
		for _, ps := range r.parts {
			// An operator's retry or skip notifies the partition (admin),
			// so a parked key needs no faster look than this.
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

// readOnce reads one page of every held partition that wants one, while
// the read-ahead budget has room, and reports whether it read.
func (r *Relay) readOnce(ctx context.Context) (bool, error) {
	now := time.Now()
	r.mu.Lock()
	if r.bytes >= r.cfg.ReadAheadBytes && (len(r.ready) > 0 || len(r.flights) > 0) {
		r.mu.Unlock()
		return false, nil // memory is full: publishing and marks free it
	}
	var cursors []Cursor
	states := map[int]*partState{}
	for p, ps := range r.parts {
		if !ps.reading && (!ps.dirty || now.Sub(ps.lastPass) < minPassGap) {
			continue // nothing to read
		}
		if l, ok := r.own.Lease(p); !ok || l.Epoch != ps.epoch || !l.Valid(now) {
			continue
		}
		if !ps.reading {
			ps.pass++
			ps.cursor, ps.reading, ps.dirty, ps.lastPass = 0, true, false, now
			r.stats.Passes++
		}
		cursors = append(cursors, Cursor{Partition: p, After: ps.cursor})
		states[p] = ps
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
		return false, err
	}
	r.progress.leaseSkipped(r.ingestRead(states, rows, took, limit))
	return true, nil
}

// ingestRead stores what one read returned for the partitions in states
// and returns how many rows it left out because their partition was
// revoked or assigned again during the read.
func (r *Relay) ingestRead(states map[int]*partState, rows []Row, took time.Duration, limit int) (skipped int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stats.Reads++
	r.stats.ReadRows += int64(len(rows))
	r.stats.ReadSeconds += took.Seconds()
	byPart := map[int][]Row{}
	for _, row := range rows {
		byPart[row.Partition] = append(byPart[row.Partition], row)
	}
	for p, ps := range states {
		got := byPart[p]
		if r.parts[p] != ps {
			// The lease moved during the read: read again under the new one.
			skipped += len(got)
			continue
		}
		r.ingestLocked(ps, got)
		if len(got) < limit {
			ps.reading = false
			r.sweepLocked(ps)
		}
	}
	r.stats.LeaseSkipped += int64(skipped)
	return skipped
}

// dispatch publishes every queued row the per-key rule and the window let
// go now, and returns how many it published. A Publish error (the broker
// went away) ends it; the row stays queued.
func (r *Relay) dispatch(ctx context.Context) (int, error) {
	n := 0
	for {
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
// last check before the publish (DESIGN.md invariant 3). A Revoked is
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
		r.flights[e.row.ID] = f
		k.inFlight++
		k.flights++
		k.part.flights++
		k.published = max(k.published, e.row.KeySeq)
		r.unconfirmed++
		r.stats.Published++
		r.lastPublish = now
		if r.cfg.PerKeyLimit > 1 && !k.inReady && len(k.queue) > 0 {
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
