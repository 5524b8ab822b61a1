package inboxfaults

import (
	"context"
	"log/slog"
	"sync/atomic"
	"syscall"

	"github.com/jackc/pgx/v5"

	"github.com/ordo-relay/ordo/inbox"
)

// killAfter is the -kill-after fault injection (Config.KillAfter): the
// inbox's database is wrapped so that the n-th commit of a transaction in
// which the handler ran (or a QueueHandler's statements were sent)
// SIGKILLs the process, after the commit and before
// the inbox acknowledges the delivery.
type killAfter struct {
	inbox.DB
	n       int64
	handled atomic.Int64
	logger  *slog.Logger
	queued  bool // around a QueueHandler: a transaction that sent a batch counts
}

// Begin wraps the inbox's transaction so that its Commit can count.
func (k *killAfter) Begin(ctx context.Context) (pgx.Tx, error) {
	tx, err := k.DB.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return &killTx{Tx: tx, k: k}, nil
}

// batchSender sends a pgx.Batch, as the inbox's pool does.
type batchSender interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// killAfterBatches is killAfter over a database that sends batches: the
// inbox then begins its batches' transactions in a batch, and their
// Commit must count as Begin's do.
type killAfterBatches struct {
	*killAfter
	batches batchSender
}

// SendBatch wraps the transaction b begins, if any, as Begin does.
func (k *killAfterBatches) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	return killBatch{BatchResults: k.batches.SendBatch(ctx, b), k: k.killAfter}
}

type killBatch struct {
	pgx.BatchResults
	k *killAfter
}

func (b killBatch) Tx() pgx.Tx {
	if tx := b.BatchResults.Tx(); tx != nil {
		return &killTx{Tx: tx, k: b.k}
	}
	return nil
}

// handler marks the transaction h runs in as a handler's.
func (k *killAfter) handler(h inbox.Handler) inbox.Handler {
	return func(ctx context.Context, tx pgx.Tx, m *inbox.Message) error {
		if kt, ok := tx.(*killTx); ok {
			kt.m = m
		}
		return h(ctx, tx, m)
	}
}

type killTx struct {
	pgx.Tx
	k    *killAfter
	m    *inbox.Message // set when the handler ran in this transaction
	sent bool           // a batch of statements was sent in it: a QueueHandler's
}

// SendBatch marks the transaction as one a QueueHandler's statements may
// have been sent in (the inbox's per-message path sends a savepoint with
// a decision as a batch too: with a QueueHandler, such a transaction may
// count though no handler ran in it).
func (t *killTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	t.sent = true
	return t.Tx.SendBatch(ctx, b)
}

func (t *killTx) Commit(ctx context.Context) error {
	if err := t.Tx.Commit(ctx); err != nil {
		return err
	}
	if (t.m != nil || t.sent && t.k.queued) && t.k.handled.Add(1) == t.k.n {
		key, seq := "", int64(0)
		if t.m != nil {
			key, seq = t.m.CorrelationID, t.m.KeySeq
		}
		t.k.logger.Warn("kill-after reached: SIGKILL before the ack", "key", key, "key_seq", seq)
		_ = syscall.Kill(syscall.Getpid(), syscall.SIGKILL)
		select {} // the signal is on its way
	}
	return nil
}
