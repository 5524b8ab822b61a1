package inbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// storedMessage is a message held in ordo_inbox_messages.
type storedMessage struct {
	Message
	attempts  int
	lastError string
	keyBase   int64  // the key row's last_seq if storing m creates it
	held      string // stored dead, with this reason, for an operator
	waiting   bool   // a gap: due when its predecessor is handled
	due       bool   // not waiting, and its next attempt is due now
	dead      bool   // dead-lettered: its key waits for an operator
	head      bool   // no stored message of its key precedes it
	keyLast   int64  // the key's last handled key_seq, when read
}

func withAttempts(m *Message, attempts int, lastError string) *storedMessage {
	return &storedMessage{Message: *m, attempts: attempts, lastError: lastError}
}

// querier is the part of DB and pgx.Tx that store needs.
type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// store inserts m (kept as it is if already there), fenced. dueIn is the
// number of seconds until its next attempt, nil for a gap.
func (s *Store) store(ctx context.Context, q querier, f Fence, m *storedMessage, dueIn *float64) error {
	headers, err := json.Marshal(m.Headers)
	if err != nil {
		headers = []byte(`{}`) // headers the handler cannot get back; the typed fields remain
	}
	if m.Headers == nil {
		headers = []byte(`{}`)
	}
	var lastErr, held *string
	if m.lastError != "" {
		lastErr = &m.lastError
	}
	if m.held != "" {
		held = &m.held
	}
	var fenceOK, inserted bool
	if err := q.QueryRow(ctx, sqlStore, s.cfg.Name, m.CorrelationID, m.KeySeq, m.PrevKeySeq, m.Partition,
		s.shardOf(m.Partition), m.ID, m.Type, m.Exchange, m.RoutingKey, nullTime(m.Timestamp), headers,
		nonNil(m.Body), m.attempts, lastErr, dueIn, f.Shard, f.Owner, f.Epoch, m.keyBase, held, m.Source).Scan(&fenceOK, &inserted); err != nil {
		return fmt.Errorf("store %s/%s/%d: %w", m.Source, m.CorrelationID, m.KeySeq, err)
	}
	if !fenceOK {
		return fmt.Errorf("store %s/%s/%d under shard %d epoch %d: %w", m.Source, m.CorrelationID, m.KeySeq, f.Shard, f.Epoch, ErrFenced)
	}
	return nil
}

// follow handles, in key_seq order, the stored messages of source's key
// that are next and due, until one is not.
func (s *Store) follow(ctx context.Context, f Fence, source, key string, h Handler) error {
	for ctx.Err() == nil {
		m, err := s.keyHead(ctx, source, key)
		if err != nil || m == nil {
			return err
		}
		if m.dead || !s.isNext(m) || (!m.waiting && !m.due) {
			return nil
		}
		out, err := s.attempt(ctx, f, m, h)
		if err != nil {
			return err
		}
		if out != Handled && out != Duplicate {
			return nil
		}
	}
	return ctx.Err()
}

// isNext reports whether stored m may be handled now that its key is at
// m.keyLast.
func (s *Store) isNext(m *storedMessage) bool {
	return m.KeySeq <= m.keyLast || s.cfg.Mode == Partial || m.PrevKeySeq <= m.keyLast
}

// RetryDue attempts up to limit stored messages of shard whose retry is
// due, each followed by the messages of its key that become next. The
// Consumer does the same every RetryPoll, one key at a time in its lanes
// (retryKey); a program driving Store itself should call RetryDue as
// often, from the goroutine that hands the shard's messages to Handle.
// It returns how many it attempted.
func (s *Store) RetryDue(ctx context.Context, f Fence, shard, limit int, h Handler) (int, error) {
	due, err := s.due(ctx, shard, limit)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, m := range due {
		ran, err := s.retryStored(ctx, f, m, h)
		if ran {
			n++
		}
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// due returns up to limit stored messages of shard whose retry is due.
func (s *Store) due(ctx context.Context, shard, limit int) ([]*storedMessage, error) {
	rows, err := s.db.Query(ctx, sqlDue, s.cfg.Name, shard, limit)
	if err != nil {
		return nil, fmt.Errorf("read due messages of shard %d: %w", shard, err)
	}
	due, err := pgx.CollectRows(rows, scanStored)
	if err != nil {
		return nil, fmt.Errorf("read due messages of shard %d: %w", shard, err)
	}
	return due, nil
}

// retryStored attempts due stored m, then follows its key, or puts it back
// to waiting when it is not its key's next; ran reports an attempt.
func (s *Store) retryStored(ctx context.Context, f Fence, m *storedMessage, h Handler) (ran bool, err error) {
	if !m.head || !s.isNext(m) {
		return false, s.waitAgain(ctx, f, m)
	}
	out, err := s.attempt(ctx, f, m, h)
	if err != nil {
		return true, err
	}
	if out == Handled || out == Duplicate {
		return true, s.follow(ctx, f, m.Source, m.CorrelationID, h)
	}
	return true, nil
}

// retryKey is retryStored for m as read by due some time ago, run in m's
// key's lane: it reads the key's head again first, as the deliveries
// handled in the lane meanwhile may have handled m, failed it again (no
// longer due) or put a message before it.
func (s *Store) retryKey(ctx context.Context, f Fence, m *storedMessage, h Handler) error {
	head, err := s.keyHead(ctx, m.Source, m.CorrelationID)
	switch {
	case err != nil || head == nil || head.KeySeq > m.KeySeq:
		return err // or m is handled or dropped
	case head.KeySeq < m.KeySeq:
		return s.waitAgain(ctx, f, m)
	case head.dead || !head.due:
		return nil
	}
	_, err = s.retryStored(ctx, f, head, h)
	return err
}

// attempt runs one attempt of stored message m: it counts the attempt in
// a commit of its own, then handles m in a second transaction.
func (s *Store) attempt(ctx context.Context, f Fence, m *storedMessage, h Handler) (Outcome, error) {
	if m.KeySeq <= m.keyLast {
		return Duplicate, s.dropStored(ctx, m)
	}
	var attempts int
	err := s.db.QueryRow(ctx, sqlStartAttempt, s.cfg.Name, m.CorrelationID, m.KeySeq, f.Shard, f.Owner, f.Epoch, m.Source).Scan(&attempts)
	if errors.Is(err, pgx.ErrNoRows) {
		// Handled, skipped or dead-lettered meanwhile, or the lease moved
		// (then the next fenced write, or the lease loop, stops the worker).
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("start attempt of %s/%s/%d: %w", m.Source, m.CorrelationID, m.KeySeq, err)
	}
	m.attempts = attempts
	if attempts > s.cfg.MaxAttempts {
		out, err := s.deadLetter(ctx, f, m)
		s.stats.count(out)
		return out, err
	}
	out, err := s.handleStored(ctx, f, m, h)
	if err != nil {
		return 0, err
	}
	s.stats.count(out)
	return out, nil
}

func (s *Store) handleStored(ctx context.Context, f Fence, m *storedMessage, h Handler) (Outcome, error) {
	tx, err := s.db.Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	var ignore, lastID string
	var last *int64
	var stored, behind, neverHandled bool
	var lowWater *time.Time
	if err := tx.QueryRow(ctx, sqlDecide, s.cfg.Name, m.CorrelationID, m.KeySeq, s.idle, m.Source, s.newKeyBase(&m.Message)).
		Scan(&ignore, &last, &lastID, &stored, &behind, &neverHandled, &lowWater); err != nil {
		return 0, fmt.Errorf("lock key %s/%s: %w", m.Source, m.CorrelationID, err)
	}
	if last == nil || !stored {
		return 0, fmt.Errorf("stored %s/%s/%d: key or message row vanished", m.Source, m.CorrelationID, m.KeySeq)
	}
	m.keyLast = *last
	if m.KeySeq <= m.keyLast {
		_ = tx.Rollback(ctx)
		return Duplicate, s.dropStored(ctx, m)
	}
	if behind || !s.isNext(m) {
		return 0, nil
	}
	if herr := s.runHandler(ctx, tx, &m.Message, h); herr != nil {
		_ = tx.Rollback(ctx)
		return s.retryLater(ctx, f, m, herr)
	}
	if _, err := s.advance(ctx, tx, f, &m.Message); err != nil {
		return 0, err
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, fmt.Errorf("commit: %w", err)
	}
	s.metrics.handled(&m.Message)
	return Handled, nil
}

// retryLater records a failed attempt of stored m, dead-lettering it when
// it has had MaxAttempts.
func (s *Store) retryLater(ctx context.Context, f Fence, m *storedMessage, herr error) (Outcome, error) {
	m.lastError = storableText(herr.Error())
	if m.attempts >= s.cfg.MaxAttempts {
		return s.deadLetter(ctx, f, m)
	}
	backoff := s.cfg.backoff(m.attempts, rand.Float64()).Seconds()
	tag, err := s.db.Exec(ctx, sqlFailed, s.cfg.Name, m.CorrelationID, m.KeySeq, m.lastError, backoff, f.Shard, f.Owner, f.Epoch, m.Source)
	if err != nil {
		return 0, fmt.Errorf("record failure of %s/%s/%d: %w", m.Source, m.CorrelationID, m.KeySeq, err)
	}
	if tag.RowsAffected() == 0 {
		return 0, fmt.Errorf("record failure of %s/%s/%d: %w", m.Source, m.CorrelationID, m.KeySeq, ErrFenced)
	}
	return Retrying, nil
}

// deadLetter sends stored m to the dead-letter queue, then marks it dead:
// its key waits until an operator retries or skips it.
func (s *Store) deadLetter(ctx context.Context, f Fence, m *storedMessage) (Outcome, error) {
	reason := fmt.Sprintf("%d attempts failed; last: %s", m.attempts, m.lastError)
	if m.attempts > s.cfg.MaxAttempts {
		reason = fmt.Sprintf("%d attempts started, none finished (a crashing handler?); last: %s", m.attempts-1, m.lastError)
	}
	if s.dead != nil {
		if err := s.dead.DeadLetter(ctx, &m.Message, reason, m.attempts); err != nil {
			return 0, fmt.Errorf("dead-letter %s/%s/%d: %w", m.Source, m.CorrelationID, m.KeySeq, err)
		}
	}
	tag, err := s.db.Exec(ctx, sqlDead, s.cfg.Name, m.CorrelationID, m.KeySeq, reason, f.Shard, f.Owner, f.Epoch, m.Source)
	if err != nil {
		return 0, fmt.Errorf("mark %s/%s/%d dead: %w", m.Source, m.CorrelationID, m.KeySeq, err)
	}
	if tag.RowsAffected() == 0 {
		return 0, fmt.Errorf("mark %s/%s/%d dead: %w", m.Source, m.CorrelationID, m.KeySeq, ErrFenced)
	}
	s.cfg.Logger.Warn("inbox: message dead-lettered; its key waits for an operator",
		"source", m.Source, "key", m.CorrelationID, "key_seq", m.KeySeq, "message_id", m.ID, "reason", reason)
	return DeadLettered, nil
}

// waitAgain makes due m, which is not its key's next, wait for its
// predecessor again: see sqlWaitAgain.
func (s *Store) waitAgain(ctx context.Context, f Fence, m *storedMessage) error {
	// No row updated: handled, dropped or dead-lettered meanwhile, or the
	// lease moved (the next fenced write, or the lease loop, stops the
	// worker).
	if _, err := s.db.Exec(ctx, sqlWaitAgain, s.cfg.Name, m.CorrelationID, m.KeySeq, f.Shard, f.Owner, f.Epoch, m.Source); err != nil {
		return fmt.Errorf("put %s/%s/%d back to waiting: %w", m.Source, m.CorrelationID, m.KeySeq, err)
	}
	return nil
}

func (s *Store) dropStored(ctx context.Context, m *storedMessage) error {
	if _, err := s.db.Exec(ctx, sqlDeleteStored, s.cfg.Name, m.CorrelationID, m.KeySeq, m.Source); err != nil {
		return fmt.Errorf("drop stored duplicate %s/%s/%d: %w", m.Source, m.CorrelationID, m.KeySeq, err)
	}
	return nil
}

func (s *Store) keyHead(ctx context.Context, source, key string) (*storedMessage, error) {
	rows, err := s.db.Query(ctx, sqlKeyHead, s.cfg.Name, key, source)
	if err != nil {
		return nil, fmt.Errorf("read stored head of %s/%s: %w", source, key, err)
	}
	ms, err := pgx.CollectRows(rows, scanStored)
	if err != nil {
		return nil, fmt.Errorf("read stored head of %s/%s: %w", source, key, err)
	}
	if len(ms) == 0 {
		return nil, nil
	}
	return ms[0], nil
}

func scanStored(row pgx.CollectableRow) (*storedMessage, error) {
	m := &storedMessage{}
	var occurred *time.Time
	var headers []byte
	var next pgtype.Timestamptz
	if err := row.Scan(&m.Source, &m.CorrelationID, &m.KeySeq, &m.PrevKeySeq, &m.Partition, &m.ID, &m.Type, &m.Exchange,
		&m.RoutingKey, &occurred, &headers, &m.Body, &m.attempts, &m.lastError, &next, &m.due, &m.keyLast, &m.dead, &m.head); err != nil {
		return nil, err
	}
	if occurred != nil {
		m.Timestamp = *occurred
	}
	_ = json.Unmarshal(headers, &m.Headers)
	m.waiting = next.InfinityModifier == pgtype.Infinity
	m.Redelivered = m.attempts > 0
	return m, nil
}

func nullTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}
