package relay

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"
)

// Reads: which partitions to read and from where (each partition's
// partReader, pass.go, decides), the read itself, and taking its rows into
// the keys' queues in memory, judged by the read generation (readgen.go).

// readOnce reads one page of every held partition that wants one (a tail
// read or a page of a pass), while the read-ahead budget has room, and
// reports whether it read.
func (r *Relay) readOnce(ctx context.Context) (bool, error) {
	now := time.Now()
	r.mu.Lock()
	if r.readRefusedLocked() {
		r.mu.Unlock()
		return false, nil // memory is full: publishing and marks free it
	}
	polling := r.pollDueLocked(now)
	plan := r.planReadLocked(now, !polling && r.passesWaitForPollLocked())
	r.gen.begin()
	r.mu.Unlock()
	if len(plan.cursors) == 0 {
		return false, nil
	}
	rctx, cancel := context.WithTimeout(ctx, r.cfg.ReadTimeout)
	began := time.Now()
	rows, err := r.store.ReadPending(rctx, plan.cursors, plan.limit)
	took := time.Since(began)
	cancel()
	r.progress.read(err)
	if err != nil {
		timedOut := rctx.Err() != nil && ctx.Err() == nil
		if timedOut {
			err = fmt.Errorf("%w (the read took longer than %v)", err, r.cfg.ReadTimeout)
		}
		r.mu.Lock()
		for _, req := range plan.reqs {
			req.ps.rd.readFailed(req)
		}
		r.mu.Unlock()
		if timedOut && !errors.Is(err, ErrNoConnection) {
			// It timed out waiting for a connection: the server is
			// slow, not the rows (ErrNoConnection). Back off.
			err = r.readTimedOut(ctx, plan, err)
		}
		return false, err
	}
	r.progress.leaseSkipped(r.ingestRead(plan, rows, took))
	return true, nil
}

// readRefusedLocked reports whether the read-ahead is full: the relay
// then reads nothing until publishing and marks free memory, unless it has
// nothing to publish (one row is always allowed, however large). With a
// Budget it asks for bytes every time, so that a relay refused them is
// known to be waiting for them (budget.go).
//
// After a read left rows out for memory, the next waits until half of
// what memory held then is free: a read per freed row would read a page
// to keep a row or two of it (memory.refused).
func (r *Relay) readRefusedLocked() bool {
	return r.mem.refused() && (r.queues.waiting() > 0 || r.flights.live() > 0)
}

// ingestRead stores what plan's read returned for its partitions and
// returns how many rows it left out because their partition was
// revoked or assigned again during the read.
func (r *Relay) ingestRead(plan readPlan, rows []Row, took time.Duration) (skipped int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	r.stats.Reads++
	r.stats.ReadRows += int64(len(rows))
	r.stats.ReadSeconds += took.Seconds()
	r.wake.readTook(took)
	byPart := byPartition(rows, len(plan.reqs))
	limit := plan.limit
	for p, req := range plan.reqs {
		got, ps := byPart[p], req.ps
		if r.parts[p] != ps {
			// The lease moved during the read: read again under the new one.
			skipped += len(got)
			continue
		}
		if plan.alone == ps {
			ps.slow.readOK(limit, r.cfg.BatchSize)
		}
		if req.first {
			// A new pass reads every key from its first pending row:
			// the gaps are found again.
			for _, k := range ps.keys {
				k.gapFrom = 0
			}
		}
		leftOut := r.ingestLocked(ps, got)
		commits, counted, passDone := ps.rd.pageRead(req, got, limit, leftOut, now, r.passGapLocked(ps))
		if counted {
			r.rateLocked(now, commits)
		}
		if passDone {
			r.sweepLocked(ps)
			ps.rd.passEnded(r.passGapLocked(ps))
		}
	}
	r.stats.LeaseSkipped += int64(skipped)
	return skipped
}

// byPartition groups a read's rows by partition (parts: how many the
// read asked for). A read returns each partition's rows together, one
// range scan after another, so a group is a piece of rows, not a copy:
// copying every row of a drain cost a capped node a tenth of its
// allocations. The pieces are clipped, so a partition whose rows come
// apart is copied, and never overwrites the rows after its first piece.
func byPartition(rows []Row, parts int) map[int][]Row {
	out := make(map[int][]Row, parts)
	for i := 0; i < len(rows); {
		p, j := rows[i].Partition, i+1
		for j < len(rows) && rows[j].Partition == p {
			j++
		}
		if got, ok := out[p]; ok {
			out[p] = append(got, rows[i:j]...)
		} else {
			out[p] = rows[i:j:j]
		}
		i = j
	}
	return out
}

// ingestLocked stores the rows one read returned for partition ps: rows
// in flight or marked since the read began are ignored, rows already
// queued take the database's word on their state if it is newer than
// memory's (readGen), and new rows join their key's queue in key_seq
// order. A parked row's followers are not kept: they cannot go before an
// operator acts, and the next pass reads them again. It returns the seq of
// the first row it left out for memory (0: none).
//
// Memory holds each key's rows without a gap: once a row of a key is left
// out because memory is full, the key's rows above it are left out too
// (keyState.gapFrom) until it is read again and kept, or a new pass
// starts over. A row above a gap cannot go before the gap is read, and a
// memory full of such rows holds nothing that may go: each pass from the
// partition's first pending row then let one row of each key in, the one
// just below its queue (TestCoreReadAheadFullKeepsKeysContiguous,
// TestIngestKeepsKeysContiguous).
func (r *Relay) ingestLocked(ps *partState, rows []Row) (leftOut int64) {
	for i := range rows {
		row := rows[i]
		ps.rd.saw(row.Seq)
		if r.flights.has(row.ID) || r.gen.wasMarked(row.ID) {
			continue
		}
		if row.BehindParked {
			// It waits for an operator, and the Store leaves it out of
			// later reads: not kept, and forgotten if it was.
			if e := ps.queued[row.ID]; e != nil {
				r.forgetLocked(ps, e)
			}
			continue
		}
		if row.PrevPending && r.gen.prevMarked(&row) {
			// The row below was marked after this read began: it was
			// pending when read, and is not now.
			row.PrevPending = false
		}
		k := ps.key(row.CorrelationID)
		if e := ps.queued[row.ID]; e != nil {
			if r.gen.rowNewer(k) {
				// A row parked since it was queued is charged nothing
				// now, and one retried since it was read parked is
				// charged its payload.
				e.row = row
				r.mem.resize(&e.size, rowSize(&row))
			}
			e.seen = ps.rd.passNo()
			r.pushReadyLocked(k)
			continue
		}
		if len(k.rows) > 0 && k.rows[0].row.Parked && row.KeySeq > k.rows[0].row.KeySeq {
			continue
		}
		e := &entry{row: row, seen: ps.rd.passNo(), size: rowSize(&row)}
		at, _ := slices.BinarySearchFunc(k.rows, row.KeySeq, func(x *entry, ks int64) int {
			return int(min(max(x.row.KeySeq-ks, -1), 1))
		})
		gap := k.gapFrom > 0 && row.KeySeq > k.gapFrom
		full := !gap && at > 0 && r.mem.full()
		if gap || full {
			// Above its key's gap, or memory is full and the row waits
			// behind others of its key: leave it for later (pageRead
			// says when); after a row left out for memory, read again
			// only once half of what memory holds is free (readRefusedLocked).
			if leftOut == 0 {
				leftOut = row.Seq
			}
			if full {
				k.gapFrom = row.KeySeq
				r.mem.leftOut()
			}
			continue
		}
		if row.KeySeq == k.gapFrom {
			k.gapFrom = 0 // the gap is read: the rows above it may follow
		}
		k.rows = slices.Insert(k.rows, at, e)
		ps.queued[row.ID] = e
		r.mem.add(e.size)
		if at == 0 && row.Parked {
			r.parkHeadLocked(k)
		}
		r.pushReadyLocked(k)
	}
	return leftOut
}

// parkHeadLocked is k's head parked: the queued rows behind it are
// forgotten (the pass after an operator acts reads them again), and the
// head keeps only what says where the key stands, charged nothing to
// memory (rowSize): a parked key must not take the read-ahead of the keys
// that may go.
func (r *Relay) parkHeadLocked(k *keyState) {
	head := k.rows[0]
	head.row.Payload, head.row.Headers = nil, nil
	r.mem.resize(&head.size, rowSize(&head.row))
	for _, e := range k.rows[1:] {
		delete(k.part.queued, e.row.ID)
		r.mem.add(-e.size)
	}
	clear(k.rows[1:]) // the backing array would keep them alive
	k.rows = k.rows[:1]
}

// sweepLocked ends a pass of ps: queued rows the pass did not see are no
// longer pending (an operator skipped or purged them, or another owner
// published them) and are forgotten.
func (r *Relay) sweepLocked(ps *partState) {
	for _, e := range ps.queued {
		if e.seen >= ps.rd.passNo() {
			continue
		}
		r.forgetLocked(ps, e)
		if e.row.Parked {
			// Parked here, it is not read again (the Store leaves
			// parked rows out): this pass may have left its followers
			// out, so read them in the next, which holds them.
			ps.rd.wantPass()
		}
	}
	for _, k := range ps.keys {
		r.forgetIfIdleLocked(k)
	}
}

// forgetLocked drops queued entry e of ps: no longer pending, or not
// to be kept.
func (r *Relay) forgetLocked(ps *partState, e *entry) {
	k := ps.keys[e.row.CorrelationID]
	k.rows = slices.DeleteFunc(k.rows, func(x *entry) bool { return x == e })
	delete(ps.queued, e.row.ID)
	r.mem.add(-e.size)
	r.pushReadyLocked(k)
}

// countAbove counts the rows of got (in seq order) above seq.
func countAbove(got []Row, seq int64) int {
	i, _ := slices.BinarySearchFunc(got, seq+1, func(r Row, s int64) int { return cmp.Compare(r.Seq, s) })
	return len(got) - i
}
