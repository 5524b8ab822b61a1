package inbox

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/ordo-relay/ordo/wire"
)

// DB is what the inbox needs from PostgreSQL; *pgxpool.Pool satisfies it.
// The inbox tables must have been created with Migrate. A DB that also
// has SendBatch(ctx, *pgx.Batch) pgx.BatchResults, as the pool does, saves
// a round trip per transaction: the inbox sends BEGIN with its first
// statement (pgx.Batch.BeginTx), and takes the transaction from the
// batch's results.
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Handler handles one message inside tx, the inbox's transaction: write
// your business rows through tx and return nil, and the inbox records the
// message as handled in the same commit. Return an error (or panic) and
// the message's writes, yours included, roll back; the message is retried
// with backoff and dead-lettered after MaxAttempts.
//
// The Consumer may put several messages of a shard in one transaction
// (group commit, Config.BatchSize), each behind a savepoint of its own:
// a handler's error rolls back to its message's savepoint, leaving the
// other messages' writes to commit. So a Handler must not commit or roll
// back tx, must return a statement's error rather than catch it and go on
// (PostgreSQL refuses the transaction's later statements until the
// rollback), sees the writes and transaction settings (SET LOCAL) of the
// handlers before it in the batch, and holds the row locks it takes until
// the batch commits: lock rows shared by many messages in a fixed order,
// or set BatchSize 1. It should finish well within the lease TTL.
type Handler func(ctx context.Context, tx pgx.Tx, m *Message) error

// Fence is the shard lease a write is made under. Every inbox write checks
// in its own transaction that the lease still has this owner and epoch;
// the zero Fence checks nothing (a single consumer without leases).
type Fence struct {
	Shard int
	Owner string
	Epoch int64
}

// ErrFenced is returned by Store.Handle when the shard's lease has moved
// to another owner or epoch: nothing was committed, and the delivery must
// not be acknowledged (the new owner will receive it).
var ErrFenced = errors.New("shard lease moved: write refused")

// DeadLetterer sends a message to the dead-letter queue. The Consumer's
// implementation publishes with a confirm; DeadLetter returns once the
// broker has the message. Safe for concurrent use.
type DeadLetterer interface {
	DeadLetter(ctx context.Context, m *Message, reason string, attempts int) error
}

// Outcome is what Store.Handle did with a message.
type Outcome int

const (
	// Handled: the handler ran and its transaction committed.
	Handled Outcome = iota + 1
	// Duplicate: the key was already past this message (or the message is
	// already stored): dropped.
	Duplicate
	// Stored: a gap. The message waits in the inbox table for its
	// predecessor.
	Stored
	// Retrying: the handler failed (or a redelivery must count an attempt
	// first); the message is stored and retried with backoff.
	Retrying
	// DeadLettered: out of attempts; sent to the dead-letter queue, and its
	// key waits for an operator.
	DeadLettered
)

func (o Outcome) String() string {
	switch o {
	case Handled:
		return "handled"
	case Duplicate:
		return "duplicate"
	case Stored:
		return "stored"
	case Retrying:
		return "retrying"
	case DeadLettered:
		return "dead-lettered"
	}
	return "Outcome(" + strconv.Itoa(int(o)) + ")"
}

// Store makes the inbox's decisions against PostgreSQL. It is safe for
// concurrent use, but the messages of one key (deliveries, and RetryDue
// of the key's shard) must be handed to it by one goroutine at a time, in
// delivery order: the Consumer runs each key in one lane at a time. The
// key's row lock keeps two handlers of a key from overlapping, but not
// the order: two callers racing k and k+1 store needless gaps in Ordered
// mode, and in Partial mode handle k+1 first and drop k.
type Store struct {
	cfg     Config
	db      DB
	dead    DeadLetterer
	idle    string // idle_in_transaction_session_timeout, ms
	stats   counters
	metrics storeMetrics
	// queue, when set, handles the fast path's messages by queueing their
	// statements (NewQueued); the Handler passed in runs the rest.
	queue QueueHandler
}

// NewStore returns a Store for cfg.Name over db. dead may be nil: dead
// messages are then only marked in the inbox table. Call Migrate first.
// Like New, it fills the fields of cfg left zero, then validates.
func NewStore(cfg Config, db DB, dead DeadLetterer) (*Store, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Store{cfg: cfg, db: db, dead: dead, idle: strconv.FormatInt(cfg.LeaseTTL.Milliseconds(), 10),
		metrics: newStoreMetrics(cfg.Name)}, nil
}

// shardOf maps a partition to its shard: partition mod S.
func (s *Store) shardOf(partition int) int { return partition % s.cfg.Shards }

// Handle decides what to do with m under the key's row lock, and runs h in
// the same transaction when m is the key's next message. Then it handles
// the key's stored messages that became next. It returns ErrFenced when
// the lease f moved, and other errors when the database failed; in both
// cases nothing about m was committed and the caller must not acknowledge
// it. An error wrapping ErrInvalidMessage means m itself cannot be
// stored (text PostgreSQL cannot store, or data it refuses: SQLSTATE
// class 22); retrying it cannot help, and the Consumer dead-letters it. A
// handler error is not returned: it becomes Retrying or DeadLettered. An empty m.Source is set to wire.DefaultSource (a Message
// built by a program written before sources).
func (s *Store) Handle(ctx context.Context, f Fence, m *Message, h Handler) (Outcome, error) {
	if m.Source == "" {
		m.Source = wire.DefaultSource
	}
	if err := checkText(m); err != nil {
		s.stats.invalid.Add(1)
		return 0, fmt.Errorf("message %q: %w", m.ID, err)
	}
	out, more, err := s.handle(ctx, f, m, h)
	if err != nil {
		if errors.Is(err, ErrFenced) {
			s.stats.fenced.Add(1)
		}
		if dataException(err) {
			s.stats.invalid.Add(1)
			return 0, fmt.Errorf("message %q: PostgreSQL refused its data: %w: %w", m.ID, err, ErrInvalidMessage)
		}
		return 0, err
	}
	s.stats.count(out)
	if more {
		if err := s.follow(ctx, f, m.Source, m.CorrelationID, h); err != nil {
			// m itself is settled; what follows is retried by the poll.
			s.cfg.Logger.Warn("inbox: handle stored messages", "source", m.Source, "key", m.CorrelationID, "err", err)
		}
	}
	return out, nil
}

// dataException reports whether err is PostgreSQL refusing a value
// (SQLSTATE class 22, data exception): for the inbox's own statements,
// the message's data, not the database, is at fault.
func dataException(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && strings.HasPrefix(pe.Code, "22")
}

type decision int

const (
	decNext decision = iota + 1
	decDuplicate
	decGap
	decHold // below the low-water mark, of a key never handled: see hold
)

// handle is Handle without the follow-up; more reports that stored
// messages of m's key may have become next.
func (s *Store) handle(ctx context.Context, f Fence, m *Message, h Handler) (out Outcome, more bool, err error) {
	// The common case, m its key's next, takes batchFast's two
	// statements, which every connection then plans once for batches and
	// single messages alike.
	res, failed, err := s.batchFast(ctx, f, []batchItem{{m: m}}, h)
	switch {
	case err == nil:
		if res[0].out == Handled {
			s.metrics.handled(m)
		}
		return res[0].out, res[0].more, nil
	case !errors.Is(err, errSlowPath):
		return 0, false, err
	case failed != nil:
		ctx = failed.replay(ctx, m)
	}
	tx, err := s.db.Begin(ctx)
	if err != nil {
		return 0, false, fmt.Errorf("begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	d, last, err := s.decide(ctx, tx, m, false)
	if err != nil {
		return 0, false, err
	}
	switch {
	case d == decDuplicate:
		return Duplicate, false, nil
	case d == decGap:
		return Stored, false, s.storeAndCommit(ctx, tx, f, withAttempts(m, 0, ""), nil)
	case d == decHold:
		out, err := s.hold(ctx, tx, f, m, last)
		return out, false, err
	case m.Redelivered:
		// An earlier delivery may have crashed its handler: count that
		// attempt in a commit of its own, then run from the stored copy.
		due := 0.0
		if err := s.storeAndCommit(ctx, tx, f, withAttempts(m, s.redeliveryAttempts(), "redelivered by the broker"), &due); err != nil {
			return 0, false, err
		}
		return Retrying, true, nil
	}
	if herr := s.runHandler(ctx, tx, m, h); herr != nil {
		_ = tx.Rollback(ctx)
		out, err := s.failed(ctx, f, m, last, herr)
		return out, out == Retrying, err
	}
	if more, err = s.advance(ctx, tx, f, m); err != nil {
		return 0, false, err
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, false, fmt.Errorf("commit: %w", err)
	}
	s.metrics.handled(m)
	return Handled, more, nil
}

// redeliveryAttempts is the attempts a redelivery is stored with: one, as
// the broker cannot say whether an earlier delivery's handler ran (and
// crashed its process), but never the last one, so every message gets at
// least one handler run in the inbox before it is dead-lettered: with
// MaxAttempts 1 a redelivery (a clean handoff requeues the prefetched
// deliveries flagged redelivered, none of them run) still runs once.
func (s *Store) redeliveryAttempts() int { return min(1, s.cfg.MaxAttempts-1) }

// decide locks m's key row (creating it for a new key) and classifies m.
// It also returns the key's last handled key_seq, which is the last_seq
// of the key row it created if it was new: a failure stored after tx
// rolls back must create the same row. With savepoint it first opens
// m's savepoint in tx (sqlSavepoint), in the same round trip.
func (s *Store) decide(ctx context.Context, tx pgx.Tx, m *Message, savepoint bool) (decision, int64, error) {
	var (
		last     *int64
		lastID   string
		stored   bool
		behind   bool
		never    bool // the key has never handled a message
		lowWater *time.Time
		ignore   string
	)
	args := []any{s.cfg.Name, m.CorrelationID, m.KeySeq, s.idle, m.Source, s.newKeyBase(m)}
	scan := func(r pgx.Row) error { return r.Scan(&ignore, &last, &lastID, &stored, &behind, &never, &lowWater) }
	var err error
	if savepoint {
		// In a batch: m's savepoint, then the decision, in one round trip.
		b := &pgx.Batch{}
		b.Queue(sqlSavepoint)
		b.Queue(sqlDecide, args...).QueryRow(scan)
		err = tx.SendBatch(ctx, b).Close()
	} else {
		err = scan(tx.QueryRow(ctx, sqlDecide, args...))
	}
	if err != nil {
		return 0, 0, fmt.Errorf("decide %s/%s/%d: %w", m.Source, m.CorrelationID, m.KeySeq, err)
	}
	if last != nil && m.KeySeq == *last && lastID != "" && m.ID != "" && m.ID != lastID {
		s.rewound(m, lastID)
	}
	if last != nil && (m.KeySeq <= *last || stored) {
		return decDuplicate, *last, nil
	}
	base := s.newKeyBase(m)
	if last != nil {
		base = *last
	}
	if never && lowWater != nil && !m.Timestamp.IsZero() && m.Timestamp.Before(*lowWater) {
		return decHold, base, nil
	}
	if last == nil {
		l, err := s.createKey(ctx, tx, m.Source, m.CorrelationID, base)
		if err != nil {
			return 0, 0, err
		}
		last = &l
	}
	switch {
	case m.KeySeq <= *last || stored:
		return decDuplicate, *last, nil
	case behind:
		// An earlier message of the key is stored (retrying, dead or a
		// gap): m waits behind it in every mode, or it would be handled
		// first and its advance would delete the earlier one.
		return decGap, *last, nil
	case s.cfg.Mode == Partial || m.PrevKeySeq <= *last:
		return decNext, *last, nil
	}
	return decGap, *last, nil
}

// newKeyBase is the last_seq a key's row is created at when m is the
// first message of it seen: 0, or in Bootstrap mode, which joins a key at
// its first message seen, just before m, so that m is next, also when it
// is retried from the table.
func (s *Store) newKeyBase(m *Message) int64 {
	if s.cfg.Mode == Bootstrap {
		return m.PrevKeySeq
	}
	return 0
}

// rewound reports a message whose key_seq was already handled under
// another message id: not a republish (that keeps its id) but a producer
// whose key_seq went back, e.g. after a failover to an asynchronous
// replica or a restore. The message is still dropped as a duplicate: see
// docs/consumer.md, "Limits".
func (s *Store) rewound(m *Message, lastID string) {
	s.stats.rewinds.Add(1)
	s.cfg.Logger.Error("inbox: key_seq reused by a different message: the producer's key_seq went back; "+
		"newer messages of this key are being dropped as duplicates",
		"source", m.Source, "key", m.CorrelationID, "key_seq", m.KeySeq, "message_id", m.ID, "handled_message_id", lastID)
}

// heldReason is the reason a message below the low-water mark is held.
const heldReason = "older than the retention low-water mark, of a key the inbox has not handled: " +
	"a redelivery of a key retention deleted (skip it) or a first delivery later than RetentionAge (retry it)"

// hold stores m dead, for an operator, and sends a copy to the dead-letter
// queue: m's key is one the inbox has no handled message of, and m is
// older than the low-water mark. That is a redelivery of a key retention
// deleted, or a first delivery that came later than RetentionAge (a key's
// first row parked at the relay and retried later, say); the inbox cannot
// tell which, and neither handling nor dropping it is safe. Later
// messages of the key below the mark are held too; others wait behind.
// last is the key row's last_seq if storing m creates it.
func (s *Store) hold(ctx context.Context, tx pgx.Tx, f Fence, m *Message, last int64) (Outcome, error) {
	sm := withAttempts(m, 0, heldReason)
	sm.keyBase, sm.held = last, heldReason
	if err := s.storeAndCommit(ctx, tx, f, sm, nil); err != nil {
		return 0, err
	}
	s.cfg.Logger.Warn("inbox: message below the retention low-water mark held for an operator (dead-lettered); its key waits",
		"source", m.Source, "key", m.CorrelationID, "key_seq", m.KeySeq, "message_id", m.ID, "timestamp", m.Timestamp)
	if s.dead != nil {
		if err := s.dead.DeadLetter(ctx, m, heldReason, 0); err != nil {
			// The table is the record (Dead lists it); the copy is extra.
			s.cfg.Logger.Warn("inbox: held message not copied to the dead-letter queue", "source", m.Source, "key", m.CorrelationID, "key_seq", m.KeySeq, "err", err)
		}
	}
	return DeadLettered, nil
}

func (s *Store) createKey(ctx context.Context, tx pgx.Tx, source, key string, base int64) (int64, error) {
	var last int64
	err := tx.QueryRow(ctx, sqlNewKey, s.cfg.Name, key, base, source).Scan(&last)
	if errors.Is(err, pgx.ErrNoRows) {
		err = tx.QueryRow(ctx, sqlLockKey, s.cfg.Name, key, source).Scan(&last)
	}
	if err != nil {
		return 0, fmt.Errorf("create key %s/%s: %w", source, key, err)
	}
	return last, nil
}

// advance records m as its key's last handled message, fenced; more
// reports that stored messages of the key are left.
func (s *Store) advance(ctx context.Context, tx pgx.Tx, f Fence, m *Message) (more bool, err error) {
	var n int
	if err := tx.QueryRow(ctx, sqlAdvance, s.cfg.Name, m.CorrelationID, m.KeySeq, m.ID,
		nullTime(m.Timestamp), f.Shard, f.Owner, f.Epoch, m.Source).Scan(&n, &more); err != nil {
		return false, fmt.Errorf("advance %s/%s to %d: %w", m.Source, m.CorrelationID, m.KeySeq, err)
	}
	if n == 0 {
		return false, fmt.Errorf("advance %s/%s to %d under shard %d epoch %d: %w", m.Source, m.CorrelationID, m.KeySeq, f.Shard, f.Epoch, ErrFenced)
	}
	return more, nil
}

// runHandler runs h, turning a panic into an error, and records its
// duration.
func (s *Store) runHandler(ctx context.Context, tx pgx.Tx, m *Message, h Handler) error {
	if err := replayed(ctx, m); err != nil {
		return err // counted when it ran
	}
	return s.counted(func() error { return h(ctx, tx, m) })
}

// counted runs a handler's run, turning a panic into an error, and
// records it in the handler counters and metric.
func (s *Store) counted(run func() error) (err error) {
	start := time.Now()
	s.stats.inHandler.Add(1)
	defer func() {
		s.stats.inHandler.Add(-1)
		d := time.Since(start)
		s.stats.handlerNanos.Add(int64(d))
		s.metrics.handler.Observe(d.Seconds())
		if r := recover(); r != nil {
			err = fmt.Errorf("handler panic: %v", r)
		}
	}()
	return run()
}

// failed stores m after its first attempt failed with herr, to be retried
// after a backoff, or dead-letters it when one attempt is all it gets. The
// handler's transaction has rolled back, and with it the key row decide
// created for a new key: the store creates it again at last, in the same
// statement.
func (s *Store) failed(ctx context.Context, f Fence, m *Message, last int64, herr error) (Outcome, error) {
	sm := withAttempts(m, 1, storableText(herr.Error()))
	sm.keyBase = last
	due := s.cfg.backoff(1, rand.Float64()).Seconds()
	if err := s.store(ctx, s.db, f, sm, &due); err != nil {
		return 0, err
	}
	if s.cfg.MaxAttempts <= 1 {
		return s.deadLetter(ctx, f, sm)
	}
	return Retrying, nil
}

func (s *Store) storeAndCommit(ctx context.Context, tx pgx.Tx, f Fence, m *storedMessage, dueIn *float64) error {
	if err := s.store(ctx, tx, f, m, dueIn); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("commit stored %s/%s/%d: %w", m.Source, m.CorrelationID, m.KeySeq, err)
	}
	return nil
}

// counters are the Store's monotonic counts; see Stats.
type counters struct {
	handled, duplicates, stored, retried, dead, invalid, fenced, rewinds atomic.Int64
	handlerNanos                                                         atomic.Int64 // handlers' time, every run
	inHandler                                                            atomic.Int64 // handlers running now
}

func (c *counters) count(o Outcome) {
	switch o {
	case Handled:
		c.handled.Add(1)
	case Duplicate:
		c.duplicates.Add(1)
	case Stored:
		c.stored.Add(1)
	case Retrying:
		c.retried.Add(1)
	case DeadLettered:
		c.dead.Add(1)
	}
}
