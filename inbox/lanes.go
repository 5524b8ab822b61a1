package inbox

import (
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
)

// lanes runs one shard session's work, a job per delivery or per stored
// message due for a retry, keyed by the message's key (laneKey: its
// source and correlation id; an invalid delivery may have an empty one),
// up to max lanes at once. A lane holds keys: a key is in a lane from its
// first queued job until its queue is empty after the lane's work on it;
// while it is, no other lane takes a job of it, so each key's jobs run
// strictly one after another in the order they were added (the broker's
// delivery order, which for one key is key_seq order). A key arriving
// while every lane is busy waits, in arrival order, for a lane.
//
// When a lane comes to work (it has a connection slot) it takes, as one
// batch for deliverBatch's group commit, the deliveries queued for its
// keys, and for as many waiting keys as it has room, each key's from its
// head, up to batch deliveries; a retry job at a key's head runs on its
// own first. It takes only what is queued, never waits for more. The
// keys stay in the lane until the batch is done, so a key's next
// delivery, queued meanwhile, waits for its predecessor's commit.
//
// One goroutine (the shard's dispatcher) calls add, addRetry, failed and
// stop; the lane goroutines are started by add and are all finished when
// stop returns. After stop (or a lane's error) no lane starts another
// batch: each finishes the one in hand; the deliveries not handled stay
// unacknowledged and the broker requeues them when the channel closes.
type lanes struct {
	max   int
	gate  *gate // shared by every shard's lanes; nil: no cap
	batch int   // the most deliveries a lane takes at once
	run   func([]*amqp.Delivery) error

	mu       sync.Mutex
	queued   map[string][]laneJob // keys in a lane or waiting for one
	waiting  []string             // keys with no lane yet, in arrival order
	retrying map[string]bool      // keys with a retry job queued or running
	busy     int                  // lane goroutines running
	stopped  bool
	err      error         // the first lane error
	errc     chan struct{} // closed at the first lane error
	quit     chan struct{} // closed once stopped: a lane waiting at the gate gives up
	wg       sync.WaitGroup
}

// laneJob is a delivery, batched with the lane's others, or a job that
// runs on its own (a retry).
type laneJob struct {
	d    *amqp.Delivery
	solo func() error
}

func newLanes(n int, g *gate, batch int, run func([]*amqp.Delivery) error) *lanes {
	return &lanes{max: n, gate: g, batch: max(1, batch), run: run, queued: map[string][]laneJob{},
		retrying: map[string]bool{}, errc: make(chan struct{}), quit: make(chan struct{})}
}

// addRetry adds a retry job for key unless one is queued or running: the
// retry poll finds a stored message due again before its job has run.
func (l *lanes) addRetry(key string, job func() error) {
	l.mu.Lock()
	if l.retrying[key] {
		l.mu.Unlock()
		return
	}
	l.retrying[key] = true
	l.mu.Unlock()
	l.queue(key, laneJob{solo: func() error {
		defer func() {
			l.mu.Lock()
			delete(l.retrying, key)
			l.mu.Unlock()
		}()
		return job()
	}})
}

// add queues delivery d behind the jobs of key.
func (l *lanes) add(key string, d *amqp.Delivery) { l.queue(key, laneJob{d: d}) }

// queue queues job behind the jobs of key, starting a lane for the key if
// none has it and one is free.
func (l *lanes) queue(k string, job laneJob) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stopped {
		return
	}
	if q, ok := l.queued[k]; ok {
		l.queued[k] = append(q, job)
		return
	}
	l.queued[k] = []laneJob{job}
	if l.busy < l.max {
		l.busy++
		l.wg.Add(1)
		go l.lane(k)
		return
	}
	l.waiting = append(l.waiting, k)
}

// lane is one lane: it works on its keys (key first) until they have no
// job left and no key waits, then ends.
func (l *lanes) lane(key string) {
	defer l.wg.Done()
	mine := []string{key}
	for {
		var ok bool
		if mine, ok = l.keep(mine); !ok {
			return
		}
		if l.gate != nil && !l.gate.acquire(l.quit) {
			l.mu.Lock()
			l.busy--
			l.mu.Unlock()
			return
		}
		start := time.Now()
		ds, solo, ok := l.take(&mine)
		var err error
		switch {
		case !ok:
		case solo != nil:
			err = solo()
		default:
			err = l.run(ds)
		}
		if l.gate != nil {
			l.gate.release(time.Since(start), ok && solo == nil)
		}
		if !ok {
			return
		}
		if err != nil {
			l.fail(err)
			return
		}
	}
}

// keep releases the keys of mine whose queue is empty (their jobs are
// done) and returns the rest; with none left it takes the first waiting
// key. ok is false when the lane should end: stopped, or nothing to do.
func (l *lanes) keep(mine []string) (kept []string, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stopped {
		l.busy--
		return nil, false
	}
	kept = mine[:0]
	for _, k := range mine {
		if len(l.queued[k]) > 0 {
			kept = append(kept, k)
		} else {
			delete(l.queued, k)
		}
	}
	if len(kept) == 0 && len(l.waiting) > 0 {
		kept = append(kept, l.waiting[0])
		l.waiting = l.waiting[1:]
	}
	if len(kept) == 0 {
		l.busy--
		return nil, false
	}
	return kept, true
}

// take returns the lane's next work: a retry job at the head of one of
// its keys, alone, or else up to batch deliveries, each key's from its
// head, after taking waiting keys into the lane while it has room. ok is
// false when stopped. A key of mine has at least one job (keep).
func (l *lanes) take(mine *[]string) (ds []*amqp.Delivery, solo func() error, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stopped {
		l.busy--
		return nil, nil, false
	}
	for len(*mine) < l.batch && len(l.waiting) > 0 {
		*mine = append(*mine, l.waiting[0])
		l.waiting = l.waiting[1:]
	}
	for _, k := range *mine {
		if q := l.queued[k]; len(q) > 0 && q[0].solo != nil {
			l.queued[k] = q[1:]
			return nil, q[0].solo, true
		}
	}
	for _, k := range *mine {
		q := l.queued[k]
		n := 0
		for n < len(q) && q[n].solo == nil && len(ds) < l.batch {
			ds = append(ds, q[n].d)
			n++
		}
		l.queued[k] = q[n:]
	}
	return ds, nil, true
}

// poolSizer is what laneSlots reads from a *pgxpool.Pool.
type poolSizer interface{ Stat() *pgxpool.Stat }

// laneGate returns the gate of an instance's lanes at work, of all its
// shards together: at most the pool's size less laneReserve connections
// (the one the lease loop holds, leaseConn, and one for the retry polls
// and gauges), and fewer while handlers are
// fast (gate). A busy lane holds a connection for its
// handler's transaction; uncapped, lanes queued for connections would
// make a renewal wait behind them and lose leases under load (measured:
// 510 redeliveries in one bench run with 16 connections for 16 lanes).
// nil (no cap) when db does not say its size.
func laneGate(db DB, handler func() time.Duration, inside func() int) *gate {
	p, ok := db.(poolSizer)
	if !ok {
		return nil
	}
	return newGate(int(p.Stat().MaxConns())-laneReserve, handler, inside)
}

// laneReserve is the connections of a pool laneSlots keeps from lanes.
const laneReserve = 2

func (l *lanes) fail(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.busy--
	if l.err == nil {
		l.err = err
		close(l.errc)
	}
	l.halt()
}

// halt marks the lanes stopped and lets lanes waiting at the gate go.
// The caller holds mu.
func (l *lanes) halt() {
	if !l.stopped {
		l.stopped = true
		close(l.quit)
	}
}

// failed is closed at the first lane error; see wait.
func (l *lanes) failed() <-chan struct{} { return l.errc }

// stop makes every lane end after the batch in hand, waits for them
// all, and returns the first lane error.
func (l *lanes) stop() error {
	l.mu.Lock()
	l.halt()
	l.mu.Unlock()
	l.wg.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}
