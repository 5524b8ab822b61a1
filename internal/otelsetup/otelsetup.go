// Package otelsetup installs the OpenTelemetry SDK for Ordo's commands:
// Setup and Start build a tracer provider, with its exporters, from the
// standard OTEL_* environment variables.
//
// Only the commands (cmd/*) import it. The libraries take a
// trace.TracerProvider and import the API alone (internal/tracing), so a
// program that uses them links the SDK, the exporters and gRPC only if it
// installs them itself.
//
// Tracing is off unless OTEL_TRACES_EXPORTER names an exporter.
package otelsetup

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
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/ordo-relay/ordo/internal/tracing"
)

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
// ends. Setup also installs the provider and tracing.Propagator as the otel
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
	otel.SetTextMapPropagator(tracing.Propagator)
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
