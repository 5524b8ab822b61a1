package relay

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"
	"golang.org/x/sync/errgroup"

	"github.com/ordo-relay/ordo/internal/relayhook"
)

// Relay moves pending outbox rows of the partitions its node holds to the
// broker, each key's rows in key_seq order. Create it with New and run it
// with Run.
//
// It reads each held partition's pending rows in seq order, a page at a
// time, into per-key queues in memory (bounded by ReadAheadBytes), and
// publishes a key's next row the moment the previous one is confirmed,
// without waiting for the mark or for another read. Marks and failure
// records are written in batches by a separate loop. state.go says which
// piece of state has which owner; pass.go how reads find rows committed
// late, keyrule.go the per-key rule, flight.go a message's lifecycle.
type Relay struct {
	cfg   Config
	store Store
	pub   Publisher
	own   Ownership

	mu        sync.Mutex
	wake      wakes              // wake-ups: the loops' signals, arming and polling (wake.go)
	parts     map[int]*partState // held partitions, as last synced with the leases
	flights   flightBook         // published and not yet marked or recorded failed (flight.go)
	gen       readGen            // what reads may overwrite (readgen.go)
	queues    keyQueues          // the lines keys wait in: ready, backing off, lease wait (queues.go)
	mem       memory             // bytes of queued rows and flights, for ReadAheadBytes and the Budget (memory.go)
	settled   writeBack          // confirmed or failed, not yet written (writeback.go)
	aloneTurn bool               // the next read is of a partition read alone (slowread.go)
	stats     Stats
	progress  *progress
}

// Stats are running totals since the relay started.
type Stats struct {
	Published, Confirmed, Marked, Failed, Parked, Unsent, Refused, Deleted int64
	// Reads counts reads of pending rows; Passes the reads that started a
	// partition over from its first pending row (see read.go). IdleReads
	// counts rounds that ended with rows ready to publish, room in the
	// window, and none published. LeaseSkipped counts rows not published
	// because their partition's lease lapsed or changed hands after they
	// were read; they stay pending.
	Reads, Passes, IdleReads, LeaseSkipped int64
	// SlowReads counts reads that outlasted ReadTimeout; SlowRows the
	// attempts charged to rows too slow to read alone (slowread.go).
	SlowReads, SlowRows int64
	// ReadRows and ReadSeconds total the rows and the time of every read;
	// Marks and MarkSeconds count the mark statements and their time
	// (Confirmed ÷ Marks is the mark batch size).
	ReadRows, Marks          int64
	ReadSeconds, MarkSeconds float64
	// StalledSeconds is how long the relay has gone without publishing
	// while reads fail or rows it could publish wait; 0 while it makes
	// progress or has nothing to do.
	StalledSeconds float64
	// Revoked counts partitions the Ownership revoked (handoffs begun);
	// Revoking is how many of them still wait for messages in flight
	// before the relay acknowledges.
	Revoked  int64
	Revoking int
	// InFlight counts messages published and not yet marked (at most W);
	// Unconfirmed those of them not yet confirmed. ReadAhead and
	// ReadAheadBytes are the rows held in memory, not yet published.
	InFlight, Unconfirmed, ReadAhead int
	ReadAheadBytes                   int64
	// BudgetSlots and BudgetBytes are what the relay's share of its
	// Config.Budget counts: its flights and its bytes (ReadAheadBytes:
	// one count, memory.go). 0 without a Budget.
	BudgetSlots int
	BudgetBytes int64
}

type settlement struct {
	f   *flight
	res Result
}

// New returns a Relay. Zero fields of cfg (but RetentionAge) take their
// DefaultConfig value; New refuses a cfg that Validate then refuses.
func New(cfg Config, store Store, pub Publisher, own Ownership) (*Relay, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	var tracer trace.Tracer
	if cfg.TracerProvider != nil {
		tracer = cfg.TracerProvider.Tracer(tracerName)
	}
	r := &Relay{
		cfg: cfg, store: store, pub: pub, own: own,
		wake:     newWakes(),
		parts:    map[int]*partState{},
		gen:      newReadGen(),
		queues:   newKeyQueues(),
		progress: newProgress(cfg.Logger),
	}
	var part *share // the relay's part of the Budget, held by flights and mem
	if cfg.Budget != nil {
		part = cfg.Budget.join(r.wake.dispatch, r.wake.read)
	}
	r.mem = newMemory(cfg.ReadAheadBytes, part)
	r.flights = newFlightBook(part, tracer)
	if n, ok := store.(EveryCommitNotified); ok {
		r.wake.everyCommit = n.EveryCommitNotifies()
	}
	return r, nil
}

// Stats returns a snapshot of the running totals.
func (r *Relay) Stats() Stats {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.stats
	s.InFlight, s.Unconfirmed, s.Revoking = r.flights.live(), r.flights.unconfirmed(), r.flights.revoking()
	s.ReadAhead = r.readAheadLocked()
	s.ReadAheadBytes = r.mem.held()
	if sh := r.flights.share; sh != nil {
		s.BudgetSlots, s.BudgetBytes = sh.counts()
	}
	r.progress.fill(&s)
	return s
}

// readAheadLocked returns how many rows read ahead wait to be published.
func (r *Relay) readAheadLocked() int {
	n := 0
	for _, ps := range r.parts {
		n += len(ps.queued)
	}
	return n
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
// Run has returned. It returns early, with its error, if the Store's
// Listen fails for good (after settling the same way).
func (r *Relay) Run(ctx context.Context) error {
	r.flights.perKey = relayhook.PerKeyLimit(ctx) // 1 but in tests; set before any goroutine reads it
	r.mu.Lock()
	r.wake.start(time.Now())
	r.mu.Unlock()
	var marks errgroup.Group
	markCtx, stopMark := context.WithCancel(context.Background())
	defer stopMark()
	marks.Go(func() error {
		r.markLoop(markCtx)
		return nil
	})
	work, wctx := errgroup.WithContext(ctx)
	work.Go(func() error {
		if err := r.store.Listen(wctx, r.notified); err != nil && wctx.Err() == nil {
			return fmt.Errorf("outbox notifications: %w", err)
		}
		return nil
	})
	work.Go(func() error {
		r.handoffLoop(wctx)
		return nil
	})
	work.Go(func() error {
		r.retentionLoop(wctx)
		return nil
	})
	work.Go(func() error {
		r.readLoop(wctx)
		return nil
	})
	work.Go(func() error {
		r.dispatchLoop(wctx)
		return nil
	})
	err := work.Wait()
	if sh := r.flights.share; sh != nil {
		sh.leave() // set once by New: read without mu
	}
	r.settleBeforeStop()
	stopMark()
	return errors.Join(err, marks.Wait())
}

// settleBeforeStop waits up to SettleTimeout for outstanding confirms.
func (r *Relay) settleBeforeStop() {
	deadline := time.Now().Add(r.cfg.SettleTimeout)
	for {
		r.mu.Lock()
		n := r.flights.unconfirmed()
		r.mu.Unlock()
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			r.cfg.Logger.Warn("stopping with unconfirmed messages; they stay pending", "count", n)
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}
