package relay

import "time"

// How reads find every pending row without walking the backlog, and
// without making a commit wait.
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
//
// partReader owns this state for one partition; the relay asks it what to
// read (wants, begin) and tells it what happened (readFailed, pageRead,
// and the wake-up events), and never sets its fields itself.
const (
	minPassGap   = 100 * time.Millisecond
	smallPassGap = 10 * time.Millisecond
	followUps    = 1
	passEvery    = 5 * time.Second
	// stallCheckEvery spaces the stall check's walk over every key in
	// memory (progress.checkDue): a stall is logged after stallAfter, so
	// a look every second is soon enough, and a node holding thousands
	// of keys read ahead pays for the walk once a second, not ten times.
	stallCheckEvery = time.Second
)

// partReader is where the reading of one partition stands: its cursor,
// its passes, and what its wake-ups asked for. Guarded by Relay.mu.
type partReader struct {
	cursor     int64     // highest seq read in this epoch: tail reads continue above it
	passCursor int64     // highest seq read in the current pass
	pass       uint64    // the current pass; entries carry the pass that last saw them
	reading    bool      // a pass is under way: the next read continues at passCursor
	dirty      bool      // a new pass is wanted as soon as the pass gap allows
	lastPass   time.Time // when the current pass began
	passAt     time.Time // when a follow-up pass is due (zero: none)
	passStep   int       // follow-up passes run since the last new rows
	hot        bool      // a tail read is wanted (a notification, a poll, or a full page)
	notified   bool      // a notification came since the last tail read began
	armed      bool      // the Store notifies this partition's commits (see wake.go)
	wakes      uint64    // notifications received: each disarms the partition
	polledNew  bool      // new rows were found above the cursor while unarmed, since the last pass began
}

// newPartReader is a partition just assigned: a pass is wanted at once.
func newPartReader() partReader {
	return partReader{dirty: true, passStep: followUps}
}

// readReq is what one read asked of one partition.
type readReq struct {
	ps       *partState
	pass     bool  // a page of a pass, not a tail read
	before   int64 // the partition's cursor when the read began
	first    bool  // the first page of a pass
	notified bool  // a tail read for a notification
	from     int64 // a page of a pass: the pass's cursor when the read began
}

// passNo is the current pass, which entries record as the last that saw them.
func (p *partReader) passNo() uint64 { return p.pass }

// saw moves the cursor past a row read.
func (p *partReader) saw(seq int64) { p.cursor = max(p.cursor, seq) }

// wantPass asks for a pass as soon as the gap allows.
func (p *partReader) wantPass() { p.dirty = true }

// isArmed reports whether the Store notifies this partition's commits.
func (p *partReader) isArmed() bool { return p.armed }

// wants reports whether the partition wants a read at now (gap: its pass
// gap), and whether that read is a page of a pass. A notified commit is
// read by a pass when the gap allows (it finds a commit below the cursor
// too, at the cost of one read), by a tail read now and a pass after the
// gap otherwise.
func (p *partReader) wants(now time.Time, gap time.Duration) (read, pass bool) {
	pass = p.reading || p.passDue(now, gap) || (p.notified && now.Sub(p.lastPass) >= gap)
	return pass || p.hot, pass
}

// passOnly reports whether what the partition wants read, if anything,
// is only a new pass coming due: no tail read asked for, no notification,
// no pass under way.
func (p *partReader) passOnly() bool { return !p.reading && !p.hot && !p.notified }

// begin starts a read that wants reported, and returns the request (ps
// left for the caller) and its cursor. req.first says it starts a pass;
// a pass reads the tail too, up to its last page.
func (p *partReader) begin(pass bool, now time.Time) (req readReq, after int64) {
	req = readReq{pass: pass, before: p.cursor}
	switch {
	case !pass:
		req.notified, p.notified = p.notified, false
		return req, p.cursor
	case !p.reading:
		p.pass++
		p.passCursor, p.reading, p.dirty, p.lastPass, p.passAt = 0, true, false, now, time.Time{}
		req.notified, req.first = p.notified, true
		p.hot, p.notified, p.polledNew = false, false, false
	}
	req.from = p.passCursor
	return req, p.passCursor
}

// readFailed takes back what a failed read asked for: read it again.
func (p *partReader) readFailed(req readReq) {
	p.hot = p.hot || !req.pass
	p.notified = p.notified || req.notified
}

// pageRead takes in the rows (got, in seq order, limit asked) that req's
// read returned at now, with gap the partition's pass gap after they were
// queued, and leftOut the seq of the first of them left out because memory
// was full (0: none). It reports how many of them count as new commits for
// the wake-up rate (counted false: the rate is left alone), and whether a
// pass has just read everything (then the caller sweeps and calls
// passEnded).
//
// A pass that left rows out resumes below the first of them once memory
// has room (Relay.readRefusedLocked), instead of reading on to the end
// and starting over from the partition's first pending row: a backlog
// larger than the read-ahead is read about once, not once per pass
// (TestCoreReadAheadFullReadsEachRowAboutOnce). A page that left out its
// first row (one row larger than the room) made no progress: the pass
// reads on, and a later pass comes back for it.
func (p *partReader) pageRead(req readReq, got []Row, limit int, leftOut int64, now time.Time, gap time.Duration) (commits int, counted, passDone bool) {
	fresh := len(got) > 0 && got[len(got)-1].Seq > req.before
	short := len(got) < limit
	if leftOut > 0 && (!req.pass || leftOut-1 <= req.from) {
		p.dirty = true
	}
	if req.pass {
		if len(got) > 0 {
			p.passCursor = max(p.passCursor, got[len(got)-1].Seq)
		}
		if leftOut > 0 && leftOut-1 > req.from {
			p.passCursor = leftOut - 1
			short = false // not done: it reads from there again
		}
		if fresh && req.notified {
			commits, counted = countAbove(got, req.before), true // commits, not a backlog
		}
		if fresh && !p.armed && req.first && short {
			// New rows found by a pass of one short page (a relay
			// that has just started, say) may be overtaken as well; a
			// backlog's pass is not repeated for it (tail reads soon
			// find what commits next, and schedule the follow-ups).
			p.scheduleFollowUps(now, gap)
		}
		if short {
			p.reading = false
		}
		return commits, counted, short
	}
	p.hot = !short
	switch {
	case req.notified:
		// The notified commit may have landed below the cursor.
		commits, counted = len(got), true
		p.dirty = true
	case fresh:
		commits, counted = len(got), true // busy: poll, do not arm (wake.go)
		if !p.armed {
			// Producers of an armed partition notify, and arming
			// waited for those that did not: follow-ups only while
			// it is polled.
			p.polledNew = true
			p.scheduleFollowUps(now, gap)
		}
	}
	return commits, counted, false
}

// passDue reports whether a new pass may start at now.
func (p *partReader) passDue(now time.Time, gap time.Duration) bool {
	if p.dirty && now.Sub(p.lastPass) >= gap {
		return true
	}
	return !p.passAt.IsZero() && !now.Before(p.passAt)
}

// nextPass returns when the next pass is due (zero: none wanted).
func (p *partReader) nextPass(gap time.Duration) time.Time {
	if p.reading {
		return time.Time{}
	}
	var at time.Time
	if p.dirty {
		at = p.lastPass.Add(gap)
	}
	if !p.passAt.IsZero() && (at.IsZero() || p.passAt.Before(at)) {
		at = p.passAt
	}
	return at
}

// passEnded schedules the next follow-up pass after one has completed:
// after new rows, passes run at gap, then 8 × gap after the previous one,
// so that a transaction committing late is found about as late again as
// it was, and then every passEvery.
func (p *partReader) passEnded(gap time.Duration) {
	if !p.passAt.IsZero() || p.passStep >= followUps {
		return // scheduled already, or done
	}
	p.passStep++
	p.passAt = p.lastPass.Add(gap << (3 * p.passStep))
}

// scheduleFollowUps starts the follow-up passes after new rows were read
// at now: a transaction that drew a seq below them may commit after them,
// so look below the cursor soon, and again later.
func (p *partReader) scheduleFollowUps(now time.Time, gap time.Duration) {
	p.passStep = 0
	if at := now.Add(gap); p.passAt.IsZero() || at.Before(p.passAt) {
		p.passAt = at
	}
}

// polled is the safety-net poll at now: a tail read, and a pass if none
// began for passEvery.
func (p *partReader) polled(now time.Time) {
	p.hot = true
	if now.Sub(p.lastPass) >= passEvery {
		p.dirty = true
	}
}

// pollTail asks for a tail read if the partition is not armed: a poll of
// the unarmed partitions.
func (p *partReader) pollTail() {
	if !p.armed {
		p.hot = true
	}
}

// notify is a notification of a commit to the partition, which disarmed
// it (the Store's contract): its next commits do not notify until it is
// armed again.
func (p *partReader) notify() {
	p.hot, p.notified, p.armed = true, true, false
	p.wakes++
}

// notifyArmed is a notification of a commit to the partition from a
// Store whose every commit notifies: the partition stays as armed as it
// was.
func (p *partReader) notifyArmed() { p.hot, p.notified = true, true }

// listenLost is Listen's (re)connect: nothing is armed, and a
// notification may have been lost, so read the tail and pass.
func (p *partReader) listenLost() { p.armed, p.hot, p.dirty = false, true, true }

// disarm marks the partition not armed.
func (p *partReader) disarm() { p.armed = false }

// armedNow marks the partition armed. Read it once more: a commit may have
// come between the last read and the arm. If polls found new rows since
// the last pass, by a pass: a producer that did not notify has committed
// by now, and its row may lie below the cursor.
func (p *partReader) armedNow() {
	p.armed, p.hot = true, true
	p.dirty = p.dirty || p.polledNew
}

// passGapLocked is how long after its last pass partition ps may start the
// next one: short while a pass costs little.
func (r *Relay) passGapLocked(ps *partState) time.Duration {
	if len(ps.queued)+r.flights.ofPartition(ps.id) < r.cfg.BatchSize {
		return smallPassGap
	}
	return minPassGap
}
