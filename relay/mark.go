package relay

import (
	"context"
	"time"

	"github.com/google/uuid"

	"github.com/ordo-relay/ordo/internal/backoff"
	"github.com/ordo-relay/ordo/internal/outage"
)

// settle is the Publisher's callback. It never blocks. A confirm lets the
// key's next row go at once; the mark follows in a batch. A failure puts
// the row back at its key's head, backing off, until the failure is
// recorded. Unsent puts it back as it was, to go again at once the first
// time and after unsentDelay when it is Unsent again (no attempt counted).
func (r *Relay) settle(f *flight, res Result) {
	spanSettled(f, res)
	var done func()
	r.mu.Lock()
	r.unconfirmed--
	k := f.key
	k.inFlight--
	switch res.Outcome {
	case Confirmed:
		f.confirmed = true
		k.confirmed = max(k.confirmed, f.msg.KeySeq)
		r.queue = append(r.queue, settlement{f, res})
	case Unsent:
		r.stats.Unsent++
		done = r.endFlightLocked(f)
		f.e.unsent++
		r.requeueLocked(f, time.Now().Add(r.unsentDelay(f.e.unsent)))
	default:
		f.e.unsent = 0
		k.writing++
		r.queue = append(r.queue, settlement{f, res})
	}
	r.pushReadyLocked(k)
	r.mu.Unlock()
	if done != nil {
		done()
	}
	if res.Outcome != Unsent {
		signal(r.wakeMark)
	}
	signal(r.wakeRead)
}

// unsentMaxDelay caps the wait of a row Unsent again and again.
const unsentMaxDelay = time.Second

// unsentDelay is how long a row waits before going again after its n-th
// Unsent in a row: nothing the first time (a channel closed under
// innocent messages, which go again as soon as the publisher is back),
// then RetryMin doubling, up to RetryMax or unsentMaxDelay. A Publisher
// may settle Unsent inside Publish; without the wait the relay would
// publish the row again at once, in the same dispatch, forever.
func (r *Relay) unsentDelay(n int) time.Duration {
	if n <= 1 {
		return 0
	}
	return backoff.Attempt(n-2, r.cfg.RetryMin, min(r.cfg.RetryMax, unsentMaxDelay))
}

// unsend takes back a flight that was never sent.
func (r *Relay) unsend(f *flight) {
	r.mu.Lock()
	r.unconfirmed--
	f.key.inFlight--
	r.stats.Published--
	done := r.endFlightLocked(f)
	r.requeueLocked(f, time.Time{})
	r.mu.Unlock()
	if done != nil {
		done()
	}
}

// requeueLocked puts f's row back at the head of its key's queue (if its
// partition is still held at the same epoch), not to be tried before
// notBefore.
func (r *Relay) requeueLocked(f *flight, notBefore time.Time) {
	k := f.key
	if !r.currentLocked(k) {
		return
	}
	e := f.e
	e.seen = k.part.pass
	e.row.NextAttemptAt = notBefore
	k.queue = append([]*entry{e}, k.queue...)
	k.part.queued[e.row.ID] = e
	r.bytes += e.size
	r.pushReadyLocked(k)
}

// markLoop writes settlements to the store until ctx ends; then it
// flushes once more.
func (r *Relay) markLoop(ctx context.Context) {
	down := outage.New(r.cfg.Logger, "PostgreSQL (outbox marks)")
	bo := backoff.New(50*time.Millisecond, 2*time.Second)
	for {
		stopping := false
		select {
		case <-ctx.Done():
			stopping = true
		case <-r.wakeMark:
			r.gather(ctx)
		}
		wctx := ctx
		if stopping {
			var cancel context.CancelFunc
			wctx, cancel = context.WithTimeout(context.Background(), r.cfg.SettleTimeout)
			defer cancel()
		}
		err := r.flush(wctx)
		if err != nil {
			if stopping {
				r.cfg.Logger.Warn("stopping with confirmed rows unmarked; they will be published again", "err", err)
				return
			}
			down.Fail(err)
			backoff.Sleep(ctx, bo.Next())
			signal(r.wakeMark)
			continue
		}
		down.OK()
		bo.Reset()
		if stopping {
			return
		}
	}
}

// markBatch and markLinger: a mark waits up to markLinger for markBatch
// settlements to gather, so a hot key confirmed one message at a time is
// not marked one UPDATE per message. Publishing does not wait for marks.
const (
	markBatch  = 64
	markLinger = 2 * time.Millisecond
)

// gather waits up to markLinger while fewer than markBatch settlements are
// queued.
func (r *Relay) gather(ctx context.Context) {
	deadline := time.Now().Add(markLinger)
	for time.Now().Before(deadline) {
		r.mu.Lock()
		n := len(r.queue)
		r.mu.Unlock()
		if n >= markBatch || ctx.Err() != nil {
			return
		}
		time.Sleep(markLinger / 4)
	}
}

// flush writes every queued settlement: marks for the confirmed, failure
// records for the rest. What it could not write stays queued.
func (r *Relay) flush(ctx context.Context) error {
	r.mu.Lock()
	q := r.queue
	r.queue = nil
	r.mu.Unlock()
	var confirmed, failed []settlement
	for _, s := range q {
		if s.res.Outcome == Confirmed {
			confirmed = append(confirmed, s)
		} else {
			failed = append(failed, s)
		}
	}
	if err := r.markConfirmed(ctx, confirmed); err != nil {
		r.requeueSettlements(confirmed, failed)
		return err
	}
	if err := r.recordFailures(ctx, failed); err != nil {
		r.requeueSettlements(failed)
		return err
	}
	return nil
}

func (r *Relay) requeueSettlements(lists ...[]settlement) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, l := range lists {
		r.queue = append(r.queue, l...)
	}
}

// markConfirmed marks confirmed rows processed, epoch-checked, and lets
// their flights go.
func (r *Relay) markConfirmed(ctx context.Context, confirmed []settlement) error {
	if len(confirmed) == 0 {
		return nil
	}
	rows := make([]Settled, len(confirmed))
	for i, s := range confirmed {
		rows[i] = Settled{ID: s.f.msg.ID, Partition: s.f.msg.Partition, Epoch: s.f.msg.Epoch}
	}
	began := time.Now()
	marked, err := r.store.MarkPublished(ctx, r.cfg.Node, rows)
	took := time.Since(began)
	if err != nil {
		return err
	}
	ok := make(map[uuid.UUID]bool, len(marked))
	for _, id := range marked {
		ok[id] = true
	}
	refused := 0
	var handedOff []func()
	r.mu.Lock()
	for _, s := range confirmed {
		if !ok[s.f.msg.ID] {
			refused++
		}
		r.marked[s.f.msg.ID] = true
		r.markedKeys[s.f.msg.CorrelationID] = max(r.markedKeys[s.f.msg.CorrelationID], s.f.msg.KeySeq)
		if done := r.endFlightLocked(s.f); done != nil {
			handedOff = append(handedOff, done)
		}
		r.forgetIfIdleLocked(s.f.key)
	}
	r.stats.Marks++
	r.stats.MarkSeconds += took.Seconds()
	r.stats.Confirmed += int64(len(confirmed))
	r.stats.Marked += int64(len(marked))
	r.stats.Refused += int64(refused)
	r.mu.Unlock()
	for _, done := range handedOff {
		done()
	}
	signal(r.wakeRead) // the window has room
	if refused > 0 {
		r.cfg.Logger.Warn("marks refused: lease no longer held at the published epoch, or row already processed",
			"refused", refused)
	}
	return nil
}

// recordFailures counts one attempt per failed row, epoch-checked, with
// its error and backoff, and parks the rows that reached MaxAttempts. The
// row waits at its key's head meanwhile.
func (r *Relay) recordFailures(ctx context.Context, failed []settlement) error {
	if len(failed) == 0 {
		return nil
	}
	rows := make([]Settled, len(failed))
	delays := make([]time.Duration, len(failed))
	for i, s := range failed {
		delays[i] = backoff.Attempt(s.f.attempts, r.cfg.RetryMin, r.cfg.RetryMax)
		rows[i] = Settled{ID: s.f.msg.ID, Partition: s.f.msg.Partition, Epoch: s.f.msg.Epoch, Err: s.res.Err.Error(), Delay: delays[i]}
	}
	parked, err := r.store.RecordFailures(ctx, r.cfg.Node, rows, r.cfg.MaxAttempts)
	if err != nil {
		return err
	}
	isParked := make(map[uuid.UUID]bool, len(parked))
	for _, id := range parked {
		isParked[id] = true
	}
	now := time.Now()
	var handedOff []func()
	r.mu.Lock()
	r.writes++
	for i, s := range failed {
		f := s.f
		f.key.lastWrite = r.writes
		if done := r.endFlightLocked(f); done != nil {
			handedOff = append(handedOff, done)
		}
		f.key.writing--
		f.e.row.Attempts = f.attempts + 1
		f.e.row.Parked = isParked[f.msg.ID]
		spanRecorded(f, f.e.row.Parked, f.e.row.Attempts, r.cfg.MaxAttempts)
		r.requeueLocked(f, now.Add(delays[i]))
		if f.e.row.Parked && r.currentLocked(f.key) {
			r.dropFollowersLocked(f.key)
		}
	}
	r.stats.Failed += int64(len(failed))
	r.stats.Parked += int64(len(parked))
	r.mu.Unlock()
	for _, done := range handedOff {
		done()
	}
	signal(r.wakeRead)
	for _, s := range failed {
		r.cfg.Logger.Debug("publish failed; key backs off", "id", s.f.msg.ID, "key", s.f.msg.CorrelationID,
			"outcome", s.res.Outcome, "err", s.res.Err)
	}
	for _, id := range parked {
		r.cfg.Logger.Warn("message parked after repeated failures; its key waits for an operator (retry or skip)",
			"id", id, "attempts", r.cfg.MaxAttempts)
	}
	return nil
}
