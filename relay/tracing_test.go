package relay_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/ordo-relay/ordo/relay"
)

// TestParkedSpanRecordsError: every failed publish of a row the broker
// keeps returning has a PRODUCER span with the error recorded; the last
// one, which parks the row, says so (ordo.parked, a "parked" event); the
// spans are siblings under the context the row stored.
func TestParkedSpanRecordsError(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	h.startNode(nodeOpts{tracer: tp})

	parent := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{7, 7}, SpanID: trace.SpanID{9}, TraceFlags: trace.FlagsSampled})
	m := h.msg("poison", "unroutable.x", "t.v1")
	m.Headers = map[string]any{"traceparent": "00-" + parent.TraceID().String() + "-" + parent.SpanID().String() + "-01"}
	id := h.enqueue(m)[0]
	h.waitRows(30*time.Second, "the returned row is parked", func(n int) bool { return n == 1 },
		"id = $1 AND parked_at IS NOT NULL", id)
	var got tracetest.SpanStubs
	deadline := time.Now().Add(30 * time.Second)
	for {
		got = spans.GetSpans()
		if len(got) >= relay.DefaultConfig().MaxAttempts || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if len(got) != relay.DefaultConfig().MaxAttempts {
		t.Fatalf("%d spans, want one per attempt (%d)", len(got), relay.DefaultConfig().MaxAttempts)
	}
	parkedSpans := 0
	for i, s := range got {
		if s.Name != "publish "+h.exchange || s.SpanKind != trace.SpanKindProducer {
			t.Errorf("span %d: %s %q", i, s.SpanKind, s.Name)
		}
		if s.SpanContext.TraceID() != parent.TraceID() || s.Parent.SpanID() != parent.SpanID() {
			t.Errorf("span %d: trace %s parent %s, want the stored %s/%s", i, s.SpanContext.TraceID(), s.Parent.SpanID(), parent.TraceID(), parent.SpanID())
		}
		if s.Status.Code != codes.Error || !strings.Contains(s.Status.Description, "NO_ROUTE") {
			t.Errorf("span %d: status %v, want the broker's return as the error", i, s.Status)
		}
		recorded := false
		parkedEvent := false
		for _, e := range s.Events {
			recorded = recorded || e.Name == "exception"
			parkedEvent = parkedEvent || e.Name == "parked"
		}
		if !recorded {
			t.Errorf("span %d records no error: %v", i, s.Events)
		}
		parked := false
		for _, a := range s.Attributes {
			if a.Key == relay.AttrParked {
				parked = a.Value.AsBool()
			}
		}
		if parked != parkedEvent {
			t.Errorf("span %d: ordo.parked %v, parked event %v", i, parked, parkedEvent)
		}
		if parked {
			parkedSpans++
		}
	}
	if parkedSpans != 1 {
		t.Errorf("%d spans say parked, want the last one only", parkedSpans)
	}
}
