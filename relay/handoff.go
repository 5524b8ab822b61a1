package relay

import "context"

// How a partition comes and goes (see Ownership):
//
//   - Assigned: a partState is made for the partition at the lease's epoch
//     (one at another epoch is forgotten first), and the next read starts
//     a pass over it.
//   - Revoked: the partState leaves r.parts, with what it had read ahead;
//     its keys are no longer current, so nothing more of it is read or
//     published (and Ownership.Lease refuses it already). Its flights
//     still point at it and still run.
//
// A revoked partition can be taken up again before its flights end (the
// Leaser sends an Assigned at the same epoch when it is wanted again before
// its release, or it is lost and claimed again), and revoked again. So the
// count that Done waits for is kept per partition, not per partState: the
// flights of every state of the partition, old and new
// (flightBook.perPart). Each flight that ends (marked, recorded failed, or
// unsent) counts it down, and the last one calls every Done waiting on the
// partition (flightBook.waitFor, flightBook.move). With nothing of the
// partition in flight, Done is called at once.

// handoffLoop applies the Ownership's events until ctx ends.
func (r *Relay) handoffLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case ev := <-r.own.Events():
			r.apply(ev)
		}
	}
}

// apply brings the partitions in memory in line with one event.
func (r *Relay) apply(ev Event) {
	var done func()
	r.mu.Lock()
	switch ev := ev.(type) {
	case Assigned:
		l := ev.Lease
		if ps := r.parts[l.Partition]; ps == nil || ps.epoch != l.Epoch {
			if ps != nil {
				r.dropPartLocked(ps)
			}
			r.parts[l.Partition] = newPartState(l.Partition, l.Epoch)
		}
	case Revoked:
		p := ev.Partition
		if ps := r.parts[p]; ps != nil && ps.epoch == ev.Epoch {
			r.dropPartLocked(ps)
			r.stats.Revoked++
		}
		if ev.Done != nil && r.flights.waitFor(p, ev.Done) {
			done = ev.Done
		}
	}
	r.mu.Unlock()
	if done != nil {
		done()
	}
	signal(r.wake.read)
}
