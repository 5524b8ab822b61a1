package node

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/pprof"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ordo-relay/ordo/admin"
	"github.com/ordo-relay/ordo/membership"
	"github.com/ordo-relay/ordo/partition"
	"github.com/ordo-relay/ordo/relay"
)

// Status is the /status document.
type Status struct {
	Node       string                  `json:"node"`
	Partitions int                     `json:"partitionCount"`
	Held       []int                   `json:"held"`
	Broker     bool                    `json:"brokerConnected"`
	Relay      relay.Stats             `json:"relay"`
	Members    []membership.Member     `json:"members"`
	Assignment []string                `json:"assignment"` // this node's view: owner by partition
	Leases     []relay.PartitionStatus `json:"partitions"` // what the database says
}

func newHTTP(cfg Config, pool *pgxpool.Pool, pub *relay.AMQPPublisher, leaser *partition.Leaser,
	members *membership.Membership, rl *relay.Relay, logger *slog.Logger) http.Handler {
	store := relay.NewPGStore(pool, logger)
	alive := func() []string {
		if members == nil {
			return []string{cfg.NodeName}
		}
		return members.Alive()
	}
	mux := http.NewServeMux()
	mux.Handle("/admin/", admin.Handler(admin.NewStore(pool), cfg.AdminToken, logger))
	if cfg.PProf {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
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
		for _, l := range leaser.Leases() {
			if l.Valid(now) {
				held++
			}
		}
		a, _ := partition.Assign(alive(), cfg.Partitions)
		wanted := len(a.Owned(cfg.NodeName))
		if held < wanted {
			problems = append(problems, "not every assigned partition's lease is held yet")
		}
		if len(problems) > 0 {
			writeJSON(w, http.StatusServiceUnavailable, map[string]any{"ready": false, "problems": problems, "held": held, "assigned": wanted})
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"ready": true, "held": held, "assigned": wanted})
	})
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
		defer cancel()
		leases, err := store.Status(ctx)
		if err != nil {
			logger.Warn("status", "err", err)
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": "database unavailable"})
			return
		}
		held := []int{}
		for p := range leaser.Leases() {
			held = append(held, p)
		}
		slices.Sort(held)
		var ms []membership.Member
		if members != nil {
			ms = members.Members()
		} else {
			ms = []membership.Member{{Name: cfg.NodeName, State: "alive"}}
		}
		a, _ := partition.Assign(alive(), cfg.Partitions)
		writeJSON(w, http.StatusOK, Status{
			Node: cfg.NodeName, Partitions: cfg.Partitions, Held: held,
			Broker: pub.Connected(), Relay: rl.Stats(), Members: ms, Assignment: a, Leases: leases,
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
