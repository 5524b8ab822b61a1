// Package tracing holds what Ordo's OpenTelemetry tracing shares: the W3C
// Trace Context propagator every component uses (the traceparent and
// tracestate headers are part of the outbox and AMQP contracts), a carrier
// over header maps, and Setup, which builds a tracer provider from the
// standard OTEL_* environment variables for the commands.
//
// Tracing is off unless OTEL_TRACES_EXPORTER names an exporter; every
// component takes a trace.TracerProvider, and nil means off: no spans and
// no cost beyond a nil check.
package tracing

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
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

// Environment variables Setup reads itself; the SDK and the exporters read
// the rest (OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES,
// OTEL_TRACES_SAMPLER, OTEL_TRACES_SAMPLER_ARG, OTEL_BSP_*,
// OTEL_EXPORTER_OTLP_* endpoints, headers and timeouts).
const (
	EnvExporter      = "OTEL_TRACES_EXPORTER"
	EnvProtocol      = "OTEL_EXPORTER_OTLP_PROTOCOL"
	EnvTraceProtocol = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
	EnvSDKDisabled   = "OTEL_SDK_DISABLED"
)

// Setup builds a tracer provider from the environment:
// OTEL_TRACES_EXPORTER is a comma-separated list of otlp, console and
// none; unset or none (the default: tracing is off) returns a nil
// provider. otlp speaks http/protobuf unless
// OTEL_EXPORTER_OTLP_TRACES_PROTOCOL (or OTEL_EXPORTER_OTLP_PROTOCOL) says
// grpc; console writes spans as JSON to console. The resource's
// service.name is service unless OTEL_SERVICE_NAME or
// OTEL_RESOURCE_ATTRIBUTES say otherwise. Sampling follows
// OTEL_TRACES_SAMPLER (default: parent-based, always on).
//
// shutdown flushes and stops the exporters; call it once when the command
// ends. Setup also installs the provider and Propagator as the otel
// globals, for libraries that look there.
func Setup(ctx context.Context, service string, console io.Writer, getenv func(string) string) (tp trace.TracerProvider, shutdown func(context.Context) error, err error) {
	nothing := func(context.Context) error { return nil }
	if strings.EqualFold(strings.TrimSpace(getenv(EnvSDKDisabled)), "true") {
		return nil, nothing, nil
	}
	var opts []sdktrace.TracerProviderOption
	for _, name := range strings.Split(getenv(EnvExporter), ",") {
		var exp sdktrace.SpanExporter
		switch name = strings.ToLower(strings.TrimSpace(name)); name {
		case "", "none":
			continue
		case "console":
			exp, err = stdouttrace.New(stdouttrace.WithWriter(console))
		case "otlp":
			exp, err = otlpExporter(ctx, getenv)
		default:
			err = fmt.Errorf("%s=%q: unknown exporter %q (want otlp, console or none)", EnvExporter, getenv(EnvExporter), name)
		}
		if err != nil {
			return nil, nothing, err
		}
		opts = append(opts, sdktrace.WithBatcher(exp))
	}
	if len(opts) == 0 {
		return nil, nothing, nil
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(attribute.String("service.name", service)),
		resource.WithFromEnv(), resource.WithTelemetrySDK())
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, nothing, fmt.Errorf("tracing resource: %w", err)
	}
	p := sdktrace.NewTracerProvider(append(opts, sdktrace.WithResource(res))...)
	otel.SetTracerProvider(p)
	otel.SetTextMapPropagator(Propagator)
	return p, p.Shutdown, nil
}

// otlpExporter returns the OTLP exporter of the configured protocol.
func otlpExporter(ctx context.Context, getenv func(string) string) (sdktrace.SpanExporter, error) {
	proto := getenv(EnvTraceProtocol)
	if proto == "" {
		proto = getenv(EnvProtocol)
	}
	switch proto {
	case "", "http/protobuf":
		return otlptracehttp.New(ctx)
	case "grpc":
		return otlptracegrpc.New(ctx)
	}
	return nil, fmt.Errorf("%s=%q: unsupported OTLP protocol (want http/protobuf or grpc)", EnvTraceProtocol, proto)
}

// Start is Setup for a command: it logs that tracing is on, and flush
// (never nil) sends what is buffered and stops the exporters, waiting at
// most 5 s; call it once on the way out.
func Start(ctx context.Context, service string, console io.Writer, getenv func(string) string, logger *slog.Logger) (tp trace.TracerProvider, flush func(), err error) {
	tp, shutdown, err := Setup(ctx, service, console, getenv)
	if err != nil {
		return nil, func() {}, err
	}
	if tp != nil {
		logger.Info("tracing on", "exporter", getenv(EnvExporter), "service", service)
	}
	return tp, func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := shutdown(sctx); err != nil {
			logger.Warn("tracing: flush at exit", "err", err)
		}
	}, nil
}
