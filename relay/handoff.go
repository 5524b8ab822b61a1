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
//     still point at it: each one that ends (marked, recorded failed, or
//     unsent) counts down partState.flights, and the last one calls the
//     Revoked's Done. With nothing in flight, Done is called at once.

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
		ps := r.parts[ev.Partition]
		if ps == nil || ps.epoch != ev.Epoch {
			done = ev.Done // nothing of it here
			break
		}
		r.dropPartLocked(ps)
		r.stats.Revoked++
		if ps.flights == 0 {
			done = ev.Done
		} else if ev.Done != nil {
			ps.revoked = ev.Done
			r.revoking++
		}
	}
	r.mu.Unlock()
	if done != nil {
		done()
	}
	signal(r.wakeRead)
}

// endFlightLocked forgets f, which was marked, recorded failed, or not
// sent after all, and returns its partition's Revoked.Done if f was the
// last flight of a revoked partition (call it after unlocking).
func (r *Relay) endFlightLocked(f *flight) (done func()) {
	delete(r.flights, f.msg.ID)
	r.bytes -= f.size
	f.key.flights--
	ps := f.key.part
	ps.flights--
	if ps.flights == 0 && ps.revoked != nil {
		done, ps.revoked = ps.revoked, nil
		r.revoking--
	}
	return done
}
