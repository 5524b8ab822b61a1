package inbox

import (
	"sync"

	"github.com/jackc/pgx/v5/pgxpool"
)

// lanes runs one shard session's work, a job per delivery or per stored
// message due for a retry, keyed by the message's key (laneKey: its
// source and correlation id; an invalid delivery may have an empty one): up to max keys
// at once, each key's jobs strictly one after another in the order they
// were added (the broker's delivery order, which for one key is key_seq
// order). A key is in a lane from its first queued job until its queue is
// empty; while it is, no other lane takes a job of it. A key arriving
// while every lane is busy waits, in arrival order, for a lane to come
// free.
//
// One goroutine (the shard's dispatcher) calls add, addRetry, failed and
// stop; the lane goroutines are started by add and are all finished when
// stop returns. After stop (or a lane's error) no lane starts another
// job: each finishes the one in hand; the deliveries not handled stay
// unacknowledged and the broker requeues them when the channel closes.
type lanes struct {
	max   int
	slots chan struct{} // shared by every shard's lanes; nil: no cap

	mu       sync.Mutex
	queued   map[string][]func() error // keys in a lane or waiting for one
	waiting  []string                  // keys with no lane yet, in arrival order
	retrying map[string]bool           // keys with a retry job queued or running
	busy     int                       // lane goroutines running
	stopped  bool
	err      error         // the first lane error
	errc     chan struct{} // closed at the first lane error
	wg       sync.WaitGroup
}

func newLanes(max int, slots chan struct{}) *lanes {
	return &lanes{max: max, slots: slots, queued: map[string][]func() error{}, retrying: map[string]bool{}, errc: make(chan struct{})}
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
	l.add(key, func() error {
		defer func() {
			l.mu.Lock()
			delete(l.retrying, key)
			l.mu.Unlock()
		}()
		return job()
	})
}

// add queues job behind the jobs of key, starting a lane for the key if
// none has it and one is free.
func (l *lanes) add(k string, job func() error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stopped {
		return
	}
	if q, ok := l.queued[k]; ok {
		l.queued[k] = append(q, job)
		return
	}
	l.queued[k] = []func() error{job}
	if l.busy < l.max {
		l.busy++
		l.wg.Add(1)
		go l.run(k)
		return
	}
	l.waiting = append(l.waiting, k)
}

// run is one lane: it runs key's jobs until its queue is empty, then
// takes the next waiting key, and ends when there is none.
func (l *lanes) run(key string) {
	defer l.wg.Done()
	for {
		job, next, ok := l.take(key)
		if !ok {
			return
		}
		key = next
		if job == nil {
			continue
		}
		if err := l.runJob(job); err != nil {
			l.fail(err)
			return
		}
	}
}

// take returns key's next job; when key's queue is empty it releases the
// key and returns the next waiting key instead (job nil). ok is false
// when the lane should end: stopped, or nothing waits.
func (l *lanes) take(key string) (job func() error, next string, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stopped {
		l.busy--
		return nil, "", false
	}
	if q := l.queued[key]; len(q) > 0 {
		l.queued[key] = q[1:]
		return q[0], key, true
	}
	delete(l.queued, key)
	if len(l.waiting) == 0 {
		l.busy--
		return nil, "", false
	}
	next = l.waiting[0]
	l.waiting = l.waiting[1:]
	return nil, next, true
}

// runJob runs job in one of the instance's slots.
func (l *lanes) runJob(job func() error) error {
	if l.slots != nil {
		l.slots <- struct{}{}
		defer func() { <-l.slots }()
	}
	return job()
}

// poolSizer is what laneSlots reads from a *pgxpool.Pool.
type poolSizer interface{ Stat() *pgxpool.Stat }

// laneSlots returns the cap on an instance's lanes at work, of all its
// shards together: the pool's size less laneReserve connections for the
// lease loop and the retry polls. A busy lane holds a connection for its
// handler's transaction; uncapped, lanes queued for connections would
// make a renewal wait behind them and lose leases under load (measured:
// 510 redeliveries in one bench run with 16 connections for 16 lanes).
// nil (no cap) when db does not say its size.
func laneSlots(db DB) chan struct{} {
	p, ok := db.(poolSizer)
	if !ok {
		return nil
	}
	return make(chan struct{}, max(1, int(p.Stat().MaxConns())-laneReserve))
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
	l.stopped = true
}

// failed is closed at the first lane error; see wait.
func (l *lanes) failed() <-chan struct{} { return l.errc }

// stop makes every lane end after the delivery in hand, waits for them
// all, and returns the first lane error.
func (l *lanes) stop() error {
	l.mu.Lock()
	l.stopped = true
	l.mu.Unlock()
	l.wg.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}
