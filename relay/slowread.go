package relay

import (
	"context"
	"fmt"
	"time"

	"github.com/ordo-relay/ordo/internal/backoff"
)

// Slow reads: one row too big or too slow to read must not stall every
// partition (docs/design.md, "A slow row is read alone"). A read that
// outlasts ReadTimeout returns nothing, so a row that makes every read of
// its partition time out would, if read with the others, keep every
// partition from moving. So:
//
//   - a read of several partitions that times out splits: each of them is
//     read alone from then on, taking turns with the reads of the others,
//     until a read of it at the full page succeeds;
//   - a partition read alone that times out is read a row at a time, and
//     each read of it that succeeds doubles its page, up to the full page;
//   - a lone row that still times out is peeked at (PeekPending: no
//     payload) and charged an attempt (RecordFailures), so it parks after
//     MaxAttempts like a row the broker refuses; its partition is not read
//     again before the attempt's backoff has passed. If the peek times out
//     too, the database is slow, not the row, and nothing is charged.
//
// A partition holding such a row stands still until the row is parked
// (every read of it starts at or below the row); the others flow.

// slowRead is where one partition stands after reads of it timed out.
// Guarded by Relay.mu; only its methods change it.
type slowRead struct {
	alone     bool      // read on its own, not with the other partitions
	page      int       // its page while alone (0: the full page)
	notBefore time.Time // a row of it was charged: not read again before
	tried     time.Time // when it was last read alone (they take turns)
}

// blocked reports whether the partition must not be read at now.
func (s *slowRead) blocked(now time.Time) bool { return now.Before(s.notBefore) }

// limit is the page of a read of the partition alone, full being the page
// of a partition read alone in normal times.
func (s *slowRead) limit(full int) int {
	if s.page == 0 {
		return full
	}
	return min(s.page, full)
}

// timedOut takes in a read that outlasted the read timeout: with others
// (together), or alone with page limit. It reports whether the row read
// alone should be charged an attempt.
func (s *slowRead) timedOut(together bool, limit int) (charge bool) {
	switch {
	case together:
		s.alone = true
	case limit > 1:
		s.alone, s.page = true, 1
	default:
		return true
	}
	return false
}

// readOK takes in a read of the partition alone at page limit that
// succeeded: it doubles the page, and a read at the full page ends the
// partition's time alone.
func (s *slowRead) readOK(limit, full int) {
	if limit >= full {
		s.alone, s.page = false, 0
		return
	}
	s.page = limit * 2
}

// readPlan is one read: its cursors and requests, its page, and the
// partition it reads alone (nil: the partitions read together).
type readPlan struct {
	cursors []Cursor
	reqs    map[int]readReq
	limit   int
	alone   *partState
}

// wanted is a partition that wants a read, and whether a pass.
type wanted struct {
	ps   *partState
	pass bool
}

// planReadLocked chooses the next read among the held partitions that
// want one: the partitions read together, or the one read alone that
// waited longest, in turns when both want reads; and begins it. With
// passesWait, a partition that wants only a new pass waits for the next
// poll's read (passesWaitForPollLocked).
func (r *Relay) planReadLocked(now time.Time, passesWait bool) readPlan {
	var together []wanted
	var alone *wanted
	for p, ps := range r.parts {
		read, pass := ps.rd.wants(now, r.passGapLocked(ps))
		if !read || passesWait && ps.rd.passOnly() {
			continue // nothing to read, or a pass that waits for the next poll
		}
		if l, ok := r.own.Lease(p); !ok || l.Epoch != ps.epoch || !l.Valid(now) {
			continue
		}
		switch {
		case !ps.slow.alone:
			together = append(together, wanted{ps, pass})
		case ps.slow.blocked(now):
		case alone == nil || ps.slow.tried.Before(alone.ps.slow.tried):
			alone = &wanted{ps, pass}
		}
	}
	plan := readPlan{reqs: map[int]readReq{}}
	if alone != nil && (len(together) == 0 || r.aloneTurn) {
		together, plan.alone = []wanted{*alone}, alone.ps
		alone.ps.slow.tried = now
		plan.limit = alone.ps.slow.limit(r.cfg.BatchSize)
	} else if len(together) > 0 {
		plan.limit = max(32, min(r.cfg.BatchSize, 2*r.cfg.BatchSize/len(together)))
	}
	if alone != nil && len(together) > 0 {
		r.aloneTurn = !r.aloneTurn
	}
	for _, w := range together {
		req, after := w.ps.rd.begin(w.pass, now)
		req.ps = w.ps
		if req.first {
			r.stats.Passes++
		}
		plan.cursors = append(plan.cursors, Cursor{Partition: w.ps.id, After: after})
		plan.reqs[w.ps.id] = req
	}
	return plan
}

// splitReadError is a read that outlasted ReadTimeout after which the
// next read differs (split, a smaller page, a row charged): it is retried
// at once, having waited ReadTimeout already.
type splitReadError struct{ err error }

func (e *splitReadError) Error() string { return e.err.Error() }
func (e *splitReadError) Unwrap() error { return e.err }

// readTimedOut takes in plan's read, which outlasted ReadTimeout with err:
// it splits the partitions read together, shrinks the page of one read
// alone, and charges a lone row an attempt. It returns err, as a
// splitReadError if it changed the next read.
func (r *Relay) readTimedOut(ctx context.Context, plan readPlan, err error) error {
	r.mu.Lock()
	r.stats.SlowReads++
	var charge bool
	for _, req := range plan.reqs {
		if r.parts[req.ps.id] == req.ps {
			charge = req.ps.slow.timedOut(len(plan.reqs) > 1, plan.limit)
		}
	}
	r.mu.Unlock()
	if charge && (plan.alone == nil || !r.chargeSlowRow(ctx, plan.alone, plan.cursors[0])) {
		return err // the database is slow, not a row: back off
	}
	return &splitReadError{err}
}

// slowRowError is the failure recorded for a row too slow to read.
const slowRowError = "reading the row alone took longer than the read timeout (%v): too big or too slow to read"

// chargeSlowRow charges an attempt to the row of partition ps above cursor
// c, which a read of it alone could not return in time, if a peek finds
// it (without its payload) in time; the partition is not read again
// before the attempt's backoff. A row the relay holds already (queued or
// in flight) is left alone: its publish settles it. It reports whether
// the peek answered in time.
func (r *Relay) chargeSlowRow(ctx context.Context, ps *partState, c Cursor) bool {
	rctx, cancel := context.WithTimeout(ctx, r.cfg.ReadTimeout)
	defer cancel()
	rows, err := r.store.PeekPending(rctx, c, 1)
	if err != nil || len(rows) == 0 {
		// The database is slow, not the row (or the row is gone).
		r.cfg.Logger.Debug("no attempt charged for a slow read: the peek failed too", "partition", ps.id, "err", err)
		return err == nil
	}
	row := rows[0]
	now := time.Now()
	r.mu.Lock()
	held := r.parts[ps.id] != ps || ps.queued[row.ID] != nil || r.flights.has(row.ID)
	if !held && row.NextAttemptAt.After(now) {
		ps.slow.notBefore, held = row.NextAttemptAt, true // charged already
	}
	r.mu.Unlock()
	if held || row.Parked {
		return true
	}
	delay := backoff.Attempt(row.Attempts, r.cfg.RetryMin, r.cfg.RetryMax)
	parked, err := r.store.RecordFailures(rctx, []Settled{{ID: row.ID, Partition: row.Partition, Epoch: ps.epoch,
		Err: fmt.Sprintf(slowRowError, r.cfg.ReadTimeout), Delay: delay}}, r.cfg.MaxAttempts)
	if err != nil {
		r.cfg.Logger.Warn("could not charge an attempt to a row too slow to read", "id", row.ID, "err", err)
		return false
	}
	r.mu.Lock()
	ps.slow.notBefore = time.Now().Add(delay)
	r.stats.SlowRows++
	r.stats.Parked += int64(len(parked))
	r.mu.Unlock()
	r.cfg.Logger.Warn("a row too slow to read alone was charged an attempt; its partition waits for it",
		"id", row.ID, "partition", row.Partition, "key", row.CorrelationID, "attempts", row.Attempts+1,
		"parked", len(parked) > 0, "read_timeout", r.cfg.ReadTimeout)
	return true
}
