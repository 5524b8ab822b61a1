package relay

import (
	"context"
	"time"

	"github.com/google/uuid"

	"github.com/ordo-relay/ordo/internal/backoff"
	"github.com/ordo-relay/ordo/internal/outage"
)

// The write-back: settlements (confirmed, or failed) are written to the
// Store in batches by their own loop, so publishing never waits for a
// mark. Each write ends its flights and tells the read generation.

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
		case <-r.wake.mark:
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
			signal(r.wake.mark)
			continue
		}
		down.OK()
		bo.Reset()
		if stopping {
			return
		}
	}
}

// markBatch and the lingers: a mark waits for markBatch settlements to
// gather, up to markLinger while rows read ahead wait to be published (a
// backlog: unmarked rows come back in every read of their partition, so
// marks must keep up), and up to caughtUpLinger while none do (a steady
// rate the relay keeps up with: each confirm would otherwise be a mark of
// its own, 0.8 marks per message at 200 commits a second). Publishing
// does not wait for marks: a key's next row goes once the row below is
// confirmed. What a linger holds is window slots (rate × linger) and,
// should the node die, that many rows published again.
const (
	markBatch      = 64
	markLinger     = 2 * time.Millisecond
	caughtUpLinger = 10 * time.Millisecond
)

// writeBack is the settlements not yet written (confirmed: to mark;
// failed: to record), writeback.go's: settle adds them, flush takes them
// all, and a write that failed puts its own back. Guarded by Relay.mu.
type writeBack struct{ queued []settlement }

func (w *writeBack) add(s ...settlement) { w.queued = append(w.queued, s...) }

func (w *writeBack) take() []settlement {
	q := w.queued
	w.queued = nil
	return q
}

func (w *writeBack) len() int { return len(w.queued) }

// gather waits, woken by each settlement, while fewer than markBatch
// settlements are queued: up to caughtUpLinger if no row read ahead waits
// to be published, else up to markLinger.
func (r *Relay) gather(ctx context.Context) {
	r.mu.Lock()
	linger := caughtUpLinger
	if r.readAheadLocked() > 0 {
		linger = markLinger
	}
	r.mu.Unlock()
	t := time.NewTimer(linger)
	defer t.Stop()
	for {
		r.mu.Lock()
		enough := r.settled.len() >= markBatch
		r.mu.Unlock()
		if enough {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			return
		case <-r.wake.mark:
		}
	}
}

// flush writes every queued settlement: marks for the confirmed, failure
// records for the rest. What it could not write stays queued.
func (r *Relay) flush(ctx context.Context) error {
	r.mu.Lock()
	q := r.settled.take()
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
		r.settled.add(l...)
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
	marked, err := r.store.MarkPublished(ctx, rows)
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
		r.gen.mark(s.f.msg.ID, s.f.msg.CorrelationID, s.f.msg.KeySeq)
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
	signal(r.wake.dispatch) // the window has room
	signal(r.wake.read)     // and so has memory
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
	parked, err := r.store.RecordFailures(ctx, rows, r.cfg.MaxAttempts)
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
	gen := r.gen.failuresRecorded()
	for i, s := range failed {
		f := s.f
		f.key.failGen = gen
		if done := r.endFlightLocked(f); done != nil {
			handedOff = append(handedOff, done)
		}
		f.e.row.Attempts = f.attempts + 1
		f.e.row.Parked = isParked[f.msg.ID]
		spanRecorded(f, f.e.row.Parked, f.e.row.Attempts, r.cfg.MaxAttempts)
		r.requeueLocked(f, now.Add(delays[i]))
		if f.e.row.Parked && r.currentLocked(f.key) {
			r.parkHeadLocked(f.key)
		}
	}
	r.stats.Failed += int64(len(failed))
	r.stats.Parked += int64(len(parked))
	r.mu.Unlock()
	for _, done := range handedOff {
		done()
	}
	signal(r.wake.dispatch)
	signal(r.wake.read)
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
