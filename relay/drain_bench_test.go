package relay

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
)

// BenchmarkDrain runs a whole relay (Run: its read, dispatch and mark
// loops) over an in-memory backlog shaped like the capped node's drain
// (docs/performance.md, "CPU per message of a capped node": 40,000 rows
// over 4,000 keys, row i of key i mod 4,000, 64 partitions, 300-byte
// payloads), against a store and a publisher whose own work is small: the
// publisher confirms each round's messages in one wave from a goroutine
// of its own when the relay flushes, as the broker's acks come. One op is
// one drain. Besides the time it reports, per message, the allocations
// and bytes of the whole process (the relay's goroutines included), and
// per drain the garbage collections, reads, read-loop waits (wake-ups),
// dispatch rounds (flushes) and mark statements: counts that a shared
// machine's load does not change.
func BenchmarkDrain(b *testing.B) {
	const rows, keys = 40000, 4000
	var total drainCounts
	var mallocs, bytes uint64
	var gcs uint32
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		st := newDrainStore(rows, keys)
		pub := newWavePublisher()
		r, err := New(Config{Node: "bench", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, st, pub, fixedLeases{})
		if err != nil {
			b.Fatal(err)
		}
		for p := range drainPartitions {
			r.apply(Assigned{Lease: fixedLeases{}.lease(p)})
		}
		ctx, cancel := context.WithCancel(context.Background())
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		b.StartTimer()
		done := make(chan error, 1)
		go func() { done <- r.Run(ctx) }()
		select {
		case <-st.drained:
		case <-time.After(2 * time.Minute):
			b.Fatalf("not drained: %d rows pending", st.pending())
		}
		b.StopTimer()
		runtime.ReadMemStats(&after)
		cancel()
		if err := <-done; err != nil {
			b.Fatal(err)
		}
		pub.stop()
		mallocs += after.Mallocs - before.Mallocs
		bytes += after.TotalAlloc - before.TotalAlloc
		gcs += after.NumGC - before.NumGC
		s := r.Stats()
		total.add(drainCounts{reads: s.Reads, waits: r.ReadWaits(), rounds: pub.flushes(), marks: s.Marks})
		b.StartTimer()
	}
	n := float64(b.N)
	b.ReportMetric(float64(mallocs)/n/rows, "allocs/msg")
	b.ReportMetric(float64(bytes)/n/rows, "B/msg")
	b.ReportMetric(float64(gcs)/n, "gc/drain")
	b.ReportMetric(float64(total.reads)/n, "reads/drain")
	b.ReportMetric(float64(total.waits)/n, "readwaits/drain")
	b.ReportMetric(float64(total.rounds)/n, "rounds/drain")
	b.ReportMetric(float64(total.marks)/n, "marks/drain")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/n/rows, "ns/msg")
}

type drainCounts struct{ reads, waits, rounds, marks int64 }

func (c *drainCounts) add(d drainCounts) {
	c.reads += d.reads
	c.waits += d.waits
	c.rounds += d.rounds
	c.marks += d.marks
}

const drainPartitions = 64

// fixedLeases holds every partition at epoch 1 until far in the future,
// without a clock read per call (as lease.Leaser's Lease).
type fixedLeases struct{}

var farDeadline = time.Now().Add(24 * time.Hour)

func (fixedLeases) lease(p int) Lease { return Lease{Partition: p, Epoch: 1, Deadline: farDeadline} }
func (l fixedLeases) Lease(p int) (Lease, bool) {
	return l.lease(p), p >= 0 && p < drainPartitions
}
func (fixedLeases) Events() <-chan Event { return nil }

// drainStore is an in-memory backlog for BenchmarkDrain: reads return
// pending rows above a cursor with PrevPending as the database says it,
// marks mark them. Notifications never come; Arm arms everything.
type drainStore struct {
	mu      sync.Mutex
	parts   [drainPartitions][]*drainRow // by seq
	first   [drainPartitions]int         // no pending row below this index
	byID    map[uuid.UUID]*drainRow
	left    int
	drained chan struct{}
}

type drainRow struct {
	Row
	processed bool
	below     *drainRow // the key's row below, nil for its first
}

func newDrainStore(rows, keys int) *drainStore {
	s := &drainStore{byID: make(map[uuid.UUID]*drainRow, rows), left: rows, drained: make(chan struct{})}
	payload := make([]byte, 300)
	last := make([]*drainRow, keys)
	names := make([]string, keys)
	for k := range names {
		names[k] = fmt.Sprintf("key-%04d", k)
	}
	for i := range rows {
		k := i % keys
		p := k % drainPartitions
		r := &drainRow{Row: Row{ID: uuid.New(), Partition: p, Seq: int64(i + 1), CorrelationID: names[k],
			KeySeq: int64(i/keys + 1), PrevKeySeq: int64(i / keys), Exchange: "bench", RoutingKey: "bench.event",
			Type: "ordo.bench.event.v1", Payload: payload, Headers: []byte("{}"), OccurredAt: time.Now()}, below: last[k]}
		last[k] = r
		s.parts[p] = append(s.parts[p], r)
		s.byID[r.ID] = r
	}
	return s
}

func (s *drainStore) pending() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.left
}

func (s *drainStore) ReadPending(_ context.Context, cursors []Cursor, limit int) ([]Row, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Row
	for _, c := range cursors {
		rs := s.parts[c.Partition]
		for s.first[c.Partition] < len(rs) && rs[s.first[c.Partition]].processed {
			s.first[c.Partition]++
		}
		i, _ := slices.BinarySearchFunc(rs, c.After+1, func(r *drainRow, seq int64) int { return int(r.Seq - seq) })
		n := 0
		for i = max(i, s.first[c.Partition]); i < len(rs) && n < limit; i++ {
			if rs[i].processed {
				continue
			}
			row := rs[i].Row
			row.PrevPending = rs[i].below != nil && !rs[i].below.processed
			out = append(out, row)
			n++
		}
	}
	return out, nil
}

func (s *drainStore) PeekPending(context.Context, Cursor, int) ([]Row, error) { return nil, nil }

func (s *drainStore) MarkPublished(_ context.Context, rows []Settled) ([]uuid.UUID, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ids := make([]uuid.UUID, 0, len(rows))
	for _, st := range rows {
		if r := s.byID[st.ID]; r != nil && !r.processed {
			r.processed = true
			ids = append(ids, st.ID)
			if s.left--; s.left == 0 {
				close(s.drained)
			}
		}
	}
	return ids, nil
}

func (s *drainStore) RecordFailures(context.Context, []Settled, int) ([]uuid.UUID, error) {
	return nil, nil
}
func (s *drainStore) PrevKeySeq(context.Context, string, int64) (int64, error) { return 0, nil }
func (s *drainStore) DeleteProcessed(context.Context, int, int64, time.Duration, int) (int64, error) {
	return 0, nil
}
func (s *drainStore) Listen(ctx context.Context, _ func(int)) error {
	<-ctx.Done()
	return nil
}
func (s *drainStore) Arm(_ context.Context, ps []int) ([]int, error) { return ps, nil }
func (s *drainStore) Disarm(context.Context, []int) error            { return nil }

// wavePublisher holds the settles of a round's publishes and, on Flush,
// hands them to its confirmer goroutine, which confirms them in one wave.
type wavePublisher struct {
	mu     sync.Mutex
	held   []func(Result)
	rounds int64
	waves  chan []func(Result)
	free   chan []func(Result)
	done   chan struct{}
}

func newWavePublisher() *wavePublisher {
	p := &wavePublisher{waves: make(chan []func(Result), 1024), free: make(chan []func(Result), 1024), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		for w := range p.waves {
			for i, settle := range w {
				settle(Result{Outcome: Confirmed})
				w[i] = nil
			}
			p.free <- w[:0]
		}
	}()
	return p
}

func (p *wavePublisher) Publish(_ context.Context, _ *Message, settle func(Result)) error {
	p.mu.Lock()
	p.held = append(p.held, settle)
	p.mu.Unlock()
	return nil
}

func (p *wavePublisher) Connected() bool { return true }

func (p *wavePublisher) Flush() {
	p.mu.Lock()
	w := p.held
	if len(w) == 0 {
		p.mu.Unlock()
		return
	}
	select {
	case p.held = <-p.free:
	default:
		p.held = make([]func(Result), 0, 512)
	}
	p.rounds++
	p.mu.Unlock()
	p.waves <- w
}

func (p *wavePublisher) flushes() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.rounds
}

// stop ends the confirmer (after Run has returned: no more Flush).
func (p *wavePublisher) stop() {
	close(p.waves)
	<-p.done
}
