package relay

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// Dispatch: the ready keys' heads become flights (the per-key rule,
// keyrule.go, and the window decide which; the lease is checked last) and
// go to the Publisher.

// dispatch publishes every queued row the per-key rule and the window let
// go now, and returns how many it published. A Publish error (the broker
// went away) ends it; the row stays queued. So does ctx's end: a
// Publisher that settles or refuses every message inside Publish never
// fills the window, and Run must still stop.
func (r *Relay) dispatch(ctx context.Context) (int, error) {
	n := 0
	defer func() {
		if n > 0 {
			Flush(r.pub) // the round's messages go out together
		}
	}()
	for {
		if ctx.Err() != nil {
			return n, nil // Run is stopping; dispatchLoop sees it
		}
		f, leaseLost := r.nextFlight()
		if leaseLost {
			r.progress.leaseSkipped(1)
			continue
		}
		if f == nil {
			if n > 0 {
				r.progress.published()
			}
			return n, nil
		}
		if err := r.publish(ctx, f); err != nil {
			if n > 0 {
				r.progress.published()
			}
			return n, err
		}
		n++
	}
}

// nextFlight takes the next publishable head off the ready list and
// registers it as a flight, after checking its partition's live lease: the
// last check before the publish (docs/design.md, invariant 3). A Revoked is
// applied under r.mu too, so a handoff either finds this flight and waits
// for it, or the Ownership has already taken the lease away (before
// sending the Revoked) and this check refuses.
func (r *Relay) nextFlight() (f *flight, leaseLost bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	for r.flights.live() < r.cfg.Window && r.queues.waiting() > 0 {
		k := r.queues.pop()
		if !r.currentLocked(k) {
			continue
		}
		e, ok := r.headLocked(k, now)
		if !ok {
			r.forgetIfIdleLocked(k)
			continue
		}
		l, held := r.own.Lease(k.part.id)
		if !held || l.Epoch != k.part.epoch || !l.Valid(now) {
			// Tried again on the next poll or ownership change: a late
			// renewal may bring the lease back.
			r.queues.waitLease(k)
			r.stats.LeaseSkipped++
			return nil, true
		}
		f = &flight{key: k, e: e, size: e.size, attempts: e.row.Attempts, msg: Message{
			ID: e.row.ID, Partition: e.row.Partition, Epoch: k.part.epoch,
			CorrelationID: e.row.CorrelationID, KeySeq: e.row.KeySeq, PrevKeySeq: e.row.PrevKeySeq,
			Exchange: e.row.Exchange, RoutingKey: e.row.RoutingKey, Type: e.row.Type,
			Payload: e.row.Payload, OccurredAt: e.row.OccurredAt, Deadline: l.Deadline,
		}}
		if !r.flights.add(f) {
			// The node's window is full (Budget): k keeps its place, and
			// a slot given back wakes the relay.
			r.queues.pushFront(k)
			return nil, false
		}
		k.rows[0] = nil // the backing array would keep it alive
		k.rows = k.rows[1:]
		delete(k.part.queued, e.row.ID)
		k.published = max(k.published, e.row.KeySeq)
		r.stats.Published++
		if r.flights.perKey > 1 && !k.inReady && len(k.rows) > 0 {
			// Its next row goes right behind this one (tests only: the
			// rule is 1).
			r.queues.pushFront(k)
		}
		return f, false
	}
	r.flights.wantSlots(r.queues.waiting() > 0)
	return nil, false
}

// publish hands f to the publisher, with the deadline of the lease it was
// checked against: the publisher's waits (for the broker, for confirms)
// can outlast the lease, and it must not write after the deadline. A row
// that cannot become a message (headers a plain INSERT wrote that AMQP
// cannot carry) fails like a nack: it backs off, is parked after
// MaxAttempts, and only its key waits.
func (r *Relay) publish(ctx context.Context, f *flight) error {
	if f.e.row.PrevDead {
		Flush(r.pub) // what is held must not wait for the lookup
		lctx, cancel := context.WithTimeout(ctx, r.cfg.ReadTimeout)
		prev, err := r.store.PrevKeySeq(lctx, f.msg.CorrelationID, f.msg.KeySeq)
		cancel()
		if err != nil {
			r.unsend(f)
			return err
		}
		f.msg.PrevKeySeq = prev
		// A check followed by a wait is not a check: the lease again.
		l, held := r.own.Lease(f.msg.Partition)
		if !held || l.Epoch != f.msg.Epoch || !l.Valid(time.Now()) {
			r.unsend(f)
			r.progress.leaseSkipped(1)
			return nil
		}
		f.msg.Deadline = l.Deadline
	}
	headers, bad := decodeHeaders(f.e.row.Headers)
	if bad != nil {
		r.settle(f, Result{Outcome: Failed, Err: fmt.Errorf("unpublishable row: %w", bad)})
		return nil
	}
	f.msg.Headers = headers
	ctx = r.startSpan(ctx, f)
	if err := r.pub.Publish(ctx, &f.msg, func(res Result) { r.settle(f, res) }); err != nil {
		spanNotSent(f, err)
		r.unsend(f)
		if errors.Is(err, ErrLeaseExpired) {
			// The publisher waited past the lease deadline and sent
			// nothing: the row waits for a valid lease, like one that
			// found it lapsed before the publish.
			r.progress.leaseSkipped(1)
			return nil
		}
		return &publishError{err}
	}
	return nil
}

// publishError is a Publish failure: the message was not sent.
type publishError struct{ err error }

func (e *publishError) Error() string { return e.err.Error() }
func (e *publishError) Unwrap() error { return e.err }

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
