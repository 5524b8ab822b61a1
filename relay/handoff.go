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
// (Relay.flightsOf). Each flight that ends (marked, recorded failed, or
// unsent) counts it down, and the last one calls every Done waiting on the
// partition (Relay.revoked). With nothing of the partition in flight,
// Done is called at once.

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
		switch {
		case ev.Done == nil:
		case r.flightsOf[p] == 0:
			done = ev.Done
		default:
			// Flights of p may belong to this state or to one it replaced
			// (revoked, then taken up again): Done waits for them all.
			r.revoked[p] = append(r.revoked[p], ev.Done)
		}
	}
	r.mu.Unlock()
	if done != nil {
		done()
	}
	signal(r.wakeRead)
}

// startFlightLocked registers f as published.
func (r *Relay) startFlightLocked(f *flight) {
	r.flights[f.msg.ID] = f
	f.key.flights++
	r.flightsOf[f.msg.Partition]++
}

// endFlightLocked forgets f, which was marked, recorded failed, or not
// sent after all. If f was the last flight of its partition, it returns
// a function calling the Revoked.Done of every revoke waiting for the
// partition (call it after unlocking), else nil.
func (r *Relay) endFlightLocked(f *flight) (done func()) {
	delete(r.flights, f.msg.ID)
	r.bytes -= f.size
	f.key.flights--
	p := f.msg.Partition
	if r.flightsOf[p]--; r.flightsOf[p] > 0 {
		return nil
	}
	delete(r.flightsOf, p)
	dones := r.revoked[p]
	delete(r.revoked, p)
	if len(dones) == 0 {
		return nil
	}
	return func() {
		for _, d := range dones {
			d()
		}
	}
}
