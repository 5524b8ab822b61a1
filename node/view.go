package node

import (
	"log/slog"
	"slices"
	"time"

	"github.com/ordo-relay/ordo/membership"
	"github.com/ordo-relay/ordo/partition"
	"github.com/ordo-relay/ordo/relay"
)

// view is what the node's HTTP endpoints and its metrics read: the running
// components, asked at request time. Every method is safe for concurrent
// use.
type view struct {
	cfg     Config
	srcs    []*source // the first is the one-source form's, and the top level of /status
	broker  broker
	members *membership.Membership // nil without gossip
	health  *healthMonitor
	logger  *slog.Logger
	budget  *relay.Budget // the sources' shared W and read-ahead; nil with one source
}

// source returns the source named name, or nil.
func (v *view) source(name string) *source {
	for _, s := range v.srcs {
		if s.name == name {
			return s
		}
	}
	return nil
}

// memberList returns every member this node knows of, gone ones included.
func (v *view) memberList() []membership.Member {
	if v.members == nil {
		return []membership.Member{{Name: v.cfg.NodeName, State: "alive", Health: v.health.Health(), Eligible: true}}
	}
	return v.members.Members()
}

// assignment is this node's view of who should own each partition of s
// (what the leaser of s wants: built.want).
func (v *view) assignment(s *source) partition.Assignment {
	if v.members == nil {
		a, _ := partition.Assign([]string{v.cfg.NodeName}, s.partitions)
		return a
	}
	return assignSources(v.members, v.cfg.sources())[s.name]
}

// assigned returns how many partitions, of every source, are assigned to
// this node, and how many it holds.
func (v *view) assigned() (assigned, held int) {
	for _, s := range v.srcs {
		assigned += len(v.assignment(s).Owned(v.cfg.NodeName))
		held += len(v.held(s))
	}
	return assigned, held
}

// held returns the partitions of s this node holds a valid lease on,
// sorted.
func (v *view) held(s *source) []int {
	now := time.Now()
	var ps []int
	for p, l := range s.leaser.Leases() {
		if l.Valid(now) {
			ps = append(ps, p)
		}
	}
	slices.Sort(ps)
	return ps
}

// conflicts returns the live peers that disagree with this node on a
// source's database (membership.Conflict); none without gossip.
func (v *view) conflicts() []membership.Conflict {
	if v.members == nil {
		return nil
	}
	return v.members.Conflicts()
}

// backlogMaxAge is how old a backlog snapshot may be before the views that
// show it call the database unreachable.
func (v *view) backlogMaxAge() time.Duration {
	return 3*v.cfg.BacklogInterval + 2*time.Second
}

// Degradation says why a node is degraded: it publishes, but not well.
type Degradation struct {
	Degraded bool     `json:"degraded"`
	Reasons  []string `json:"reasons,omitempty"`
	// OldestPendingSeconds is the oldest pending age among the partitions
	// this node holds, from the backlog snapshot.
	OldestPendingSeconds float64 `json:"oldestPendingSeconds"`
}

// degradation computes the degraded state: the oldest pending row of a
// partition this node holds, of any source, is older than DegradedAfter,
// the broker is blocked, or a peer disagrees with this node on a
// source's database (conflicts).
func (v *view) degradation() Degradation {
	var d Degradation
	for _, s := range v.srcs {
		held := map[int]bool{}
		for _, p := range v.held(s) {
			held[p] = true
		}
		for _, ps := range s.backlog.Snapshot().Partitions {
			if held[ps.Partition] {
				d.OldestPendingSeconds = max(d.OldestPendingSeconds, ps.OldestPendingSeconds)
			}
		}
	}
	if v.cfg.DegradedAfter > 0 && d.OldestPendingSeconds > v.cfg.DegradedAfter.Seconds() {
		d.Reasons = append(d.Reasons, "oldest pending message in a held partition is older than -degraded-after ("+v.cfg.DegradedAfter.String()+")")
	}
	if v.broker.State().Blocked != "" {
		d.Reasons = append(d.Reasons, "broker blocked the connection (memory or disk alarm)")
	}
	for _, c := range v.conflicts() {
		d.Reasons = append(d.Reasons, c.String()+"; that node is left out of the source's map here")
	}
	d.Degraded = len(d.Reasons) > 0
	return d
}
