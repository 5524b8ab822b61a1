package tracing

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/trace"
)

// TestInjectExtract: a span context goes into headers as traceparent and
// tracestate and comes back out; headers without a traceparent leave the
// context as it was.
func TestInjectExtract(t *testing.T) {
	ts, _ := trace.ParseTraceState("k=v")
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1}, SpanID: trace.SpanID{2}, TraceFlags: trace.FlagsSampled, TraceState: ts})
	h := map[string]any{"other": 1}
	Inject(trace.ContextWithSpanContext(context.Background(), sc), h)
	if h["traceparent"] != "00-01000000000000000000000000000000-0200000000000000-01" || h["tracestate"] != "k=v" {
		t.Fatalf("headers %v", h)
	}
	got := trace.SpanContextFromContext(Extract(context.Background(), h))
	if !got.Equal(sc.WithRemote(true)) {
		t.Fatalf("extracted %v, want %v", got, sc)
	}
	ctx := context.Background()
	if Extract(ctx, map[string]any{"x": "y"}) != ctx {
		t.Fatal("headers without a traceparent changed the context")
	}
	Inject(ctx, h)
	if len(h) != 3 {
		t.Fatalf("injecting an empty context changed the headers: %v", h)
	}
}
