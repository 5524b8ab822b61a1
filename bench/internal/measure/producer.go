package measure

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/errgroup"

	"github.com/ordo-relay/ordo/outbox"
)

const (
	// pacerTick is how often the pacer hands out the commits that have
	// come due. Short enough that commits are spread evenly; long enough
	// that a loaded 2-core machine keeps up with the ticker.
	pacerTick = 2 * time.Millisecond
	// txTimeout bounds one producer transaction.
	txTimeout = 10 * time.Second
	// CommitErrorsShown is how many commit errors are printed.
	CommitErrorsShown = 5
)

// ProducerConfig configures a paced producer.
type ProducerConfig struct {
	Rate     int    // commits per second, all workers together
	Workers  int    // goroutines, one connection each
	Keys     int    // correlation ids are drawn uniformly from Keys of them
	Payload  int    // approximate payload size in bytes
	Exchange string // where the messages go
	// Orders makes every token an order: a fresh correlation id gets
	// OrderPlaced and then, in a second transaction right after the first
	// commits, OrderCancelled. Rate is then orders per second.
	Orders bool
	// Max stops the producer after this many tokens (0: until its context
	// ends). With Max, a token waits for a free worker rather than being
	// missed, so exactly Max are produced unless ctx ends first.
	Max int64
}

// CommitTimes is when one message's transaction ran.
type CommitTimes struct {
	Key       string    // correlation id
	Typ       string    // message type
	Begun     time.Time // before BEGIN
	Sent      time.Time // before COMMIT was sent
	Committed time.Time // after COMMIT returned
}

// Producer commits one outbox row per transaction at a fixed rate: a pacer
// goroutine turns a ticker into commit tokens (as many as have come due
// since the start, so ticks the runtime drops do not lower the rate), and
// workers take tokens. A token nobody is free to take is counted as missed
// rather than queued, so a producer that cannot keep up shows as a lower
// achieved rate, not as latency. Safe for concurrent use.
type Producer struct {
	cfg  ProducerConfig
	pool *pgxpool.Pool
	out  *outbox.Producer

	mu      sync.Mutex
	commits map[string]CommitTimes // message id -> times, committed rows only
	order   []string               // message ids in commit order
	errors  int
	missed  int64
	started time.Time
	stopped time.Time
}

func NewProducer(cfg ProducerConfig, pool *pgxpool.Pool, partitions int) (*Producer, error) {
	out, err := outbox.NewProducer(partitions)
	if err != nil {
		return nil, err
	}
	return &Producer{cfg: cfg, pool: pool, out: out, commits: map[string]CommitTimes{}}, nil
}

// Run commits at the configured rate until ctx ends, then waits for the
// transactions in progress (they run under a context of their own, so
// stopping never leaves a commit of unknown outcome) and returns nil.
func (p *Producer) Run(ctx context.Context) error {
	tokens := make(chan struct{}, p.cfg.Workers)
	var g errgroup.Group
	p.mu.Lock()
	p.started = time.Now()
	p.mu.Unlock()
	g.Go(func() error {
		defer close(tokens)
		p.pace(ctx, tokens)
		return nil
	})
	for w := range p.cfg.Workers {
		g.Go(func() error {
			p.work(w, tokens)
			return nil
		})
	}
	err := g.Wait()
	p.mu.Lock()
	p.stopped = time.Now()
	p.mu.Unlock()
	return err
}

func (p *Producer) pace(ctx context.Context, tokens chan<- struct{}) {
	start := time.Now()
	tick := time.NewTicker(pacerTick)
	defer tick.Stop()
	var emitted int64
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			due := int64(now.Sub(start).Seconds() * float64(p.cfg.Rate))
			if p.cfg.Max > 0 {
				due = min(due, p.cfg.Max)
			}
			for emitted < due {
				if p.cfg.Max > 0 {
					select {
					case tokens <- struct{}{}: // waits for a free worker
						emitted++
					case <-ctx.Done():
						return
					}
					continue
				}
				select {
				case tokens <- struct{}{}:
					emitted++
				default: // every worker is busy: the rest of this tick is missed
					p.mu.Lock()
					p.missed += due - emitted
					p.mu.Unlock()
					emitted = due
				}
			}
			if p.cfg.Max > 0 && emitted == p.cfg.Max {
				return
			}
		}
	}
}

func (p *Producer) work(worker int, tokens <-chan struct{}) {
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), uint64(worker)))
	pad := strings.Repeat("x", max(0, p.cfg.Payload-len(`{"key":"key-1234","pad":"","t":1767000000000000000}`)))
	for range tokens {
		if !p.cfg.Orders {
			p.commit("key-"+strconv.Itoa(rng.IntN(p.cfg.Keys)), "ordo.bench.event.v1", pad)
			continue
		}
		key := "order-" + uuid.NewString()
		if p.commit(key, "OrderPlaced", pad) {
			p.commit(key, "OrderCancelled", pad)
		}
	}
}

// commit writes one message in a transaction of its own and records it.
// It reports whether the transaction committed.
func (p *Producer) commit(key, typ, pad string) bool {
	id, t, err := p.commitOne(key, typ, pad)
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil {
		p.errors++
		if p.errors <= CommitErrorsShown {
			fmt.Fprintf(os.Stderr, "bench: producer: %v\n", err)
		}
		return false
	}
	p.commits[id] = t
	p.order = append(p.order, id)
	return true
}

// commitOne writes one message in a transaction of its own.
func (p *Producer) commitOne(key, typ, pad string) (string, CommitTimes, error) {
	ctx, cancel := context.WithTimeout(context.Background(), txTimeout)
	defer cancel()
	t := CommitTimes{Key: key, Typ: typ}
	t.Begun = time.Now()
	tx, err := p.pool.Begin(ctx)
	if err != nil {
		return "", t, fmt.Errorf("begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }() // no-op after Commit
	// "t" is the producer's clock when the row was written, for consumers
	// that want a latency without the bench's bookkeeping.
	payload, err := json.Marshal(map[string]any{"key": key, "t": time.Now().UnixNano(), "pad": pad})
	if err != nil {
		return "", t, fmt.Errorf("payload: %w", err)
	}
	ids, err := p.out.Enqueue(ctx, tx, outbox.Message{
		CorrelationID: key,
		Exchange:      p.cfg.Exchange,
		RoutingKey:    "bench.event",
		Type:          typ,
		Payload:       payload,
	})
	if err != nil {
		return "", t, err
	}
	t.Sent = time.Now()
	if err := tx.Commit(ctx); err != nil {
		return "", t, fmt.Errorf("commit: %w", err)
	}
	t.Committed = time.Now()
	return ids[0].String(), t, nil
}

// Snapshot returns the committed messages so far, in commit order, with
// their times.
func (p *Producer) Snapshot() ([]string, map[string]CommitTimes) {
	p.mu.Lock()
	defer p.mu.Unlock()
	m := make(map[string]CommitTimes, len(p.commits))
	for k, v := range p.commits {
		m[k] = v
	}
	return append([]string(nil), p.order...), m
}

// CommittedBefore returns the ids whose COMMIT returned before t.
func (p *Producer) CommittedBefore(t time.Time) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var ids []string
	for _, id := range p.order {
		if p.commits[id].Committed.Before(t) {
			ids = append(ids, id)
		}
	}
	return ids
}

// StartedAt returns when run started.
func (p *Producer) StartedAt() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.started
}

// producerStats are a finished producer's totals.
type producerStats struct {
	Committed int
	Errors    int
	Missed    int64
	Elapsed   time.Duration
}

func (p *Producer) Stats() producerStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return producerStats{Committed: len(p.order), Errors: p.errors, Missed: p.missed, Elapsed: p.stopped.Sub(p.started)}
}
