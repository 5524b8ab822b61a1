package otelsetup

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

// TestSetup: tracing is off unless OTEL_TRACES_EXPORTER names an
// exporter; console writes the spans, with OTEL_SERVICE_NAME's default
// service name; an unknown exporter or OTLP protocol is refused by name.
func TestSetup(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		name string
		env  map[string]string
		on   bool
		err  string
	}{
		{"unset", nil, false, ""},
		{"none", map[string]string{EnvExporter: "none"}, false, ""},
		{"disabled", map[string]string{EnvExporter: "console", EnvSDKDisabled: "true"}, false, ""},
		{"otlp http", map[string]string{EnvExporter: "otlp"}, true, ""},
		{"otlp grpc", map[string]string{EnvExporter: "otlp", EnvProtocol: "grpc"}, true, ""},
		{"otlp and console", map[string]string{EnvExporter: "otlp, console"}, true, ""},
		{"unknown exporter", map[string]string{EnvExporter: "zipkin"}, false, `unknown exporter "zipkin"`},
		{"unknown protocol", map[string]string{EnvExporter: "otlp", EnvTraceProtocol: "http/json"}, false, "unsupported OTLP protocol"},
	} {
		t.Run(c.name, func(t *testing.T) {
			tp, shutdown, err := Setup(ctx, "svc", &bytes.Buffer{}, env(c.env))
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("err %v, want one saying %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = shutdown(ctx) }()
			if (tp != nil) != c.on {
				t.Fatalf("provider %v, want on = %v", tp, c.on)
			}
		})
	}
	var out bytes.Buffer
	tp, shutdown, err := Setup(ctx, "ordo-test", &out, env(map[string]string{EnvExporter: "console"}))
	if err != nil {
		t.Fatal(err)
	}
	_, span := tp.Tracer("t").Start(ctx, "hello")
	span.End()
	if err := shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if s := out.String(); !strings.Contains(s, `"Name":"hello"`) || !strings.Contains(s, "ordo-test") {
		t.Fatalf("console output lacks the span or the service name:\n%s", s)
	}
}
