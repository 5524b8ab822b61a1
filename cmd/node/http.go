package main

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ordo-relay/ordo/partition"
	"github.com/ordo-relay/ordo/relay"
)

// statusDoc is the /status document.
type statusDoc struct {
	Node       string                  `json:"node"`
	Partitions int                     `json:"partitionCount"`
	Held       int                     `json:"held"`
	Broker     bool                    `json:"brokerConnected"`
	Relay      relay.Stats             `json:"relay"`
	Map        []relay.PartitionStatus `json:"partitions"`
}

func newHTTP(cfg config, pool *pgxpool.Pool, pub *relay.AMQPPublisher, own partition.Ownership, rl *relay.Relay, logger *slog.Logger) http.Handler {
	store := relay.NewPGStore(pool, logger)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		problems := []string{}
		if err := pool.Ping(ctx); err != nil {
			problems = append(problems, "database unreachable: "+err.Error())
		}
		if !pub.Connected() {
			problems = append(problems, "broker not connected")
		}
		held := 0
		now := time.Now()
		for _, l := range own.Leases() {
			if l.Valid(now) {
				held++
			}
		}
		if held == 0 {
			problems = append(problems, "no partition lease held")
		}
		if len(problems) > 0 {
			writeJSON(w, http.StatusServiceUnavailable, map[string]any{"ready": false, "problems": problems, "held": held})
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"ready": true, "held": held})
	})
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
		defer cancel()
		parts, err := store.Status(ctx)
		if err != nil {
			logger.Warn("status", "err", err)
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": "database unavailable"})
			return
		}
		writeJSON(w, http.StatusOK, statusDoc{
			Node: cfg.NodeName, Partitions: cfg.Partitions, Held: len(own.Leases()),
			Broker: pub.Connected(), Relay: rl.Stats(), Map: parts,
		})
	})
	return mux
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
