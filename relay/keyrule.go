package relay

import "time"

// The per-key rule: a key's next row goes only once nothing of the key is
// unsettled and the row below it is confirmed or was processed, and not
// while it is parked or backing off. Together with the window it keeps
// each key in order while the pipeline stays full across keys.

// headLocked returns k's next row if the per-key rule lets it go now:
// not parked or backing off, nothing of the key unsettled (fewer than
// flightBook.perKey, which only a test raises) and no failure of it waiting to
// be recorded, and the row below it confirmed by this relay in this epoch
// or already processed when the row was read (at a perKey above 1, merely
// published: what tests use to show the rule matters). A head that backs
// off is remembered, and the retry timer wakes the relay for it.
func (r *Relay) headLocked(k *keyState, now time.Time) (*entry, bool) {
	unsettled := k.flights[flightSent]
	if len(k.rows) == 0 || k.flights[flightFailed] > 0 || unsettled >= r.flights.perKey {
		return nil, false
	}
	e := k.rows[0]
	if e.row.Parked {
		return nil, false
	}
	if now.Before(e.row.NextAttemptAt) {
		r.queues.backOff(k)
		return nil, false
	}
	prev := e.row.KeySeq - 1
	switch {
	case unsettled == 0 && (!e.row.PrevPending || prev <= k.confirmed):
	case r.flights.perKey > 1 && (!e.row.PrevPending || prev <= k.published):
	default:
		return nil, false
	}
	return e, true
}

// forgetIfIdleLocked drops k once nothing of it is queued or live in
// flight, and it waits in no list (ready, backing off, lease wait): a
// key's memory lasts as long as its work, not its partition's pass. Its
// next row, read later, is judged by the database (the row below it is
// marked by then).
func (r *Relay) forgetIfIdleLocked(k *keyState) {
	if len(k.rows) > 0 || k.flights.live() > 0 || r.queues.holds(k) || k.gapFrom > 0 {
		return
	}
	if ps := k.part; ps.keys[k.name] == k {
		delete(ps.keys, k.name)
	}
}

// earliestRetryLocked returns when the first backing-off key may go again
// (zero if none), and puts the keys whose time has come back in line
// (due: at least one).
func (r *Relay) earliestRetryLocked(now time.Time) (first time.Time, due bool) {
	first, ks := r.queues.retryDue(now, r.currentLocked)
	for _, k := range ks {
		r.pushReadyLocked(k)
	}
	return first, len(ks) > 0
}

// eligibleLocked counts queued heads that nothing but a lease or a stall
// keeps from going: the measure of a silent stall.
func (r *Relay) eligibleLocked(now time.Time) int {
	if r.flights.full(r.cfg.Window) {
		return 0 // the window is full (the node's, with a Budget): confirms will free it
	}
	n := 0
	for _, ps := range r.parts {
		for _, k := range ps.keys {
			if _, ok := r.headLocked(k, now); ok {
				n++
			}
		}
	}
	return n
}
