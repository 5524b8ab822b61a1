package inbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ordo-relay/ordo/wire"
)

// errSlowPath ends batchFast when its batch needs the per-message path:
// a message that is not its key's next (a gap, a hold, a redelivery), a
// key row created meanwhile by another transaction, or data PostgreSQL
// refuses. Nothing was committed.
var errSlowPath = errors.New("batch needs the per-message path")

// handlerFailed is what batchFast learned before it gave up: the handler
// of items[at] failed with err, its first run, whose writes and those of
// the handlers before it rolled back with the transaction.
type handlerFailed struct {
	at  int
	err error
}

// replayKey is the context key of a handler failure to replay.
type replayKey struct{}

// replayValue is the failure of m's handler that runHandler returns
// instead of running the handler.
type replayValue struct {
	m   *Message
	err error
}

// replay returns ctx carrying the failure, for the per-message path: its
// run of m's handler returns the failure the fast path saw, without a
// second run (whose outcome could differ), and is not counted again.
func (hf *handlerFailed) replay(ctx context.Context, m *Message) context.Context {
	return context.WithValue(ctx, replayKey{}, replayValue{m: m, err: hf.err})
}

// replayed returns the failure ctx carries for m's handler, nil if none.
func replayed(ctx context.Context, m *Message) error {
	if v, ok := ctx.Value(replayKey{}).(replayValue); ok && v.m == m {
		return v.err
	}
	return nil
}

// batchFast is group commit for the common batch, whose messages are all
// their keys' next or duplicates: one statement decides them all
// (sqlDecideBatch), the handlers run one after another in the
// transaction with no savepoint between them, and one statement advances
// every key (sqlAdvanceBatch) before the commit. That is three round trips
// for the batch (BEGIN with the decision, the advance, COMMIT) besides the
// handlers' own, where the per-message path takes three per message.
//
// Every message's text must have passed checkText. It returns
// errSlowPath, with nothing committed, when the batch needs
// the per-message path; failed is then set when a handler failed (its
// transaction was rolled back whole, for want of a savepoint), so that
// the per-message path records that failure instead of running the
// handler again. Other errors are the batch's, as handleBatch's.
func (s *Store) batchFast(ctx context.Context, f Fence, items []batchItem, h Handler) (res []batchResult, failed *handlerFailed, err error) {
	n := len(items)
	keys, seqs, sources, bases := make([]string, n), make([]int64, n), make([]string, n), make([]int64, n)
	for i, it := range items {
		m := it.m
		if m.Redelivered {
			return nil, nil, errSlowPath
		}
		keys[i], seqs[i], sources[i], bases[i] = m.CorrelationID, m.KeySeq, m.Source, s.newKeyBase(m)
	}
	tx, decs, err := s.beginDecided(ctx, items, keys, seqs, sources, bases)
	if tx != nil {
		defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	}
	if err != nil {
		return nil, nil, err
	}
	if s.queue != nil {
		return s.batchQueued(ctx, tx, f, items, decs)
	}
	res, failed = s.runDecided(ctx, items, decs, func(hctx context.Context, m *Message) error {
		return s.runHandler(hctx, tx, m, h)
	}, nil)
	if failed != nil {
		return nil, failed, errSlowPath
	}
	if err := s.advanceBatch(ctx, tx, f, items[:len(res)], res); err != nil {
		if dataException(err) {
			return nil, nil, errSlowPath
		}
		return nil, nil, err
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, nil, fmt.Errorf("commit batch of %d: %w", len(res), err)
	}
	return res, nil, nil
}

// runDecided runs run for each message of items that decs decides next,
// in order, in its delivery's context, until the runs have taken
// Config.BatchTime in all; a duplicate passes. It returns the results
// (Handled or Duplicate, for a prefix of items), calling done after each,
// or the first run's failure.
func (s *Store) runDecided(ctx context.Context, items []batchItem, decs []decision, run func(ctx context.Context, m *Message) error, done func()) ([]batchResult, *handlerFailed) {
	var handlers time.Duration
	res := make([]batchResult, 0, len(items))
	for i, it := range items {
		if handlers >= s.cfg.BatchTime {
			break
		}
		r := batchResult{out: Duplicate}
		if decs[i] != decDuplicate {
			hctx := ctx
			if it.ctx != nil {
				hctx = it.ctx
			}
			start := time.Now()
			if err := run(hctx, it.m); err != nil {
				return nil, &handlerFailed{at: i, err: err}
			}
			r = batchResult{out: Handled, took: time.Since(start)}
			handlers += r.took
		}
		res = append(res, r)
		if done != nil {
			done()
		}
	}
	return res, nil
}

// batchSender sends a pgx.Batch; *pgxpool.Pool and *pgx.Conn do.
type batchSender interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// beginDecided begins the batch's transaction and decides its messages
// (decideBatch): in one round trip when the DB sends batches (the BEGIN
// queued before the decision), else in two. It returns the transaction
// whenever one was begun, also with an error, for the caller to roll back.
func (s *Store) beginDecided(ctx context.Context, items []batchItem, keys []string, seqs []int64, sources []string, bases []int64) (pgx.Tx, []decision, error) {
	args := []any{s.cfg.Name, keys, seqs, sources, bases, s.idle}
	bs, ok := s.db.(batchSender)
	if !ok {
		tx, err := s.db.Begin(ctx)
		if err != nil {
			return nil, nil, fmt.Errorf("begin batch: %w", err)
		}
		rows, err := tx.Query(ctx, sqlDecideBatch, args...)
		decs, err := s.decideBatch(items, rows, err)
		return tx, decs, err
	}
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{})
	b.Queue(sqlDecideBatch, args...)
	br := bs.SendBatch(ctx, b)
	tx := br.Tx()
	if _, err := br.Exec(); err != nil {
		_ = br.Close()
		return tx, nil, fmt.Errorf("begin batch: %w", err)
	}
	rows, err := br.Query()
	decs, err := s.decideBatch(items, rows, err)
	if cerr := br.Close(); err == nil && cerr != nil {
		_, err = s.decideBatch(items, nil, cerr)
	}
	return tx, decs, err
}

// decideBatch classifies each message of items from rows, sqlDecideBatch's
// answer (or queryErr, its error), as decide does, a later message of a
// key in the batch against the key as its earlier ones leave it. It
// returns errSlowPath unless every message is next or a duplicate.
func (s *Store) decideBatch(items []batchItem, rows pgx.Rows, queryErr error) ([]decision, error) {
	if queryErr != nil {
		if dataException(queryErr) {
			return nil, errSlowPath
		}
		return nil, fmt.Errorf("decide batch of %d: %w", len(items), queryErr)
	}
	type keyState struct {
		last  int64
		moved bool // an earlier message of the batch advances the key
	}
	seen := make(map[[2]string]*keyState, len(items))
	decs := make([]decision, len(items))
	var (
		i        int64
		ignore   string
		last     *int64
		lastID   string
		stored   bool
		behind   bool
		never    bool
		lowWater *time.Time
	)
	_, err := pgx.ForEachRow(rows, []any{&ignore, &i, &last, &lastID, &stored, &behind, &never, &lowWater}, func() error {
		j := int(i - 1)
		if j < 0 || j >= len(items) {
			return fmt.Errorf("decide batch: row %d of %d", i, len(items))
		}
		m := items[j].m
		k := [2]string{m.Source, m.CorrelationID}
		ks := seen[k]
		if ks == nil {
			if last == nil {
				return errSlowPath // created meanwhile by another transaction: decide locks it
			}
			if m.KeySeq == *last && lastID != "" && m.ID != "" && m.ID != lastID {
				s.rewound(m, lastID)
			}
			ks = &keyState{last: *last}
			seen[k] = ks
		}
		switch {
		case m.KeySeq <= ks.last || stored:
			decs[j] = decDuplicate
			return nil
		case never && !ks.moved && lowWater != nil && !m.Timestamp.IsZero() && m.Timestamp.Before(*lowWater):
			return errSlowPath // a hold
		case behind:
			return errSlowPath // a gap behind a stored message
		case s.cfg.Mode == Partial || m.PrevKeySeq <= ks.last:
			decs[j] = decNext
			ks.last, ks.moved = m.KeySeq, true
			return nil
		}
		return errSlowPath // a gap
	})
	if errors.Is(err, errSlowPath) {
		return nil, err
	}
	if err != nil {
		if dataException(err) {
			return nil, errSlowPath
		}
		return nil, fmt.Errorf("decide batch of %d: %w", len(items), err)
	}
	for j, d := range decs {
		if d == 0 {
			return nil, fmt.Errorf("decide batch: no decision for message %d of %d", j+1, len(items))
		}
	}
	return decs, nil
}

// advanceBatch records, fenced, the last handled message of each key of
// items as the key's, in one statement, and sets more on each key's last
// handled result when stored messages of the key are left after it.
func (s *Store) advanceBatch(ctx context.Context, tx pgx.Tx, f Fence, items []batchItem, res []batchResult) error {
	adv := s.advanceOf(items, res)
	if adv == nil {
		return nil
	}
	var (
		held    bool
		updated int
		more    []bool
	)
	if err := tx.QueryRow(ctx, sqlAdvanceBatch, adv.args(s.cfg.Name, f)...).Scan(&held, &updated, &more); err != nil {
		return fmt.Errorf("advance batch of %d keys: %w", len(adv.order), err)
	}
	return adv.check(f, res, held, updated, more)
}

// keysAdvance is the advance of a batch's keys: each key's last handled
// message.
type keysAdvance struct {
	order              []int // the index in items of each key's last handled message
	keys, ids, sources []string
	seqs               []int64
	times              []*time.Time
}

// advanceOf returns the advance of the keys of items' handled messages
// (res), nil when none was handled.
func (s *Store) advanceOf(items []batchItem, res []batchResult) *keysAdvance {
	lastOf := make(map[[2]string]int, len(items)) // key -> index in order of its last handled message
	var order []int
	for i, r := range res {
		if r.out != Handled {
			continue
		}
		k := [2]string{items[i].m.Source, items[i].m.CorrelationID}
		if j, ok := lastOf[k]; ok {
			order[j] = i
			continue
		}
		lastOf[k] = len(order)
		order = append(order, i)
	}
	if len(order) == 0 {
		return nil
	}
	n := len(order)
	a := &keysAdvance{order: order, keys: make([]string, n), ids: make([]string, n), sources: make([]string, n),
		seqs: make([]int64, n), times: make([]*time.Time, n)}
	for j, i := range order {
		m := items[i].m
		a.keys[j], a.seqs[j], a.ids[j], a.sources[j], a.times[j] = m.CorrelationID, m.KeySeq, m.ID, m.Source, nullTime(m.Timestamp)
	}
	return a
}

// args are sqlAdvanceBatch's arguments for the consumer group name under
// the lease f.
func (a *keysAdvance) args(name string, f Fence) []any {
	return []any{name, a.keys, a.seqs, a.ids, a.times, f.Shard, f.Owner, f.Epoch, a.sources}
}

// check checks sqlAdvanceBatch's answer (the lease held, the key rows
// updated, and whether each key has stored messages left) and sets more
// on each key's last handled result.
func (a *keysAdvance) check(f Fence, res []batchResult, held bool, updated int, more []bool) error {
	if !held {
		return fmt.Errorf("advance batch of %d keys under shard %d epoch %d: %w", len(a.order), f.Shard, f.Epoch, ErrFenced)
	}
	if updated != len(a.order) {
		return fmt.Errorf("advance batch: %d of %d key rows found", updated, len(a.order))
	}
	if len(more) != len(a.order) {
		return fmt.Errorf("advance batch: %d answers for %d keys", len(more), len(a.order))
	}
	for j, i := range a.order {
		res[i].more = more[j]
	}
	return nil
}

// prepareBatch sets the empty sources of items' messages to
// wire.DefaultSource (a Message built by a program written before
// sources) and reports whether every message's text passed checkText
// (else the per-message path refuses the ones that did not, alone).
func prepareBatch(items []batchItem) (valid bool) {
	valid = true
	for _, it := range items {
		if it.m.Source == "" {
			it.m.Source = wire.DefaultSource
		}
		if valid && checkText(it.m) != nil {
			valid = false
		}
	}
	return valid
}
