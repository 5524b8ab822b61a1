package relay

import (
	"slices"
	"time"
)

// keyQueues are the lines a key waits in for the dispatch loop: ready
// (its head may be publishable, in arrival order; a key is in it at most
// once, keyState.inReady), backing off (its head waits until its
// NextAttemptAt) and lease wait (its partition's lease was not valid when
// it was due). Its methods are the only writers of the three; the Relay
// calls them under its mutex.
type keyQueues struct {
	ready      []*keyState
	backingOff map[*keyState]bool
	leaseWait  map[*keyState]bool
}

func newKeyQueues() keyQueues {
	return keyQueues{backingOff: map[*keyState]bool{}, leaseWait: map[*keyState]bool{}}
}

// push puts k at the end of ready unless it is in it already, and
// reports whether it did.
func (q *keyQueues) push(k *keyState) bool {
	if k.inReady {
		return false
	}
	k.inReady = true
	q.ready = append(q.ready, k)
	return true
}

// pushFront puts k at the head of ready: it keeps its place (the window
// was full), or its next row goes right behind the one just published.
func (q *keyQueues) pushFront(k *keyState) {
	k.inReady = true
	q.ready = slices.Insert(q.ready, 0, k)
}

// pop takes the first key of ready; nil when ready is empty.
func (q *keyQueues) pop() *keyState {
	if len(q.ready) == 0 {
		return nil
	}
	k := q.ready[0]
	q.ready[0] = nil // the backing array would keep it alive
	q.ready = q.ready[1:]
	k.inReady = false
	return k
}

// waiting returns how many keys are in ready.
func (q *keyQueues) waiting() int { return len(q.ready) }

// backOff remembers that k's head backs off until a time.
func (q *keyQueues) backOff(k *keyState) { q.backingOff[k] = true }

// waitLease remembers that k was due while its partition's lease was not
// valid.
func (q *keyQueues) waitLease(k *keyState) { q.leaseWait[k] = true }

// holds reports whether k waits in any line.
func (q *keyQueues) holds(k *keyState) bool {
	return k.inReady || q.backingOff[k] || q.leaseWait[k]
}

// forget takes k out of the backing-off and lease-wait lines (its
// partition is dropped; ready is left to the dispatch loop, which skips
// keys of dropped partitions).
func (q *keyQueues) forget(k *keyState) {
	delete(q.backingOff, k)
	delete(q.leaseWait, k)
}

// takeLeaseWait empties the lease-wait line and returns its keys.
func (q *keyQueues) takeLeaseWait() []*keyState {
	ks := make([]*keyState, 0, len(q.leaseWait))
	for k := range q.leaseWait {
		ks = append(ks, k)
		delete(q.leaseWait, k)
	}
	return ks
}

// retryDue walks the backing-off line: it drops the keys that are no
// longer live (not live: their partition dropped, or nothing queued),
// takes out and returns those whose head may go again at now, and
// returns when the first of the rest may (zero if none).
func (q *keyQueues) retryDue(now time.Time, live func(*keyState) bool) (first time.Time, due []*keyState) {
	for k := range q.backingOff {
		if !live(k) || len(k.rows) == 0 {
			delete(q.backingOff, k)
			continue
		}
		at := k.rows[0].row.NextAttemptAt
		if !now.Before(at) {
			delete(q.backingOff, k)
			due = append(due, k)
			continue
		}
		if first.IsZero() || at.Before(first) {
			first = at
		}
	}
	return first, due
}
