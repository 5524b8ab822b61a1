package inbox

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// QueueHandler handles one message by queueing its statements on b
// instead of running them: the inbox sends the statements of a batch's
// messages together with its own advance, so that a batch of n messages
// takes three round trips (BEGIN with the decision, every handler's
// statements with the advance, COMMIT) where a Handler's statements add
// one round trip each. Use it when a message's writes do not depend on
// what an earlier statement of the same message returns; a result is read
// in a callback (pgx.QueuedQuery's Exec, QueryRow or Query), whose error
// fails the message as a Handler's would.
//
// The statements run in the inbox's transaction, in the order the
// messages were delivered, after the statements the batch's earlier
// messages queued: a message sees its predecessors' writes, as with a
// Handler. An error returned by the QueueHandler, or by a statement or
// callback of its own, fails its message: the batch is rolled back and
// handled message by message (each message's statements sent on their
// own, under its savepoint), the failure counted once and retried with
// backoff as a Handler's. A QueueHandler must queue no transaction
// control (BEGIN, COMMIT, SAVEPOINT) and must not keep b.
type QueueHandler func(ctx context.Context, m *Message, b *pgx.Batch) error

// Handler returns q as a Handler: it queues m's statements and sends them
// on tx in one round trip, returning the first error of a statement or
// callback. The per-message path and Store.Handle run it.
func (q QueueHandler) Handler() Handler {
	return func(ctx context.Context, tx pgx.Tx, m *Message) error {
		b := &pgx.Batch{}
		if err := q(ctx, m, b); err != nil {
			return err
		}
		if b.Len() == 0 {
			return nil
		}
		return tx.SendBatch(ctx, b).Close()
	}
}

// NewQueued returns a Consumer, as New does, whose messages are handled
// by q: their statements are sent with the inbox's own (QueueHandler).
func NewQueued(cfg Config, db DB, q QueueHandler) (*Consumer, error) {
	c, err := New(cfg, db, q.Handler())
	if err != nil {
		return nil, err
	}
	c.store.queue = c.tracedQueue(q)
	return c, nil
}

// queueBatch runs the queue handler of the messages of items that decs
// decides next on one pgx.Batch (runDecided). It returns the batch, the
// results and, for each of those messages, the number of statements
// queued up to and including its own; or the failure of a handler.
func (s *Store) queueBatch(ctx context.Context, items []batchItem, decs []decision) (*pgx.Batch, []batchResult, []int, *handlerFailed) {
	b := &pgx.Batch{}
	ends := make([]int, 0, len(items))
	res, failed := s.runDecided(ctx, items, decs, func(hctx context.Context, m *Message) error {
		return s.counted(func() error { return s.queue(hctx, m, b) })
	}, func() { ends = append(ends, b.Len()) })
	if failed != nil {
		return nil, nil, nil, failed
	}
	return b, res, ends, nil
}

// sendQueued sends b, the handlers' statements (ends as queueBatch
// returned them) followed by the advance of their keys, in tx, and reads
// every answer. A statement or callback of a handler that fails, with the
// connection still open, is that message's failure; the transaction is
// then aborted and the caller rolls it back.
func (s *Store) sendQueued(ctx context.Context, tx pgx.Tx, f Fence, items []batchItem, res []batchResult, b *pgx.Batch, ends []int) (*handlerFailed, error) {
	adv := s.advanceOf(items, res)
	handlerStatements := b.Len()
	if adv != nil {
		b.Queue(sqlAdvanceBatch, adv.args(s.cfg.Name, f)...)
	}
	if b.Len() == 0 {
		return nil, nil
	}
	br := tx.SendBatch(ctx, b)
	defer func() { _ = br.Close() }()
	msg := 0
	for k, qq := range b.QueuedQueries[:handlerStatements] {
		var err error
		if qq.Fn != nil {
			err = qq.Fn(br)
		} else {
			_, err = br.Exec()
		}
		if err == nil {
			continue
		}
		if tx.Conn().IsClosed() {
			return nil, fmt.Errorf("handlers' statements of a batch of %d: %w", len(res), err)
		}
		for ends[msg] <= k {
			msg++
		}
		return &handlerFailed{at: msg, err: err}, nil
	}
	if adv == nil {
		return nil, br.Close()
	}
	var (
		held    bool
		updated int
		more    []bool
	)
	if err := br.QueryRow().Scan(&held, &updated, &more); err != nil {
		return nil, fmt.Errorf("advance batch of %d keys: %w", len(adv.order), err)
	}
	if err := br.Close(); err != nil {
		return nil, fmt.Errorf("advance batch of %d keys: %w", len(adv.order), err)
	}
	return nil, adv.check(f, res, held, updated, more)
}

// batchQueued is batchFast once its messages are decided, with the
// Store's QueueHandler: the handlers queue their statements, which go to
// PostgreSQL with the advance in one round trip, and the commit follows.
// It returns as batchFast does.
func (s *Store) batchQueued(ctx context.Context, tx pgx.Tx, f Fence, items []batchItem, decs []decision) ([]batchResult, *handlerFailed, error) {
	b, res, ends, failed := s.queueBatch(ctx, items, decs)
	if failed != nil {
		return nil, failed, errSlowPath
	}
	failed, err := s.sendQueued(ctx, tx, f, items, res, b, ends)
	switch {
	case failed != nil:
		return nil, failed, errSlowPath
	case err != nil && dataException(err):
		return nil, nil, errSlowPath
	case err != nil:
		return nil, nil, err
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, nil, fmt.Errorf("commit batch of %d: %w", len(res), err)
	}
	return res, nil, nil
}
