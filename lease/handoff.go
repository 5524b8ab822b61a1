package lease

import (
	"context"
	"sync"
	"time"

	"github.com/ordo-relay/ordo/relay"
)

// How a partition leaves this node (see relay.Ownership):
//
//	tick: no longer wanted ──► revoking[p] = revocation; Lease(p) = not held
//	                           events ◄── Revoked{p, epoch, Done}
//	relay: stops reading p, lets p's flights settle and be marked
//	relay: Done() ──► revocation.acked closed, the leaser woken
//	tick: acked, or HandoffTimeout passed ──► release (owner NULL)
//
// The tick only looks at acked (never waits on it), so a relay that never
// answers delays nothing but that partition's release, and renewals of
// every lease held go on meanwhile, the revoked one's included.

// revocation is a partition being handed off.
type revocation struct {
	lease relay.Lease
	since time.Time
	once  sync.Once
	acked chan struct{} // closed by the relay's Done
}

// done is the Revoked.Done of r: it marks r acknowledged and wakes the
// leaser. Idempotent; never blocks.
func (l *Leaser) done(r *revocation) func() {
	return func() {
		r.once.Do(func() { close(r.acked) })
		signal(l.acked)
	}
}

func (r *revocation) isAcked() bool {
	select {
	case <-r.acked:
		return true
	default:
		return false
	}
}

// handoff compares what is held with what is wanted: it revokes held
// partitions no longer wanted, takes back revokes of partitions wanted
// again, and returns the revokes that are over (acknowledged, or timed
// out), whose leases are to be released, and when the next pending one
// times out (zero if none).
func (l *Leaser) handoff(want map[int]bool, now time.Time) (over []*revocation, next time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for p, x := range l.leases {
		r := l.revoking[p]
		switch {
		case want[p] && r != nil:
			// Wanted again before it was released: the relay takes it up
			// again at the same epoch (what it had read was forgotten).
			delete(l.revoking, p)
			l.events.push(relay.Assigned{Lease: x})
		case want[p]:
		case r == nil:
			r = &revocation{lease: x, since: now, acked: make(chan struct{})}
			l.revoking[p] = r
			l.events.push(relay.Revoked{Partition: p, Epoch: x.Epoch, Done: l.done(r)})
			fallthrough
		default:
			if r.isAcked() || now.Sub(r.since) >= l.cfg.HandoffTimeout {
				over = append(over, r)
			} else if at := r.since.Add(l.cfg.HandoffTimeout); next.IsZero() || at.Before(next) {
				next = at
			}
		}
	}
	return over, next
}

// handedOff records the revokes whose leases were just released.
func (l *Leaser) handedOff(over []*revocation, now time.Time) {
	var timedOut []*revocation
	l.mu.Lock()
	for _, r := range over {
		p := r.lease.Partition
		if l.revoking[p] == r {
			delete(l.revoking, p)
			delete(l.leases, p)
		}
		if !r.isAcked() {
			timedOut = append(timedOut, r)
		}
	}
	l.stats.Handoffs += int64(len(over))
	l.stats.HandoffTimeouts += int64(len(timedOut))
	l.mu.Unlock()
	for _, r := range timedOut {
		l.cfg.Logger.Warn("handoff timed out; unconfirmed rows stay pending for the next owner",
			"partition", r.lease.Partition, "after", now.Sub(r.since).Round(time.Millisecond))
	}
	l.cfg.Logger.Info("leases handed off", "count", len(over))
}

// mailbox carries a Leaser's events to its relay in order. push never
// blocks: events wait in a queue, which run moves to out as fast as the
// relay receives.
type mailbox struct {
	out   chan relay.Event
	ready chan struct{} // coalesced: the queue is not empty

	mu sync.Mutex
	q  []relay.Event
}

func newMailbox() *mailbox {
	return &mailbox{out: make(chan relay.Event), ready: make(chan struct{}, 1)}
}

func (m *mailbox) push(ev relay.Event) {
	m.mu.Lock()
	m.q = append(m.q, ev)
	m.mu.Unlock()
	signal(m.ready)
}

// run delivers queued events until ctx ends; what is left is dropped.
func (m *mailbox) run(ctx context.Context) {
	for {
		m.mu.Lock()
		var ev relay.Event
		if len(m.q) > 0 {
			ev = m.q[0]
		}
		m.mu.Unlock()
		if ev == nil {
			select {
			case <-ctx.Done():
				return
			case <-m.ready:
				continue
			}
		}
		select {
		case <-ctx.Done():
			return
		case m.out <- ev:
		}
		m.mu.Lock()
		m.q[0] = nil
		m.q = m.q[1:]
		m.mu.Unlock()
	}
}

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}
