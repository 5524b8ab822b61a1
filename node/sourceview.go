package node

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/ordo-relay/ordo/admin"
	"github.com/ordo-relay/ordo/relay"
	"github.com/ordo-relay/ordo/wire"
)

// SourceStatus is one source on /status: its partitions as this node sees
// them, and whether its database answers.
type SourceStatus struct {
	Name string `json:"name"`
	// Reachable: the database answered a ping just now and the backlog
	// snapshot is fresh. A source that is not reachable keeps its last
	// snapshot (BacklogAgeSeconds says how old).
	Reachable bool `json:"reachable"`
	// Migrated: the source's schema has been migrated, and its leases,
	// relay and backlog run. A source whose database did not answer at
	// start is false (and unreachable) until it answers.
	Migrated   bool              `json:"migrated"`
	Partitions int               `json:"partitionCount"`
	Held       []int             `json:"held"`
	Assignment []string          `json:"assignment"` // this node's view: owner by partition
	Leases     []PartitionStatus `json:"partitions"` // what the database says, from the backlog snapshot
	// BacklogAgeSeconds is how old the partitions' snapshot is; 0 when
	// there is none yet.
	BacklogAgeSeconds float64     `json:"backlogAgeSeconds"`
	Relay             relay.Stats `json:"relay"`
}

// errNotMigrated is /status's reason for a source not migrated yet,
// which it does not ping.
var errNotMigrated = errors.New("schema not migrated yet")

// sourceStatus returns s as /status shows it, pinging its database once
// it is migrated.
func (v *view) sourceStatus(ctx context.Context, s *source, now time.Time) SourceStatus {
	perr := errNotMigrated
	if s.isMigrated() {
		perr = s.pool.Ping(ctx) // not before: on a stalled link each /status would wait out its deadline
	}
	snap := s.backlog.Snapshot()
	ss := SourceStatus{Name: s.name, Partitions: s.partitions, Held: v.held(s), Assignment: v.assignment(s),
		Leases: snap.Partitions, Relay: s.relay.Stats(), Migrated: s.isMigrated()}
	// A source not migrated yet has no snapshot: its backlog waits too.
	ss.Reachable = perr == nil && snap.Fresh(now, v.backlogMaxAge())
	if !ss.Reachable {
		s.logger.Debug("status: database unavailable", "ping", perr, "backlog", snap.Err)
	}
	if !snap.Taken.IsZero() {
		ss.BacklogAgeSeconds = now.Sub(snap.Taken).Seconds()
	}
	if ss.Held == nil {
		ss.Held = []int{}
	}
	return ss
}

// sourcePrefix is what a problem of s starts with: nothing in the
// one-source form, "source NAME: " otherwise.
func (v *view) sourcePrefix(s *source) string {
	if len(v.srcs) == 1 && s.name == wire.DefaultSource {
		return ""
	}
	return "source " + s.name + ": "
}

// adminStore returns the admin actions' store for s: over its adopted
// table's rows, or its outbox.
func adminStore(s *source, tableExchange string) (*admin.Store, error) {
	if s.table != nil {
		return admin.NewTableStore(s.pool, s.table.layout, tableExchange)
	}
	return admin.NewStore(s.pool), nil
}

// adminHandler serves /admin/ for every source: the query parameter
// source names it (the CLI's -source); without one, wire.DefaultSource,
// so that scripts of the one-source form keep working. The token is
// checked first, for every path: a caller without it learns nothing of
// the sources. With it, a source the node does not relay is 404 and one
// not migrated yet 503. A source relaying an adopted table is served by
// admin.NewTableStore, over the rows taken in; its purge and gap actions
// answer 501.
func (v *view) adminHandler() http.Handler {
	handlers := map[string]http.Handler{}
	for _, s := range v.srcs {
		store, err := adminStore(s, v.cfg.TableExchange)
		h := admin.Handler(store, v.cfg.AdminToken, s.logger)
		handlers[s.name] = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if err != nil {
				admin.WriteError(w, http.StatusInternalServerError, "source "+s.name+": "+err.Error())
				return
			}
			if !s.isMigrated() {
				admin.WriteError(w, http.StatusServiceUnavailable,
					"source "+s.name+" is not migrated yet: its database has not answered since the node started")
				return
			}
			h.ServeHTTP(w, r)
		})
	}
	return admin.Guard(v.cfg.AdminToken, func(w http.ResponseWriter, r *http.Request, _ admin.Actor) {
		name := r.URL.Query().Get("source")
		if name == "" {
			name = wire.DefaultSource
		}
		h, ok := handlers[name]
		if !ok {
			admin.WriteError(w, http.StatusNotFound, "no source "+name+" on this node")
			return
		}
		h.ServeHTTP(w, r)
	})
}
