// Package tracing holds what Ordo's OpenTelemetry tracing shares: the W3C
// Trace Context propagator every component uses (the traceparent and
// tracestate headers are part of the outbox and AMQP contracts) and a
// carrier over header maps.
//
// It imports the OpenTelemetry API only, so the libraries that use it
// (outbox, inbox, relay) link no SDK, exporter or gRPC: every component
// takes a trace.TracerProvider, and nil means off (no spans and no cost
// beyond a nil check). The commands build the provider with
// internal/otelsetup.
package tracing

import (
	"context"

	"go.opentelemetry.io/otel/propagation"
)

// Propagator is the W3C Trace Context propagator: it reads and writes the
// traceparent and tracestate headers. It is fixed, not taken from
// OTEL_PROPAGATORS: those headers are the wire contract, and they travel
// even while tracing is off.
var Propagator propagation.TextMapPropagator = propagation.TraceContext{}

// Headers is a propagation.TextMapCarrier over message headers (outbox
// headers, an amqp.Table converted): Get reads string values only.
type Headers map[string]any

// Get returns the string value of key, or "".
func (h Headers) Get(key string) string {
	s, _ := h[key].(string)
	return s
}

// Set sets key to value.
func (h Headers) Set(key, value string) { h[key] = value }

// Keys returns the keys of h.
func (h Headers) Keys() []string {
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	return keys
}

// Extract returns ctx carrying the remote span context of headers h (their
// traceparent and tracestate), or ctx itself when they hold none.
func Extract(ctx context.Context, h map[string]any) context.Context {
	if _, ok := h["traceparent"]; !ok {
		return ctx
	}
	return Propagator.Extract(ctx, Headers(h))
}

// Inject writes the span context of ctx into h as traceparent (and
// tracestate). It writes nothing when ctx holds no valid span context.
func Inject(ctx context.Context, h map[string]any) { Propagator.Inject(ctx, Headers(h)) }
