package orderapi

import (
	"net/http"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/propagation"

	"github.com/ordo-relay/ordo/internal/tracing"
)

// traced wraps h with the request's trace context. With a TracerProvider
// every request gets a server span (otelhttp), named after its route, and
// the events it enqueues carry that span's context; without one, a valid
// W3C traceparent (and tracestate) the client sent is taken as it is, and
// the events carry that.
func (s *Server) traced(h http.Handler) http.Handler {
	tp := s.cfg.TracerProvider
	if tp == nil {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("traceparent") != "" {
				r = r.WithContext(tracing.Propagator.Extract(r.Context(), propagation.HeaderCarrier(r.Header)))
			}
			h.ServeHTTP(w, r)
		})
	}
	return otelhttp.NewHandler(h, "orderapi",
		otelhttp.WithTracerProvider(tp),
		otelhttp.WithPropagators(tracing.Propagator),
		otelhttp.WithSpanNameFormatter(func(_ string, r *http.Request) string {
			if _, pattern := s.mux.Handler(r); pattern != "" {
				return pattern
			}
			return r.Method
		}))
}
