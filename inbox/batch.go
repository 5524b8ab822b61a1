package inbox

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"
)

// maxBatchSize bounds Config.BatchSize: a message of a batch takes a
// subtransaction (its savepoint) and a failed one a second (its failure
// stored after the rollback to the savepoint); PostgreSQL keeps 64 per
// transaction in shared memory, beyond which every snapshot taken while
// the transaction is open gets slower.
const maxBatchSize = 32

// batchItem is one message of a batch and the context its handler runs
// in (nil: the batch's own; with tracing, its delivery's span).
type batchItem struct {
	m   *Message
	ctx context.Context
}

// batchResult is what handleBatch did with one message. When err is set
// (wrapping ErrInvalidMessage: PostgreSQL refused the message's own data)
// nothing of the message was committed, out is 0, and the Consumer
// dead-letters it as it came.
type batchResult struct {
	out  Outcome
	err  error
	more bool           // stored messages of its key may have become next: follow after the commit
	dead *storedMessage // a failed message out of attempts: dead-letter after the commit
	held bool           // held below the low-water mark: copy it to the dead-letter queue after the commit
	took time.Duration  // its handler's run
	// alone: the transaction's first message failed (its handler, or its
	// data) and the transaction was rolled back; its outcome was recorded
	// on its own, as Handle does, and the batch ends with it.
	alone bool
}

// handleBatch is group commit: it handles items' messages in order, in
// one transaction, each under a savepoint of its own, and commits once.
// A message's decision, its handler and its advance are Handle's; a
// failing handler rolls back to the message's savepoint, undoing its own
// writes only, and the failure is stored in the same transaction. The
// fence is checked by every advance and store, and a moved lease (or any
// error that is not a message's own bad data) refuses the whole batch:
// nothing is committed and handleBatch returns the error. Once the
// batch's handlers have run Config.BatchTime in all, no further message
// is added: it returns the results of the messages it handled, a prefix
// of items, all committed. The inbox's own statements do not count, so a
// busy database, where sharing a commit saves the most, does not shrink
// the batches. After the commit it sends the held messages'
// copies and the dead letters of failures out of attempts; following
// the keys whose stored messages became next is left to the caller.
//
// Like Handle, the messages of one key must come in delivery order, from
// one goroutine at a time; a batch may hold several of them, in order.
func (s *Store) handleBatch(ctx context.Context, f Fence, items []batchItem, h Handler) ([]batchResult, error) {
	if !prepareBatch(items) {
		return s.batchSlow(ctx, f, items, h, -1)
	}
	res, failed, err := s.batchFast(ctx, f, items, h)
	switch {
	case err == nil:
		for i := range res {
			s.settled(ctx, f, items[i].m, &res[i])
		}
		return res, nil
	case errors.Is(err, ErrFenced):
		s.stats.fenced.Add(1)
		return nil, err
	case !errors.Is(err, errSlowPath):
		return nil, err
	}
	reach := -1
	if failed != nil {
		it := &items[failed.at]
		if it.ctx == nil {
			it.ctx = ctx
		}
		it.ctx = failed.replay(it.ctx, it.m)
		reach = failed.at
	}
	return s.batchSlow(ctx, f, items, h, reach)
}

// batchSlow is handleBatch's per-message path: each message's decision,
// handler and advance in turn, each message under a savepoint. It stops
// once the handlers have taken BatchTime, but not before items[reach]
// (-1: none), whose failure the fast path saw and replays here: cut
// before it, the message ran again in a later batch and its failure was
// never recorded or counted.
func (s *Store) batchSlow(ctx context.Context, f Fence, items []batchItem, h Handler, reach int) ([]batchResult, error) {
	tx, err := s.db.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("begin batch: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	var handlers time.Duration // the batch's handler runs so far
	res := make([]batchResult, 0, len(items))
	for i, it := range items {
		if handlers >= s.cfg.BatchTime && i > reach {
			break
		}
		hctx := ctx
		if it.ctx != nil {
			hctx = it.ctx
		}
		r, err := s.batchOne(ctx, hctx, tx, f, it.m, h, i == 0)
		if err != nil {
			if errors.Is(err, ErrFenced) {
				s.stats.fenced.Add(1)
			}
			return nil, err
		}
		handlers += r.took
		res = append(res, r)
		if r.alone {
			s.settled(ctx, f, it.m, &res[0])
			return res, nil
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("commit batch of %d: %w", len(res), err)
	}
	for i := range res {
		s.settled(ctx, f, items[i].m, &res[i])
	}
	return res, nil
}

// batchOne handles m in a batch's transaction, under its own savepoint,
// except when m is the transaction's first (nothing before it to keep: a
// savepoint would be a statement more for every transaction of one
// message, as with handlers slower than BatchTime). PostgreSQL refusing
// m's own data (SQLSTATE class 22) rolls back to the savepoint (the
// whole transaction for the first) and makes m invalid; any other error
// is the batch's.
func (s *Store) batchOne(ctx, hctx context.Context, tx pgx.Tx, f Fence, m *Message, h Handler, first bool) (batchResult, error) {
	if err := checkText(m); err != nil {
		s.stats.invalid.Add(1)
		return batchResult{err: fmt.Errorf("message %q: %w", m.ID, err)}, nil
	}
	r, err := s.batchDecide(ctx, hctx, tx, f, m, h, first)
	if err == nil || !dataException(err) {
		return r, err
	}
	if first {
		_ = tx.Rollback(ctx)
	} else if _, rerr := tx.Exec(ctx, sqlRollbackToSavepoint); rerr != nil {
		return batchResult{}, fmt.Errorf("roll back %s/%s/%d to its savepoint: %w", m.Source, m.CorrelationID, m.KeySeq, rerr)
	}
	s.stats.invalid.Add(1)
	return batchResult{err: fmt.Errorf("message %q: PostgreSQL refused its data: %w: %w", m.ID, err, ErrInvalidMessage), alone: first}, nil
}

// batchDecide is handle inside a batch: the same decisions, with the
// writes that handle commits on their own (a gap, a held message, a
// redelivery's attempt, a failure) made in the batch's transaction.
func (s *Store) batchDecide(ctx, hctx context.Context, tx pgx.Tx, f Fence, m *Message, h Handler, first bool) (batchResult, error) {
	d, last, err := s.decide(ctx, tx, m, !first)
	if err != nil {
		return batchResult{}, err
	}
	switch {
	case d == decDuplicate:
		return batchResult{out: Duplicate}, nil
	case d == decGap:
		return batchResult{out: Stored}, s.store(ctx, tx, f, withAttempts(m, 0, ""), nil)
	case d == decHold:
		sm := withAttempts(m, 0, heldReason)
		sm.keyBase, sm.held = last, heldReason
		return batchResult{out: DeadLettered, held: true}, s.store(ctx, tx, f, sm, nil)
	case m.Redelivered:
		// As in handle: the attempt an earlier delivery may have made is
		// counted (committed with the batch, before any handler run of
		// it), and the message runs from the stored copy once committed.
		due := 0.0
		return batchResult{out: Retrying, more: true},
			s.store(ctx, tx, f, withAttempts(m, s.redeliveryAttempts(), "redelivered by the broker"), &due)
	}
	start := time.Now()
	herr := s.runHandler(hctx, tx, m, h)
	took := time.Since(start)
	if herr != nil && first {
		// Nothing else in the transaction: roll it back and store the
		// failure as Handle does, and end the batch here.
		_ = tx.Rollback(ctx)
		out, err := s.failed(ctx, f, m, last, herr)
		return batchResult{out: out, more: out == Retrying, took: took, alone: true}, err
	}
	if herr != nil {
		if _, err := tx.Exec(ctx, sqlRollbackToSavepoint); err != nil {
			return batchResult{}, fmt.Errorf("roll back %s/%s/%d to its savepoint: %w", m.Source, m.CorrelationID, m.KeySeq, err)
		}
		sm := withAttempts(m, 1, storableText(herr.Error()))
		sm.keyBase = last
		due := s.cfg.backoff(1, rand.Float64()).Seconds()
		r := batchResult{out: Retrying, more: true, took: took}
		if s.cfg.MaxAttempts <= 1 {
			r.dead = sm
		}
		return r, s.store(ctx, tx, f, sm, &due)
	}
	more, err := s.advance(ctx, tx, f, m)
	return batchResult{out: Handled, more: more, took: took}, err
}

// settled does what follows a committed batch for its message m: the
// counts, the lag metric, a held message's copy to the dead-letter queue,
// and the dead letter of a failure out of attempts. A dead letter that
// cannot be sent leaves m stored for a retry: it is dead-lettered at its
// next attempt.
func (s *Store) settled(ctx context.Context, f Fence, m *Message, r *batchResult) {
	switch {
	case r.err != nil:
		return
	case r.out == Handled:
		s.metrics.handled(m)
	case r.held:
		s.cfg.Logger.Warn("inbox: message below the retention low-water mark held for an operator (dead-lettered); its key waits",
			"source", m.Source, "key", m.CorrelationID, "key_seq", m.KeySeq, "message_id", m.ID, "timestamp", m.Timestamp)
		if s.dead != nil {
			if err := s.dead.DeadLetter(ctx, m, heldReason, 0); err != nil {
				s.cfg.Logger.Warn("inbox: held message not copied to the dead-letter queue", "source", m.Source, "key", m.CorrelationID, "key_seq", m.KeySeq, "err", err)
			}
		}
	case r.dead != nil:
		out, err := s.deadLetter(ctx, f, r.dead)
		if err != nil {
			s.cfg.Logger.Warn("inbox: dead letter not sent; the message stays stored and is dead-lettered at its next attempt",
				"source", m.Source, "key", m.CorrelationID, "key_seq", m.KeySeq, "err", err)
			break
		}
		r.out = out
	}
	s.stats.count(r.out)
}
