package outbox

import (
	"context"

	"go.opentelemetry.io/otel/trace"

	"github.com/ordo-relay/ordo/internal/tracing"
)

// traceHeaders returns the traceparent (and tracestate) headers of the
// span context in ctx, or nil when it holds none.
func traceHeaders(ctx context.Context) map[string]any {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return nil
	}
	h := map[string]any{}
	tracing.Inject(ctx, h)
	if len(h) == 0 {
		return nil
	}
	return h
}

// withTrace returns a copy of m whose headers carry tc as well; a
// header m sets itself wins (the caller knows best which context its
// message continues).
func withTrace(m *Message, tc map[string]any) *Message {
	if _, own := m.Headers["traceparent"]; own {
		return m
	}
	c := *m
	c.Headers = make(map[string]any, len(m.Headers)+len(tc))
	for k, v := range tc {
		c.Headers[k] = v
	}
	for k, v := range m.Headers {
		c.Headers[k] = v
	}
	return &c
}
