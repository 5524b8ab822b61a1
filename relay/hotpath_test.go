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

// BenchmarkBatchBuilding registers a batch of 512 rows as flights (the
// per-key limit check included) and settles them, as one read-publish-mark
// round does, without I/O.
func BenchmarkBatchBuilding(b *testing.B) {
	rows := make([]Row, 512)
	for i := range rows {
		rows[i] = Row{ID: uuid.New(), Partition: i % 64, CorrelationID: uuid.NewString(), KeySeq: 1,
			Exchange: "x", RoutingKey: "r", Type: "t", Payload: make([]byte, 300), Headers: []byte("{}")}
	}
	r, err := New(Config{Node: "bench"}, nil, nil, allLeases{})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		fs := make([]*flight, 0, len(rows))
		for i := range rows {
			f, err, skip := r.newFlight(&rows[i], 1)
			if err != nil || f == nil || skip != "" {
				b.Fatal("flight not registered")
			}
			fs = append(fs, f)
		}
		r.mu.Lock()
		for _, f := range fs {
			r.unconfirmed--
			r.forgetLocked(f)
		}
		r.mu.Unlock()
	}
}

// allLeases holds every partition at epoch 1, forever.
type allLeases struct{}

func (allLeases) Leases() map[int]Lease { return nil }
func (allLeases) Lease(p int) (Lease, bool) {
	return Lease{Partition: p, Epoch: 1, Deadline: time.Now().Add(time.Hour)}, true
}
func (allLeases) Changed() <-chan struct{} { return nil }
