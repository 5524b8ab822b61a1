package relay

import (
	"time"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel/trace"

	"github.com/ordo-relay/ordo/internal/backoff"
)

// flightState is where a published message stands. A flight only moves
// forward, and only through flightBook.move:
//
//	sent ──Confirmed──────► confirmed ──marked────► ended
//	  ├───Nacked, Returned, Failed ──► failed ──recorded──► ended
//	  └───Unsent, or never sent ─────────────────────────► ended
type flightState uint8

const (
	flightSent      flightState = iota // published; the publisher has not settled it
	flightConfirmed                    // confirmed; its mark is not written yet
	flightFailed                       // nacked, returned or failed; its failure record is not written yet
	flightEnded                        // marked, recorded, or not sent after all: forgotten
)

// flight is one published message, until it is marked or its failure is
// recorded.
type flight struct {
	msg      Message
	attempts int
	key      *keyState
	e        *entry
	size     int64
	state    flightState
	span     trace.Span // the publish's PRODUCER span; nil without tracing
}

// flightCounts counts flights by state (ended ones are not counted).
type flightCounts [flightEnded]int

// live counts the flights not ended: published and not yet marked,
// recorded failed or found unsent.
func (c *flightCounts) live() int { return c[flightSent] + c[flightConfirmed] + c[flightFailed] }

// flightBook owns the relay's flights and every count that follows their
// states: per key (keyState.flights), per partition, and the node's. Its
// only writers are add and move. With a Budget, add takes a slot of the
// node's window for the flight and move gives it back when the flight
// ends. Guarded by Relay.mu.
type flightBook struct {
	share   *share // the relay's part of its Budget; nil without one
	wanting bool   // the relay waits for a slot of its Budget (wantSlots)
	byID    map[uuid.UUID]*flight
	n       flightCounts     // the node's flights by state
	perPart map[int]int      // live flights per partition, whichever partState published them (handoff.go)
	revoked map[int][]func() // Revoked.Done calls waiting for their partition's flights to end
	// perKey is the most flights of one key unsettled at once: 1, which
	// keeps per-key order (a nacked message could be overtaken by its
	// successor otherwise). Only a test raises it, to show what breaks:
	// Run takes it from its context (internal/relayhook).
	perKey int
	tracer trace.Tracer // starts each flight's PRODUCER span; nil: tracing off
}

// full reports whether no flight may start now: window of them are
// live, or the Budget refuses the relay a slot.
func (b *flightBook) full(window int) bool {
	return b.live() >= window || b.share != nil && b.share.windowFull()
}

func newFlightBook(s *share, tracer trace.Tracer) flightBook {
	return flightBook{share: s, byID: map[uuid.UUID]*flight{}, perPart: map[int]int{}, revoked: map[int][]func(){},
		perKey: 1, tracer: tracer}
}

// live is the number of flights not ended: what the window bounds.
func (b *flightBook) live() int { return len(b.byID) }

// unconfirmed is the number of flights the publisher has not settled.
func (b *flightBook) unconfirmed() int { return b.n[flightSent] }

// has reports whether a flight of the row id is live.
func (b *flightBook) has(id uuid.UUID) bool { return b.byID[id] != nil }

// ofPartition is the number of live flights of partition p.
func (b *flightBook) ofPartition(p int) int { return b.perPart[p] }

// add registers f as sent, and reports true; or false, registering
// nothing, when the Budget refuses it a slot (the node's window is full,
// or the relay is past its fair share while another relay waits).
func (b *flightBook) add(f *flight) bool {
	if b.share != nil && !b.share.takeSlot() {
		b.wanting = true // takeSlot recorded it
		return false
	}
	f.state = flightSent
	b.byID[f.msg.ID] = f
	b.n[flightSent]++
	f.key.flights[flightSent]++
	b.perPart[f.msg.Partition]++
	return true
}

// wantSlots records whether the relay stopped dispatching with rows left
// to publish (its own window full, or its Budget refusing it a slot) or
// ran dry: while it wants slots, the other relays of its Budget keep to
// their fair share.
func (b *flightBook) wantSlots(on bool) {
	if b.share != nil && on != b.wanting {
		b.wanting = on
		b.share.wantSlots(on)
	}
}

// move is the one transition of a flight: from its state to a later one,
// with every count following. When f ends as the last flight of its
// partition, move returns a function calling the Revoked.Done of every
// revoke waiting for the partition (call it after unlocking), else nil.
func (b *flightBook) move(f *flight, to flightState) (done func()) {
	from := f.state
	if to <= from {
		panic("relay: flight moved from " + from.String() + " back to " + to.String())
	}
	f.state = to
	b.n[from]--
	f.key.flights[from]--
	if to != flightEnded {
		b.n[to]++
		f.key.flights[to]++
		return nil
	}
	delete(b.byID, f.msg.ID)
	if b.share != nil {
		b.share.releaseSlot()
	}
	p := f.msg.Partition
	if b.perPart[p]--; b.perPart[p] > 0 {
		return nil
	}
	delete(b.perPart, p)
	dones := b.revoked[p]
	delete(b.revoked, p)
	if len(dones) == 0 {
		return nil
	}
	return func() {
		for _, d := range dones {
			d()
		}
	}
}

// waitFor keeps done until the last live flight of partition p ends, and
// reports false; with none live it reports true, and the caller calls done.
// Flights of p may belong to the current partState or to one it replaced
// (revoked, then taken up again): done waits for them all.
func (b *flightBook) waitFor(p int, done func()) (now bool) {
	if b.perPart[p] == 0 {
		return true
	}
	b.revoked[p] = append(b.revoked[p], done)
	return false
}

// revoking is the number of partitions whose revokes wait for flights.
func (b *flightBook) revoking() int { return len(b.revoked) }

func (s flightState) String() string {
	switch s {
	case flightSent:
		return "sent"
	case flightConfirmed:
		return "confirmed"
	case flightFailed:
		return "failed"
	default:
		return "ended"
	}
}

// endFlightLocked ends f (marked, recorded, or never sent) and frees its
// memory; see flightBook.move for done.
func (r *Relay) endFlightLocked(f *flight) (done func()) {
	r.mem.add(-f.size)
	return r.flights.move(f, flightEnded)
}

// settle is the Publisher's callback. It never blocks. A confirm lets the
// key's next row go at once; the mark follows in a batch. A failure puts
// the row back at its key's head, backing off, until the failure is
// recorded. Unsent puts it back as it was, to go again at once the first
// time and after unsentDelay when it is Unsent again (no attempt counted).
func (r *Relay) settle(f *flight, res Result) {
	spanSettled(f, res)
	var done func()
	r.mu.Lock()
	k := f.key
	switch res.Outcome {
	case Confirmed:
		r.flights.move(f, flightConfirmed)
		k.confirmed = max(k.confirmed, f.msg.KeySeq)
		r.settled.add(settlement{f, res})
	case Unsent:
		r.stats.Unsent++
		done = r.endFlightLocked(f)
		f.e.unsent++
		r.requeueLocked(f, time.Now().Add(r.unsentDelay(f.e.unsent)))
	default:
		r.flights.move(f, flightFailed)
		f.e.unsent = 0
		r.settled.add(settlement{f, res})
	}
	r.pushReadyLocked(k)
	r.mu.Unlock()
	if done != nil {
		done()
	}
	if res.Outcome != Unsent {
		signal(r.wake.mark)
	}
	signal(r.wake.dispatch) // the key's next row may go
	// And a round of the read loop: it arms partitions only after a round
	// with nothing read and nothing published since the last, and a
	// confirm is work going on (TestCoreBusyRelayIsNotNotified).
	signal(r.wake.read)
}

// unsentMaxDelay caps the wait of a row Unsent again and again.
const unsentMaxDelay = time.Second

// unsentDelay is how long a row waits before going again after its n-th
// Unsent in a row: nothing the first time (a channel closed under
// innocent messages, which go again as soon as the publisher is back),
// then RetryMin doubling, up to RetryMax or unsentMaxDelay. A Publisher
// may settle Unsent inside Publish; without the wait the relay would
// publish the row again at once, in the same dispatch, forever.
func (r *Relay) unsentDelay(n int) time.Duration {
	if n <= 1 {
		return 0
	}
	return backoff.Attempt(n-2, r.cfg.RetryMin, min(r.cfg.RetryMax, unsentMaxDelay))
}

// unsend takes back a flight that was never sent.
func (r *Relay) unsend(f *flight) {
	r.mu.Lock()
	r.stats.Published--
	done := r.endFlightLocked(f)
	r.requeueLocked(f, time.Time{})
	r.mu.Unlock()
	if done != nil {
		done()
	}
}

// requeueLocked puts f's row back at the head of its key's rows (if its
// partition is still held at the same epoch), not to be tried before
// notBefore.
func (r *Relay) requeueLocked(f *flight, notBefore time.Time) {
	k := f.key
	if !r.currentLocked(k) {
		return
	}
	e := f.e
	e.seen = k.part.rd.passNo()
	e.row.NextAttemptAt = notBefore
	k.rows = append([]*entry{e}, k.rows...)
	k.part.queued[e.row.ID] = e
	r.mem.add(e.size)
	r.pushReadyLocked(k)
}
