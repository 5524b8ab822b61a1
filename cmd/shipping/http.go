package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/ordo-relay/ordo/inbox"
)

// serveHTTP serves /metrics, /healthz, /readyz and the admin API on
// cfg.httpAddr until the returned function is called (which shuts the
// server down and waits for it); nothing when the address is empty.
func serveHTTP(cfg config, c *inbox.Consumer, pool *pgxpool.Pool, logger *slog.Logger) (stop func(), err error) {
	addr := cfg.httpAddr
	if addr == "" {
		return func() {}, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("-http-addr: %w", err)
	}
	admin := &adminAPI{pool: pool, name: cfg.inbox.Name, gapWait: cfg.inbox.GapWait, token: cfg.adminToken, logger: logger}
	srv := &http.Server{Handler: newHTTP(c, pool, admin, logger), ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logger.Error("shipping http server", "err", err)
		}
	}()
	logger.Info("shipping http", "addr", ln.Addr().String())
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-done
	}, nil
}

func newHTTP(c *inbox.Consumer, pool *pgxpool.Pool, admin *adminAPI, logger *slog.Logger) http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(c.Collector(), collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) { readyz(w, r, c, pool, logger) })
	admin.mount(mux)
	return mux
}

// readiness is the /readyz document.
type readiness struct {
	Ready    bool     `json:"ready"`
	Problems []string `json:"problems"`
	// Degraded: a key is stuck past GapWait, or a dead letter holds a
	// key. The instance is still ready; an operator must act
	// (shipping stuck / dead, resolve, retry, skip).
	Degraded    bool `json:"degraded"`
	StuckKeys   int  `json:"stuckKeys"`
	DeadKeys    int  `json:"deadKeys"`
	ShardsOwned int  `json:"shardsOwned"`
}

// readyz answers 200 when the topology is declared and the database
// answers, else 503; a degraded instance is still ready, and the body
// says so.
func readyz(w http.ResponseWriter, r *http.Request, c *inbox.Consumer, pool *pgxpool.Pool, logger *slog.Logger) {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	rd := readiness{Problems: []string{}}
	select {
	case <-c.Ready():
	default:
		rd.Problems = append(rd.Problems, "broker topology not declared yet")
	}
	if err := pool.Ping(ctx); err != nil {
		logger.Debug("readyz: database unreachable", "err", err) // the error names hosts and users
		rd.Problems = append(rd.Problems, "database unreachable")
	}
	s := c.Stats()
	rd.StuckKeys, rd.DeadKeys, rd.ShardsOwned = s.StuckKeys, s.DeadKeys, s.ShardsOwned
	rd.Degraded = s.StuckKeys > 0 || s.DeadKeys > 0
	rd.Ready = len(rd.Problems) == 0
	code := http.StatusOK
	if !rd.Ready {
		code = http.StatusServiceUnavailable
	}
	writeJSON(w, code, rd)
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}
