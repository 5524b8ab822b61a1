package node

import (
	"context"
	"encoding/json"
	"fmt"
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
	"github.com/ordo-relay/ordo/relay/rabbitmq"
)

// Limits of the node's HTTP server. Its requests are small JSON documents
// answered from memory or one database query.
const (
	httpReadHeaderTimeout = 5 * time.Second
	httpReadTimeout       = 10 * time.Second
	httpWriteTimeout      = 30 * time.Second
	// httpPProfWriteTimeout replaces httpWriteTimeout with -pprof, so that
	// a default 30-second CPU profile fits.
	httpPProfWriteTimeout = 90 * time.Second
	httpIdleTimeout       = 2 * time.Minute
	httpMaxHeaderBytes    = 16 << 10
)

// newHTTPServer returns the node's HTTP server for handler, with read,
// write and idle timeouts and a header size limit, logging its own errors
// (TLS, malformed requests) through logger.
func newHTTPServer(handler http.Handler, pprof bool, logger *slog.Logger) *http.Server {
	write := httpWriteTimeout
	if pprof {
		write = httpPProfWriteTimeout
	}
	return &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: httpReadHeaderTimeout,
		ReadTimeout:       httpReadTimeout,
		WriteTimeout:      write,
		IdleTimeout:       httpIdleTimeout,
		MaxHeaderBytes:    httpMaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
}

// Status is the /status document.
type Status struct {
	Node       string              `json:"node"`
	Partitions int                 `json:"partitionCount"`
	Held       []int               `json:"held"`
	Broker     bool                `json:"brokerConnected"`
	Relay      relay.Stats         `json:"relay"`
	Members    []membership.Member `json:"members"`
	Assignment []string            `json:"assignment"` // this node's view: owner by partition
	Leases     []PartitionStatus   `json:"partitions"` // what the database says
}

func newHTTP(cfg Config, pool *pgxpool.Pool, pub *rabbitmq.Publisher, leaser *partition.Leaser,
	members *membership.Membership, rl *relay.Relay, logger *slog.Logger) http.Handler {
	alive := func() []string {
		if members == nil {
			return []string{cfg.NodeName}
		}
		return members.Alive()
	}
	mux := http.NewServeMux()
	mux.Handle("/admin/", admin.Handler(admin.NewStore(pool), cfg.AdminToken, logger))
	mux.HandleFunc("POST /admin/gossip-key", admin.Guard(cfg.AdminToken, func(w http.ResponseWriter, r *http.Request, who admin.Actor) {
		gossipKey(w, r, who, members, logger)
	}))
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
			// The error names hosts, users and databases: log it, do not
			// answer it.
			logger.Debug("readyz: database unreachable", "err", err)
			problems = append(problems, "database unreachable")
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
		leases, err := partitionStatus(ctx, pool)
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

// gossipKey applies one gossip key rotation step on this node:
// {"action": "add"|"use"|"remove", "key": "<base64>"}.
func gossipKey(w http.ResponseWriter, r *http.Request, who admin.Actor, members *membership.Membership, logger *slog.Logger) {
	if members == nil {
		admin.WriteError(w, http.StatusConflict, "this node runs without gossip (-gossip-addr is empty)")
		return
	}
	var req struct{ Action, Key string }
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4096))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		admin.WriteError(w, http.StatusBadRequest, "body: want {\"action\": \"add|use|remove\", \"key\": \"<base64>\"}: "+err.Error())
		return
	}
	keys, err := membership.ParseKeys(req.Key)
	if err != nil || len(keys) != 1 {
		admin.WriteError(w, http.StatusBadRequest, fmt.Sprintf("key: want one base64 key of 16, 24 or 32 bytes (%v)", err))
		return
	}
	if err := members.RotateKey(membership.KeyAction(req.Action), keys[0]); err != nil {
		admin.WriteError(w, http.StatusBadRequest, err.Error())
		return
	}
	logger.Info("gossip key changed by operator", "operator", who.Operator, "from", who.RemoteAddr, "action", req.Action)
	writeJSON(w, http.StatusOK, map[string]any{"action": req.Action, "keys": members.KeyCount()})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
