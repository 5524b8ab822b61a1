package relay

import "time"

// How reads find every pending row without walking the backlog, and
// without making a commit wait (issue 23).
//
// A held partition is read two ways, both in seq order and a page at a
// time:
//
//   - Tail reads continue above the highest seq read so far in this epoch
//     (the cursor). They run whenever the partition may have new commits:
//     on a notification, on every poll while the relay is busy (wake.go),
//     and while the last page came back full. A commit in seq order is
//     read by the next tail read, whatever else the partition is doing.
//   - Passes start over from the partition's first pending row, a page at
//     a time, each page above the last one's highest seq, until a page
//     comes back short. They find what a cursor cannot: a row whose
//     transaction committed after a later row was read (docs/design.md,
//     "The relay": rows committed late), a row left out while memory was
//     full, the followers of a parked row an operator released. A pass
//     that has read everything forgets the queued rows it did not see
//     again.
//
// Order never depends on either cursor: each row says whether the row
// below it in its key was pending, and a key goes on only once that row is
// confirmed here or was processed.
//
// A pass is wanted when a row can have landed below the cursor: after a
// tail read that found new rows (a transaction that drew a lower seq may
// still commit; passes follow at passGap and 8 passGap), after a notified
// commit that a tail read did not find above the cursor, every passEvery,
// and when memory or an operator asks. passGap is 10 ms while the
// partition's known pending rows fit one read (a pass is then as cheap as
// a tail read) and minPassGap, 100 ms, when a pass would re-read a backlog,
// so a pass costs the partition's pending rows at most ten times a second
// and a read costs the rows it returns.
const (
	minPassGap      = 100 * time.Millisecond
	smallPassGap    = 10 * time.Millisecond
	followUps       = 2
	passEvery       = 5 * time.Second
	stallCheckEvery = 100 * time.Millisecond
)

// passGapLocked is how long after its last pass partition ps may start the
// next one: short while a pass costs little.
func (r *Relay) passGapLocked(ps *partState) time.Duration {
	if len(ps.queued)+r.flightsOf[ps.id] < r.cfg.BatchSize {
		return smallPassGap
	}
	return minPassGap
}

// passDueLocked reports whether a new pass of ps may start at now.
func (r *Relay) passDueLocked(ps *partState, now time.Time) bool {
	if ps.dirty && now.Sub(ps.lastPass) >= r.passGapLocked(ps) {
		return true
	}
	return !ps.passAt.IsZero() && !now.Before(ps.passAt)
}

// nextPassLocked returns when ps's next pass is due (zero: none wanted).
func (r *Relay) nextPassLocked(ps *partState) time.Time {
	if ps.reading {
		return time.Time{}
	}
	var at time.Time
	if ps.dirty {
		at = ps.lastPass.Add(r.passGapLocked(ps))
	}
	if !ps.passAt.IsZero() && (at.IsZero() || ps.passAt.Before(at)) {
		at = ps.passAt
	}
	return at
}

// followUpLocked schedules the next follow-up pass of ps, which has just
// completed one: after new rows, passes run at passGap, then 8 × passGap
// after the previous one, so that a transaction committing late is found
// about as late again as it was, and then every passEvery.
func (r *Relay) followUpLocked(ps *partState) {
	if !ps.passAt.IsZero() || ps.passStep >= followUps || ps.pass <= 1 {
		return // scheduled already, done, or the epoch's first pass
	}
	ps.passStep++
	ps.passAt = ps.lastPass.Add(r.passGapLocked(ps) << (3 * ps.passStep))
}
