package node

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/ordo-relay/ordo/admin"
	"github.com/ordo-relay/ordo/membership"
	"github.com/ordo-relay/ordo/relay"
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
	Node       string `json:"node"`
	Partitions int    `json:"partitionCount"`
	Held       []int  `json:"held"`
	Broker     bool   `json:"brokerConnected"`
	// BrokerURL is the broker of the current or last connection, its
	// password masked (one of -amqp-url's list).
	BrokerURL string `json:"brokerURL"`
	// BrokerState says why the broker cannot be published to, if so
	// (not connected, or blocked by a resource alarm).
	BrokerState BrokerState         `json:"broker"`
	Relay       relay.Stats         `json:"relay"`
	Members     []membership.Member `json:"members"`
	Assignment  []string            `json:"assignment"` // this node's view: owner by partition
	Leases      []PartitionStatus   `json:"partitions"` // what the database says, from the backlog snapshot
	// Sources has every source the node relays, the first one's
	// partitions also at the top level (Partitions, Held, Assignment,
	// Leases, Relay, History), as before sources existed.
	Sources []SourceStatus `json:"sources"`
	// BacklogAgeSeconds is how old the partitions' snapshot is.
	BacklogAgeSeconds float64     `json:"backlogAgeSeconds"`
	Degradation       Degradation `json:"degradation"`
	// IdentityConflicts lists the live peers that disagree with this
	// node on a source's database: another database under a source's
	// name, or a source's database under another name. Each is left out
	// of that source's map on this node (docs/operations.md).
	IdentityConflicts []membership.Conflict `json:"identityConflicts,omitempty"`
	// History is the cluster's throughput and lag over the last minutes,
	// one sample per backlog refresh, oldest first.
	History []Sample `json:"history,omitempty"`
}

func newHTTP(v *view, pm *publishFamilies) http.Handler {
	cfg, logger := v.cfg, v.logger
	mux := http.NewServeMux()
	mux.Handle("/admin/", v.adminHandler())
	mux.HandleFunc("POST /admin/gossip-key", admin.Guard(cfg.AdminToken, func(w http.ResponseWriter, r *http.Request, who admin.Actor) {
		gossipKey(w, r, who, v.members, logger)
	}))
	if cfg.PProf {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	mux.Handle("GET /metrics", newMetricsHandler(v, pm))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", v.readyz)
	mux.HandleFunc("GET /status", v.status)
	mountPage(mux)
	return mux
}

// Readiness is the /readyz document.
type Readiness struct {
	Ready    bool     `json:"ready"`
	Problems []string `json:"problems,omitempty"`
	Held     int      `json:"held"`
	Assigned int      `json:"assigned"`
	Degradation
}

// readyz answers 200 when the database and the broker are reachable and
// the node holds every partition assigned to it, else 503. A degraded node
// is still ready; the body says why it is degraded.
func (v *view) readyz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	rd := Readiness{Problems: []string{}}
	for _, s := range v.srcs {
		if !s.isMigrated() {
			rd.Problems = append(rd.Problems, v.sourcePrefix(s)+"database unreachable since start (schema not migrated yet)")
			continue
		}
		if err := s.pool.Ping(ctx); err != nil {
			// The error names hosts, users and databases: log it, do not
			// answer it.
			s.logger.Debug("readyz: database unreachable", "err", err)
			rd.Problems = append(rd.Problems, v.sourcePrefix(s)+"database unreachable")
		}
	}
	// Status, not Connected: a broker that blocks publishing (a resource
	// alarm) leaves the node ready but degraded, and the degradation says
	// so.
	if !v.broker.State().Connected {
		rd.Problems = append(rd.Problems, "broker not connected")
	}
	rd.Assigned, rd.Held = v.assigned()
	if rd.Held < rd.Assigned {
		rd.Problems = append(rd.Problems, "not every assigned partition's lease is held yet")
	}
	rd.Degradation = v.degradation()
	rd.Ready = len(rd.Problems) == 0
	code := http.StatusOK
	if !rd.Ready {
		code = http.StatusServiceUnavailable
	}
	writeJSON(w, code, rd)
}

// status answers the /status document from the backlog snapshots; 503
// when no source's database answers a ping (O(1); a snapshot may be a few
// seconds old) with a fresh snapshot. A source that is down is listed,
// with reachable false and its last snapshot.
func (v *view) status(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	now := time.Now()
	st := Status{Node: v.cfg.NodeName, Partitions: v.srcs[0].partitions, Broker: v.broker.Connected(), BrokerURL: v.broker.URL(),
		BrokerState: v.broker.State(), Members: v.memberList(), Degradation: v.degradation(), Sources: []SourceStatus{},
		IdentityConflicts: v.conflicts()}
	up := false
	for _, s := range v.srcs {
		ss := v.sourceStatus(ctx, s, now)
		up = up || ss.Reachable
		st.Sources = append(st.Sources, ss)
	}
	if !up {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": "database unavailable"})
		return
	}
	first := st.Sources[0]
	st.Held, st.Relay, st.Assignment, st.Leases = first.Held, first.Relay, first.Assignment, first.Leases
	st.BacklogAgeSeconds, st.History = first.BacklogAgeSeconds, v.srcs[0].backlog.History()
	writeJSON(w, http.StatusOK, st)
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
