package relay

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// confirmAll is a Publisher that confirms every message at once.
type confirmAll struct{}

func (confirmAll) Publish(_ context.Context, _ *Message, settle func(Result)) error {
	settle(Result{Outcome: Confirmed})
	return nil
}
func (confirmAll) Connected() bool { return true }

// benchPublishPath takes 512 rows (64 partitions, 8 keys each, headers
// with a traceparent) through the relay's publish path without I/O: into
// the key queues, out as flights, through publish (header decoding, the
// span when tracing is on, the publisher) and settle.
func benchPublishPath(b *testing.B, cfg Config) {
	rows := make([]Row, 512)
	for i := range rows {
		rows[i] = Row{ID: uuid.New(), Seq: int64(i + 1), Partition: i / 8, CorrelationID: uuid.NewString(), KeySeq: 1,
			Exchange: "x", RoutingKey: "r", Type: "t", Payload: make([]byte, 300), OccurredAt: time.Now(),
			Headers: []byte(`{"traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}`)}
	}
	cfg.Node = "bench"
	r, err := New(cfg, nil, confirmAll{}, allLeases{})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		assignAndIngest(r, rows)
		n := 0
		for f, _ := r.nextFlight(); f != nil; f, _ = r.nextFlight() {
			if err := r.publish(ctx, f); err != nil {
				b.Fatal(err)
			}
			n++
		}
		if n != len(rows) {
			b.Fatalf("%d flights, want %d", n, len(rows))
		}
		forgetAll(r)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(rows)), "ns/msg")
}

// BenchmarkPublishPath is the publish path with tracing off, the default.
func BenchmarkPublishPath(b *testing.B) { benchPublishPath(b, Config{}) }

// BenchmarkPublishPathTraced is the same with tracing on: an SDK tracer
// provider that samples every span (sampled: every row's traceparent has
// the sampled flag), batching them to an exporter that drops them, and
// one that samples none.
func BenchmarkPublishPathTraced(b *testing.B) {
	for _, c := range []struct {
		name    string
		sampler sdktrace.Sampler
	}{
		{"sampled", sdktrace.AlwaysSample()},
		{"unsampled", sdktrace.NeverSample()},
	} {
		b.Run(c.name, func(b *testing.B) {
			tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(c.sampler), sdktrace.WithBatcher(tracetest.NewNoopExporter()))
			defer func() { _ = tp.Shutdown(context.Background()) }()
			benchPublishPath(b, Config{TracerProvider: tp})
		})
	}
}
