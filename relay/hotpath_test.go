package relay

import (
	"testing"
	"time"

	"github.com/google/uuid"
)

// The in-process hot paths of one publish: decoding the row's headers,
// and registering the flight (building the AMQP message: relay/rabbitmq).

func BenchmarkDecodeHeaders(b *testing.B) {
	raw := []byte(`{"traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01","tenant":"acme","n":3}`)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := decodeHeaders(raw); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkBatchBuilding takes a read of 512 rows into the key queues,
// registers each as a flight (the per-key rule and the lease check
// included) and settles it, as a read-publish-confirm round does, without
// I/O.
func BenchmarkBatchBuilding(b *testing.B) {
	rows := make([]Row, 512)
	for i := range rows {
		rows[i] = Row{ID: uuid.New(), Partition: i / 8, CorrelationID: uuid.NewString(), KeySeq: 1,
			Exchange: "x", RoutingKey: "r", Type: "t", Payload: make([]byte, 300), Headers: []byte("{}")}
	}
	for i := range rows {
		rows[i].Seq = int64(i + 1)
	}
	r, err := New(Config{Node: "bench"}, nil, nil, allLeases{})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		assignAndIngest(r, rows)
		n := 0
		for f, _ := r.nextFlight(); f != nil; f, _ = r.nextFlight() {
			r.settle(f, Result{Outcome: Confirmed})
			n++
		}
		if n != len(rows) {
			b.Fatalf("%d flights, want %d", n, len(rows))
		}
		forgetAll(r)
	}
}

// allLeases holds every partition at epoch 1, forever.
type allLeases struct{}

func (allLeases) Lease(p int) (Lease, bool) {
	return Lease{Partition: p, Epoch: 1, Deadline: time.Now().Add(time.Hour)}, true
}
func (allLeases) Events() <-chan Event { return nil }

// assignAndIngest gives r all 64 partitions at epoch 1 and queues rows,
// 8 a partition (rows[8p:8p+8] belong to partition p), as a read would.
func assignAndIngest(r *Relay, rows []Row) {
	for p := range 64 {
		r.apply(Assigned{Lease: Lease{Partition: p, Epoch: 1, Deadline: time.Now().Add(time.Hour)}})
	}
	r.mu.Lock()
	for _, ps := range r.parts {
		r.ingestLocked(ps, rows[ps.id*8:ps.id*8+8])
	}
	r.mu.Unlock()
}

// forgetAll empties r's partitions, flights and settlements, as if it had
// just started: a benchmark's rounds each start from the same state.
func forgetAll(r *Relay) {
	r.mu.Lock()
	defer r.mu.Unlock()
	clear(r.flights.byID)
	clear(r.flights.perPart)
	r.flights.n = flightCounts{}
	clear(r.parts)
	r.settled, r.mem = writeBack{}, newMemory(r.cfg.ReadAheadBytes, r.flights.share)
}
