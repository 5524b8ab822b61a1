package relay

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/ordo-relay/ordo/internal/backoff"
	"github.com/ordo-relay/ordo/internal/outage"
)

// Config configures a Relay. Zero fields take the defaults of DefaultConfig.
type Config struct {
	// Node is this node's name, the lease owner every write is checked
	// against.
	Node string
	// Window is W, the most unconfirmed publishes the node has in flight.
	Window int
	// PerKeyLimit is the most messages of one key in flight at once. It
	// must be 1 for per-key order; tests raise it to show what breaks.
	PerKeyLimit int
	// BatchSize is the most rows one read returns.
	BatchSize int
	// PollInterval is how often the relay reads without a notification.
	PollInterval time.Duration
	// ReadTimeout bounds one read of key heads. A read slower than this
	// fails, and is logged like a database outage, instead of running on
	// while the leases it reads for may lapse. Keep it well below the
	// lease TTL; the node sets TTL/2.
	ReadTimeout time.Duration
	// RetryMin and RetryMax bound the backoff of a key whose head was
	// nacked, returned or failed.
	RetryMin, RetryMax time.Duration
	// SettleTimeout bounds how long Run waits, when stopping, for
	// outstanding confirms; rows still unconfirmed then stay pending.
	SettleTimeout time.Duration
	// MaxAttempts is how many failed attempts park a message. A parked
	// message, and every later message of its key, waits for an operator.
	MaxAttempts int
	// RetentionAge is how long processed rows are kept; 0 keeps them
	// forever. Dead (skipped) rows stay until purged.
	RetentionAge time.Duration
	// RetentionInterval is how often retention runs; RetentionChunk is the
	// most rows one DELETE removes, so no statement holds locks for long.
	RetentionInterval time.Duration
	RetentionChunk    int
	// Logger receives outage and progress messages.
	Logger *slog.Logger
}

// DefaultConfig returns the defaults for a node named node.
func DefaultConfig(node string) Config {
	return Config{
		Node:              node,
		Window:            512,
		PerKeyLimit:       1,
		BatchSize:         512,
		PollInterval:      time.Second,
		ReadTimeout:       time.Second,
		RetryMin:          100 * time.Millisecond,
		RetryMax:          30 * time.Second,
		SettleTimeout:     5 * time.Second,
		MaxAttempts:       5,
		RetentionAge:      24 * time.Hour,
		RetentionInterval: time.Minute,
		RetentionChunk:    1000,
	}
}

func (c *Config) applyDefaults() {
	d := DefaultConfig(c.Node)
	if c.Window == 0 {
		c.Window = d.Window
	}
	if c.PerKeyLimit == 0 {
		c.PerKeyLimit = d.PerKeyLimit
	}
	if c.BatchSize == 0 {
		c.BatchSize = d.BatchSize
	}
	if c.PollInterval == 0 {
		c.PollInterval = d.PollInterval
	}
	if c.ReadTimeout == 0 {
		c.ReadTimeout = d.ReadTimeout
	}
	if c.RetryMin == 0 {
		c.RetryMin = d.RetryMin
	}
	if c.RetryMax == 0 {
		c.RetryMax = d.RetryMax
	}
	if c.SettleTimeout == 0 {
		c.SettleTimeout = d.SettleTimeout
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = d.MaxAttempts
	}
	if c.RetentionInterval == 0 {
		c.RetentionInterval = d.RetentionInterval
	}
	if c.RetentionChunk == 0 {
		c.RetentionChunk = d.RetentionChunk
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// Validate reports the first unusable setting.
func (c *Config) Validate() error {
	switch {
	case c.Node == "":
		return errors.New("relay: node name is required")
	case c.Window < 1 || c.Window > 65535:
		return fmt.Errorf("relay: confirm window %d out of range 1..65535", c.Window)
	case c.PerKeyLimit < 1:
		return fmt.Errorf("relay: per-key limit %d must be at least 1", c.PerKeyLimit)
	case c.BatchSize < 1:
		return fmt.Errorf("relay: batch size %d must be at least 1", c.BatchSize)
	case c.PollInterval <= 0 || c.ReadTimeout <= 0 || c.RetryMin <= 0 || c.RetryMax < c.RetryMin || c.SettleTimeout <= 0:
		return errors.New("relay: poll interval, read timeout, retry backoff and settle timeout must be positive, with RetryMax >= RetryMin")
	case c.MaxAttempts < 1:
		return fmt.Errorf("relay: max attempts %d must be at least 1", c.MaxAttempts)
	case c.RetentionAge < 0 || c.RetentionInterval <= 0 || c.RetentionChunk < 1:
		return errors.New("relay: retention age must not be negative; retention interval and chunk must be positive")
	}
	return nil
}

// Relay moves pending outbox rows of the partitions its node holds to the
// broker. Create it with New and run it with Run.
type Relay struct {
	cfg   Config
	store Store
	pub   Publisher
	own   Ownership

	wakeRead chan struct{}  // coalesced: something may be readable
	wakeMark chan struct{}  // coalesced: settlements are queued
	retryAt  chan time.Time // a failed key may be read again at this time

	mu          sync.Mutex
	flights     map[uuid.UUID]*flight // published and not yet marked, or backing off
	perKey      map[string]int
	unconfirmed int
	queue       []settlement
	stats       Stats
	progress    *progress
}

// Stats are running totals since the relay started.
type Stats struct {
	Published, Confirmed, Marked, Failed, Parked, Unsent, Refused, Deleted int64
	// Reads counts reads of key heads. IdleReads counts the reads that
	// returned rows of which none could be published. LeaseSkipped counts
	// rows read but not published because their partition's lease lapsed
	// or changed hands during the read; they stay pending.
	Reads, IdleReads, LeaseSkipped int64
	// StalledSeconds is how long the relay has gone without publishing
	// while reads fail or return rows it cannot publish; 0 while it makes
	// progress or has nothing to do.
	StalledSeconds        float64
	InFlight, Unconfirmed int
}

type flight struct {
	msg      Message
	attempts int
}

type settlement struct {
	f   *flight
	res Result
}

// New returns a Relay.
func New(cfg Config, store Store, pub Publisher, own Ownership) (*Relay, error) {
	cfg.applyDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Relay{
		cfg: cfg, store: store, pub: pub, own: own,
		wakeRead: make(chan struct{}, 1),
		wakeMark: make(chan struct{}, 1),
		retryAt:  make(chan time.Time, 64),
		flights:  map[uuid.UUID]*flight{},
		perKey:   map[string]int{},
		progress: newProgress(cfg.Logger),
	}, nil
}

// holds reports whether the node holds partition p now.
func (r *Relay) holds(p int) bool {
	_, ok := r.own.Leases()[p]
	return ok
}

// Stats returns a snapshot of the running totals.
func (r *Relay) Stats() Stats {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.stats
	s.InFlight, s.Unconfirmed = len(r.flights), r.unconfirmed
	r.progress.fill(&s)
	return s
}

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// Run publishes until ctx ends. Then it stops reading, waits up to
// SettleTimeout for outstanding confirms, marks what was confirmed, and
// returns nil. Rows left unconfirmed stay pending and are published again
// by whoever holds their partition next. Keep the Publisher running until
// Run has returned.
func (r *Relay) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	markCtx, stopMark := context.WithCancel(context.Background())
	defer stopMark()
	markDone := make(chan struct{})
	go func() {
		defer close(markDone)
		r.markLoop(markCtx)
	}()
	wg.Add(3)
	go func() {
		defer wg.Done()
		_ = r.store.Listen(ctx, func(p int) {
			// Another node's partition is another node's business: with
			// N nodes, waking on every notification would make N reads of
			// every producer's commit.
			if p < 0 || r.holds(p) {
				signal(r.wakeRead)
			}
		})
	}()
	go func() {
		defer wg.Done()
		r.retentionLoop(ctx)
	}()
	go func() {
		defer wg.Done()
		r.readLoop(ctx)
	}()
	wg.Wait()

	// Settle: wait for outstanding confirms, then let the marker finish.
	deadline := time.Now().Add(r.cfg.SettleTimeout)
	for {
		r.mu.Lock()
		n := r.unconfirmed
		r.mu.Unlock()
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			r.cfg.Logger.Warn("stopping with unconfirmed messages; they stay pending", "count", n)
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	stopMark()
	<-markDone
	return nil
}

// readLoop reads key heads and publishes them while ctx lasts.
func (r *Relay) readLoop(ctx context.Context) {
	down := outage.New(r.cfg.Logger, "PostgreSQL (outbox reads)")
	bo := backoff.New(50*time.Millisecond, 2*time.Second)
	// The publisher reconnects on its own; check for it often so the first
	// publish follows a broker's return closely.
	pubWait := backoff.New(20*time.Millisecond, 200*time.Millisecond)
	poll := time.NewTicker(r.cfg.PollInterval)
	defer poll.Stop()
	retry := time.NewTimer(time.Hour)
	defer retry.Stop()
	var nextRetry time.Time
	for {
		more, err := r.readOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		switch {
		case errors.As(err, new(*publishError)):
			// The publisher reconnects and logs on its own; look again soon.
			if !backoff.Sleep(ctx, pubWait.Next()) {
				return
			}
			continue
		case err != nil:
			down.Fail(err)
			if !backoff.Sleep(ctx, bo.Next()) {
				return
			}
			continue
		}
		down.OK()
		bo.Reset()
		pubWait.Reset()
		if more {
			continue
		}
		for waiting := true; waiting; {
			select {
			case <-ctx.Done():
				return
			case <-r.wakeRead:
				waiting = false
			case <-r.own.Changed():
				waiting = false
			case <-poll.C:
				waiting = false
			case <-retry.C:
				nextRetry = time.Time{}
				waiting = false
			case at := <-r.retryAt:
				// Wake when the earliest failed key may go again.
				if nextRetry.IsZero() || at.Before(nextRetry) {
					nextRetry = at
					retry.Reset(time.Until(at))
				}
			}
		}
	}
}

// readOnce does one read-and-publish round. more reports that a full batch
// was read and some of it published, so another read should follow at once.
//
// Each row read is checked against its partition's lease as it stands
// when the row is published, not as it stood before the read: a read that
// took long while the leases were renewed loses nothing (issue 9).
func (r *Relay) readOnce(ctx context.Context) (more bool, err error) {
	leases := r.own.Leases()
	now := time.Now()
	parts := make([]int32, 0, len(leases))
	for p, l := range leases {
		if l.Valid(now) {
			parts = append(parts, int32(p))
		}
	}
	if len(parts) == 0 {
		return false, nil
	}
	if !r.pub.Connected() {
		return false, &publishError{ErrNotConnected} // no read while there is nowhere to publish
	}
	r.mu.Lock()
	free := r.cfg.Window - r.unconfirmed
	exclude := make([]uuid.UUID, 0, len(r.flights))
	for id := range r.flights {
		exclude = append(exclude, id)
	}
	r.mu.Unlock()
	if free <= 0 {
		return false, nil // a confirm will wake us
	}
	limit := min(free, r.cfg.BatchSize)
	rctx, cancel := context.WithTimeout(ctx, r.cfg.ReadTimeout)
	rows, err := r.store.ReadHeads(rctx, parts, exclude, r.cfg.PerKeyLimit, limit)
	cancel()
	r.progress.read(err)
	if err != nil {
		if rctx.Err() != nil && ctx.Err() == nil {
			err = fmt.Errorf("%w (the read took longer than %v)", err, r.cfg.ReadTimeout)
		}
		return false, err
	}
	published, leaseSkipped := 0, 0
	defer func() {
		r.progress.leaseSkipped(leaseSkipped)
		r.progress.round(len(rows), published)
	}()
	for i := range rows {
		row := &rows[i]
		if row.PrevDead {
			prev, err := r.store.PrevKeySeq(ctx, row.CorrelationID, row.KeySeq)
			if err != nil {
				return false, err
			}
			row.PrevKeySeq = prev
		}
		f, bad, skip := r.newFlight(row, leases[row.Partition].Epoch)
		if skip == skipLease {
			leaseSkipped++
		}
		if skip != "" {
			continue
		}
		if bad != nil {
			// A row the relay cannot turn into a message (a header a plain
			// INSERT wrote that AMQP cannot carry) fails like a nack: it
			// backs off, is parked after MaxAttempts, and only its key waits.
			r.settle(f, Result{Outcome: Failed, Err: fmt.Errorf("unpublishable row: %w", bad)})
			published++
			continue
		}
		if err := r.pub.Publish(ctx, &f.msg, func(res Result) { r.settle(f, res) }); err != nil {
			r.drop(f)
			return false, &publishError{err}
		}
		published++
	}
	return len(rows) == limit && published > 0, nil
}

// Drained reports whether no message of partition is published and not
// yet settled and marked. Messages backing off after a failure do not
// count: they are not in flight. Safe for concurrent use.
func (r *Relay) Drained(partition int) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, f := range r.flights {
		if f.msg.Partition == partition {
			return false
		}
	}
	return true
}

// publishError is a Publish failure: the message was not sent.
type publishError struct{ err error }

func (e *publishError) Error() string { return e.err.Error() }
func (e *publishError) Unwrap() error { return e.err }

// Reasons newFlight gives for not registering a row.
const (
	skipBusy  = "key busy"       // the row is in flight already, or its key is at its limit
	skipLease = "lease not held" // the partition's lease lapsed or changed hands since the read
)

// newFlight registers row as in flight, or says why not (skip): its key is
// at its limit already, or the partition's lease is no longer held at
// epoch. bad is set (with a flight registered, to be settled Failed) when
// the row cannot be turned into a message.
//
// The lease is checked again here, under r.mu, on the live leases:
// Drained also takes r.mu, so a handoff either sees this flight and waits
// for it, or has already taken the lease away and this check refuses. It
// is the last check before the publish (DESIGN.md invariant 3).
func (r *Relay) newFlight(row *Row, epoch int64) (f *flight, bad error, skip string) {
	headers, bad := decodeHeaders(row.Headers)
	f = &flight{
		attempts: row.Attempts,
		msg: Message{
			ID: row.ID, Partition: row.Partition, Epoch: epoch,
			CorrelationID: row.CorrelationID, KeySeq: row.KeySeq, PrevKeySeq: row.PrevKeySeq,
			Exchange: row.Exchange, RoutingKey: row.RoutingKey, Type: row.Type,
			Payload: row.Payload, Headers: headers, OccurredAt: row.OccurredAt,
		},
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, dup := r.flights[row.ID]; dup || r.perKey[row.CorrelationID] >= r.cfg.PerKeyLimit {
		return nil, nil, skipBusy
	}
	if l, ok := r.own.Lease(row.Partition); !ok || l.Epoch != epoch || !l.Valid(time.Now()) {
		r.stats.LeaseSkipped++
		return nil, nil, skipLease
	}
	r.flights[row.ID] = f
	r.perKey[row.CorrelationID]++
	r.unconfirmed++
	r.stats.Published++
	return f, bad, ""
}

// drop forgets a flight that was never sent.
func (r *Relay) drop(f *flight) {
	r.mu.Lock()
	r.unconfirmed--
	r.stats.Published--
	r.forgetLocked(f)
	r.mu.Unlock()
}

func (r *Relay) forgetLocked(f *flight) {
	if r.flights[f.msg.ID] != f {
		return
	}
	delete(r.flights, f.msg.ID)
	if n := r.perKey[f.msg.CorrelationID] - 1; n > 0 {
		r.perKey[f.msg.CorrelationID] = n
	} else {
		delete(r.perKey, f.msg.CorrelationID)
	}
}

// settle is the Publisher's callback. It never blocks.
func (r *Relay) settle(f *flight, res Result) {
	r.mu.Lock()
	r.unconfirmed--
	r.queue = append(r.queue, settlement{f, res})
	r.mu.Unlock()
	signal(r.wakeMark)
	signal(r.wakeRead) // a window slot is free
}

// markLoop writes settlements to the store and releases keys, until ctx
// ends; then it flushes once more.
func (r *Relay) markLoop(ctx context.Context) {
	down := outage.New(r.cfg.Logger, "PostgreSQL (outbox marks)")
	bo := backoff.New(50*time.Millisecond, 2*time.Second)
	for {
		stopping := false
		select {
		case <-ctx.Done():
			stopping = true
		case <-r.wakeMark:
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

// flush writes every queued settlement. On error the unwritten ones stay
// queued.
func (r *Relay) flush(ctx context.Context) error {
	r.mu.Lock()
	q := r.queue
	r.queue = nil
	r.mu.Unlock()
	if len(q) == 0 {
		return nil
	}
	var confirmed, failed []settlement
	var unsent []*flight
	for _, s := range q {
		switch s.res.Outcome {
		case Confirmed:
			confirmed = append(confirmed, s)
		case Unsent:
			unsent = append(unsent, s.f)
		default:
			failed = append(failed, s)
		}
	}
	requeue := func(rest ...[]settlement) {
		r.mu.Lock()
		for _, s := range rest {
			r.queue = append(r.queue, s...)
		}
		r.mu.Unlock()
	}
	r.mu.Lock()
	for _, f := range unsent {
		r.forgetLocked(f)
	}
	r.stats.Unsent += int64(len(unsent))
	r.mu.Unlock()

	if len(confirmed) > 0 {
		rows := make([]Settled, len(confirmed))
		for i, s := range confirmed {
			rows[i] = Settled{ID: s.f.msg.ID, Partition: s.f.msg.Partition, Epoch: s.f.msg.Epoch}
		}
		marked, err := r.store.MarkPublished(ctx, r.cfg.Node, rows)
		if err != nil {
			requeue(confirmed, failed)
			return err
		}
		ok := make(map[uuid.UUID]bool, len(marked))
		for _, id := range marked {
			ok[id] = true
		}
		refused := 0
		r.mu.Lock()
		for _, s := range confirmed {
			if !ok[s.f.msg.ID] {
				refused++
			}
			r.forgetLocked(s.f)
		}
		r.stats.Confirmed += int64(len(confirmed))
		r.stats.Marked += int64(len(marked))
		r.stats.Refused += int64(refused)
		r.mu.Unlock()
		if refused > 0 {
			r.cfg.Logger.Warn("marks refused: lease no longer held at the published epoch, or row already processed",
				"refused", refused)
		}
	}
	if len(failed) > 0 {
		rows := make([]Settled, len(failed))
		earliest := time.Duration(-1)
		for i, s := range failed {
			d := backoff.Attempt(s.f.attempts, r.cfg.RetryMin, r.cfg.RetryMax)
			rows[i] = Settled{ID: s.f.msg.ID, Partition: s.f.msg.Partition, Epoch: s.f.msg.Epoch, Err: s.res.Err.Error(), Delay: d}
			if earliest < 0 || d < earliest {
				earliest = d
			}
		}
		parked, err := r.store.RecordFailures(ctx, r.cfg.Node, rows, r.cfg.MaxAttempts)
		if err != nil {
			requeue(failed)
			return err
		}
		// The database now holds each key back until its next attempt.
		r.mu.Lock()
		for _, s := range failed {
			r.forgetLocked(s.f)
		}
		r.stats.Failed += int64(len(failed))
		r.stats.Parked += int64(len(parked))
		r.mu.Unlock()
		select {
		case r.retryAt <- time.Now().Add(earliest):
		default: // the reader has plenty of wake-ups queued; polling covers the rest
		}
		for _, s := range failed {
			r.cfg.Logger.Debug("publish failed; key backs off", "id", s.f.msg.ID, "key", s.f.msg.CorrelationID,
				"outcome", s.res.Outcome, "err", s.res.Err)
		}
		for _, id := range parked {
			r.cfg.Logger.Warn("message parked after repeated failures; its key waits for an operator (retry or skip)",
				"id", id, "attempts", r.cfg.MaxAttempts)
		}
	}
	signal(r.wakeRead)
	return nil
}

// decodeHeaders turns the row's JSON headers into AMQP table values:
// integers become int64, other numbers float64.
func decodeHeaders(raw []byte) (map[string]any, error) {
	if len(raw) == 0 || bytes.Equal(raw, []byte("{}")) {
		return nil, nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		return nil, err
	}
	for k, v := range m {
		switch v := v.(type) {
		case json.Number:
			if i, err := v.Int64(); err == nil {
				m[k] = i
			} else if f, err := v.Float64(); err == nil {
				m[k] = f
			} else {
				return nil, fmt.Errorf("header %q: %w", k, err)
			}
		case string, bool:
		default:
			return nil, fmt.Errorf("header %q: value of type %T is not allowed", k, v)
		}
	}
	return m, nil
}
