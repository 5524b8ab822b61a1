package main

import (
	"log/slog"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// instrument serves /metrics beside next and counts next's requests:
// totals, server errors, and durations, without labels (a path holds an
// order id). The registry is its own: the Go runtime and process
// collectors, the request metrics, and the pool's connection gauges.
func instrument(next http.Handler, pool *pgxpool.Pool, logger *slog.Logger) http.Handler {
	requests := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ordo_orderapi_requests_total", Help: "HTTP requests answered (all but /metrics).",
	})
	errors := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ordo_orderapi_request_errors_total", Help: "HTTP requests answered with a 5xx status.",
	})
	duration := prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "ordo_orderapi_request_duration_seconds", Help: "Time to answer a request.",
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14), // 0.5 ms .. 4 s
	})
	inUse := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "ordo_orderapi_db_connections_in_use", Help: "PostgreSQL connections in use.",
	}, func() float64 { return float64(pool.Stat().AcquiredConns()) })
	open := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "ordo_orderapi_db_connections", Help: "PostgreSQL connections open.",
	}, func() float64 { return float64(pool.Stat().TotalConns()) })
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		requests, errors, duration, inUse, open)
	metrics := promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg, ErrorLog: slog.NewLogLogger(logger.Handler(), slog.LevelWarn)})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/metrics" && r.Method == http.MethodGet {
			metrics.ServeHTTP(w, r)
			return
		}
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w, code: http.StatusOK}
		next.ServeHTTP(sw, r)
		requests.Inc()
		if sw.code >= 500 {
			errors.Inc()
		}
		duration.Observe(time.Since(start).Seconds())
	})
}

// statusWriter remembers the status code a handler writes.
type statusWriter struct {
	http.ResponseWriter
	code int
}

func (w *statusWriter) WriteHeader(code int) {
	w.code = code
	w.ResponseWriter.WriteHeader(code)
}
