package relaytest

import (
	"context"
	"encoding/json"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/ordo-relay/ordo/internal/backoff"
	"github.com/ordo-relay/ordo/relay"
)

// Store is an in-memory outbox whose NodeStores (ForNode) keep the PostgreSQL store's
// contract: key heads in seq order, the per-key rule within a key by
// key_seq, backoff and parking, dead rows stepped over for
// x-ordo-prev-key-seq, and every write checked against the lease table (the
// fence) at the epoch the row was published under. Safe for concurrent use.
type Store struct {
	leases *LeaseTable

	mu        sync.Mutex
	rows      []*StoredRow // in seq order
	byID      map[uuid.UUID]*StoredRow
	keySeq    map[string]int64
	seq       int64
	wake      []func(int)
	armed     map[int]bool  // partitions whose inserts wake listeners
	refuse    map[int]bool  // partitions Arm refuses, as an open producer's transaction would
	woken     int           // notifications sent
	onArm     func()        // runs at the start of every Arm (SetBeforeArm)
	arms      int           // Arm calls, failed ones included
	disarms   int           // Disarm calls
	every     bool          // every commit notifies, armed or not (NotifyEveryCommit)
	listening int           // Listen calls connected (past HoldListen) and not ended
	held      chan struct{} // HoldListen: Listen waits for it to close before it connects
	reads     int
	delay     time.Duration
	slow      map[uuid.UUID]time.Duration // SetSlowRow

	prevErr   error
	prevCalls int
}

// FailPrevKeySeq makes PrevKeySeq fail with err (nil: work again).
func (s *Store) FailPrevKeySeq(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.prevErr = err
}

// PrevKeySeqCalls counts PrevKeySeq calls.
func (s *Store) PrevKeySeqCalls() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.prevCalls
}

// StoredRow is one outbox row as the in-memory store keeps it.
type StoredRow struct {
	relay.Row
	Seq           int64
	Processed     bool
	ProcessedAt   time.Time
	Dead          bool
	Parked        bool
	NextAttemptAt time.Time
	LastError     string
}

// NodeStore is the relay.Store of one node over a Store: its writes are
// fenced by that node's leases. Several nodes' relays share one Store,
// as they share one database. Its other methods are the Store's.
type NodeStore struct {
	*Store
	node string
}

var _ relay.Store = (*NodeStore)(nil)

// ForNode returns the relay.Store of node over s.
func (s *Store) ForNode(node string) *NodeStore { return &NodeStore{Store: s, node: node} }

// MarkPublished implements relay.Outbox.
func (n *NodeStore) MarkPublished(ctx context.Context, rows []relay.Settled) ([]uuid.UUID, error) {
	return n.markPublished(ctx, n.node, rows)
}

// RecordFailures implements relay.Outbox.
func (n *NodeStore) RecordFailures(ctx context.Context, rows []relay.Settled, maxAttempts int) ([]uuid.UUID, error) {
	return n.recordFailures(ctx, n.node, rows, maxAttempts)
}

// DeleteProcessed implements relay.Retention.
func (n *NodeStore) DeleteProcessed(ctx context.Context, partition int, epoch int64, olderThan time.Duration, limit int) (int64, error) {
	return n.deleteProcessed(n.node, partition, epoch, olderThan, limit)
}

// NewStore returns an empty store whose writes are fenced by leases.
func NewStore(leases *LeaseTable) *Store {
	return &Store{leases: leases, byID: map[uuid.UUID]*StoredRow{}, keySeq: map[string]int64{},
		armed: map[int]bool{}, refuse: map[int]bool{}, slow: map[uuid.UUID]time.Duration{}}
}

// Insert adds one pending row per key given, in order, as a producer's
// committed transaction would: each gets the next seq and its key's next
// key_seq. It returns the ids and wakes listeners, if the partition is
// armed.
func (s *Store) Insert(partition int, keys ...string) []uuid.UUID {
	s.mu.Lock()
	ids := make([]uuid.UUID, len(keys))
	for i, k := range keys {
		s.seq++
		s.keySeq[k]++
		id := uuid.Must(uuid.NewV7())
		r := &StoredRow{Seq: s.seq, Row: relay.Row{
			ID: id, Partition: partition, CorrelationID: k, KeySeq: s.keySeq[k], PrevKeySeq: s.keySeq[k] - 1,
			Exchange: "ex", RoutingKey: "rk", Type: "t", Payload: json.RawMessage(`{}`), Headers: []byte(`{}`),
			OccurredAt: time.Now(),
		}}
		s.rows = append(s.rows, r)
		s.byID[id] = r
		ids[i] = id
	}
	s.mu.Unlock()
	s.notify(partition)
	return ids
}

// Reserve adds a row of key to partition as a producer's transaction that
// has not committed yet: it takes the next seq now, and the row is pending
// (and its partition notified, if armed) only once commit is called, after
// rows inserted meanwhile with higher seqs may have been read.
func (s *Store) Reserve(partition int, key string) (id uuid.UUID, commit func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seq++
	seq := s.seq
	id = uuid.Must(uuid.NewV7())
	return id, func() {
		s.mu.Lock()
		s.keySeq[key]++
		r := &StoredRow{Seq: seq, Row: relay.Row{
			ID: id, Partition: partition, CorrelationID: key, KeySeq: s.keySeq[key], PrevKeySeq: s.keySeq[key] - 1,
			Exchange: "ex", RoutingKey: "rk", Type: "t", Payload: json.RawMessage(`{}`), Headers: []byte(`{}`),
			OccurredAt: time.Now(),
		}}
		at, _ := slices.BinarySearchFunc(s.rows, seq, func(x *StoredRow, q int64) int { return int(min(max(x.Seq-q, -1), 1)) })
		s.rows = slices.Insert(s.rows, at, r)
		s.byID[id] = r
		s.mu.Unlock()
		s.notify(partition)
	}
}

// Update changes a stored row under the store's lock (for tests that set
// headers, park or kill rows as an operator would).
func (s *Store) Update(id uuid.UUID, f func(*StoredRow)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r := s.byID[id]; r != nil {
		f(r)
	}
}

// Get returns a copy of the row with id.
func (s *Store) Get(id uuid.UUID) (StoredRow, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.byID[id]
	if r == nil {
		return StoredRow{}, false
	}
	return *r, true
}

// Pending counts rows not yet processed.
func (s *Store) Pending() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, r := range s.rows {
		if !r.Processed {
			n++
		}
	}
	return n
}

// Reads counts ReadHeads calls.
func (s *Store) Reads() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reads
}

// SetReadDelay makes every ReadHeads take d (honouring its context), as a
// slow plan would.
func (s *Store) SetReadDelay(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.delay = d
}

// SetSlowRow makes every ReadPending that returns row id with its payload
// take d more (honouring its context), as a huge payload does; PeekPending
// is not slowed (0: no longer slow).
func (s *Store) SetSlowRow(id uuid.UUID, d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.slow[id] = d
}

// ReadPending implements relay.Outbox.
func (s *Store) ReadPending(ctx context.Context, cursors []relay.Cursor, limit int) ([]relay.Row, error) {
	return s.readPending(ctx, cursors, limit, false)
}

// PeekPending implements relay.Outbox.
func (s *Store) PeekPending(ctx context.Context, c relay.Cursor, limit int) ([]relay.Row, error) {
	return s.readPending(ctx, []relay.Cursor{c}, limit, true)
}

// readPending reads after the read delay, then waits for the slow rows
// among those it returns with their payload (not when bare).
func (s *Store) readPending(ctx context.Context, cursors []relay.Cursor, limit int, bare bool) ([]relay.Row, error) {
	s.mu.Lock()
	delay := s.delay
	s.mu.Unlock()
	if err := sleepCtx(ctx, delay); err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.reads++
	var out []relay.Row
	var slow time.Duration
	parked := s.parkedLocked()
	for _, c := range cursors {
		n := 0
		for _, r := range s.rows {
			if n == limit {
				break
			}
			if r.Processed || r.Parked || r.Partition != c.Partition || r.Seq <= c.After {
				continue
			}
			row := s.readLocked(r, bare, parked)
			if row.Payload != nil {
				slow = max(slow, s.slow[row.ID])
			}
			out = append(out, row)
			n++
		}
	}
	s.mu.Unlock()
	if err := sleepCtx(ctx, slow); err != nil {
		return nil, err
	}
	return out, nil
}

// readLocked is stored row r as a read returns it (bare: without payload
// and headers; parked: parkedLocked's).
func (s *Store) readLocked(r *StoredRow, bare bool, parked map[string]int64) relay.Row {
	row := r.Row
	row.Seq, row.Attempts, row.Parked, row.NextAttemptAt = r.Seq, r.Attempts, r.Parked, r.NextAttemptAt
	row.PrevKeySeq = row.KeySeq - 1
	// Behind a parked row of its key. (PostgreSQL's read returns such a
	// row about once, then holds it out of its reads; returning it every
	// time is within the contract.)
	if ks, ok := parked[row.CorrelationID]; ok && ks < row.KeySeq {
		row.BehindParked = true
	}
	if row.BehindParked || bare {
		row.Payload, row.Headers = nil, nil // as PostgreSQL's read: not until an operator acts
	}
	if prev := s.findLocked(row.CorrelationID, row.KeySeq-1); prev != nil {
		row.PrevPending, row.PrevDead = !prev.Processed, prev.Dead
	}
	return row
}

// sleepCtx waits d, or until ctx ends (its error).
func sleepCtx(ctx context.Context, d time.Duration) error {
	if d > 0 && !backoff.Sleep(ctx, d) {
		return ctx.Err()
	}
	return nil
}

// parkedLocked maps each key with a pending parked row to the lowest
// such row's key_seq.
func (s *Store) parkedLocked() map[string]int64 {
	parked := map[string]int64{}
	for _, o := range s.rows {
		if o.Parked && !o.Processed {
			if ks, ok := parked[o.CorrelationID]; !ok || o.KeySeq < ks {
				parked[o.CorrelationID] = o.KeySeq
			}
		}
	}
	return parked
}

func (s *Store) findLocked(key string, keySeq int64) *StoredRow {
	for _, o := range s.rows {
		if o.CorrelationID == key && o.KeySeq == keySeq {
			return o
		}
	}
	return nil
}

func (s *Store) markPublished(ctx context.Context, node string, rows []relay.Settled) ([]uuid.UUID, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var marked []uuid.UUID
	for _, x := range rows {
		r := s.byID[x.ID]
		if r == nil || r.Processed || r.Partition != x.Partition || !s.leases.Holds(node, x.Partition, x.Epoch) {
			continue
		}
		r.Processed, r.ProcessedAt = true, time.Now()
		marked = append(marked, x.ID)
	}
	return marked, nil
}

func (s *Store) recordFailures(ctx context.Context, node string, rows []relay.Settled, maxAttempts int) ([]uuid.UUID, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var parked []uuid.UUID
	for _, x := range rows {
		r := s.byID[x.ID]
		if r == nil || r.Processed || r.Partition != x.Partition || !s.leases.Holds(node, x.Partition, x.Epoch) {
			continue
		}
		r.Attempts++
		r.LastError = x.Err
		r.NextAttemptAt = time.Now().Add(x.Delay)
		if r.Attempts >= maxAttempts {
			r.Parked = true
			parked = append(parked, x.ID)
		}
	}
	return parked, nil
}

// PrevKeySeq implements relay.Outbox.
func (s *Store) PrevKeySeq(ctx context.Context, key string, keySeq int64) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.prevCalls++
	if s.prevErr != nil {
		return 0, s.prevErr
	}
	k := keySeq - 1
	for k > 0 {
		r := s.findLocked(key, k)
		if r == nil || !r.Dead {
			break
		}
		k--
	}
	return k, nil
}

func (s *Store) deleteProcessed(node string, partition int, epoch int64, olderThan time.Duration, limit int) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.leases.Holds(node, partition, epoch) {
		return 0, nil
	}
	cutoff := time.Now().Add(-olderThan)
	doomed := map[uuid.UUID]bool{}
	for _, r := range s.rows {
		if len(doomed) == limit {
			break
		}
		if r.Partition == partition && r.Processed && !r.Dead && r.ProcessedAt.Before(cutoff) {
			doomed[r.ID] = true
		}
	}
	s.rows = slices.DeleteFunc(s.rows, func(r *StoredRow) bool { return doomed[r.ID] })
	for id := range doomed {
		delete(s.byID, id)
	}
	return int64(len(doomed)), nil
}
