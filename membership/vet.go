package membership

import (
	"slices"
	"strings"

	"github.com/ordo-relay/ordo/wire"
)

// A node checks each of its sources' database identity against those
// its peers gossip before it counts itself in that source's map, and
// gossips the identity only once checked:
//
//   - As it joins (Run), every source it lists is checked; a conflict
//     with a peer that gossips its identity (a node that has passed this
//     check) stops the node with a *ConflictError, before its leasers
//     want any partition, unless another peer agrees with this node on
//     the source (the conflict is then older than this node, between
//     running nodes; stopping every node that restarts beside a wrong
//     one would let that one take the cluster down). A node that joins
//     a cluster with another database under a source's name, or a
//     source's database under another name, thus refuses to start, and
//     the running nodes go on.
//   - A source listed later (its database answered after the join) is
//     left out of what the node gossips, and of its own map, until the
//     next loop of Run checks it: a conflict then stops the node too.
//   - Nodes that start together see no identity of each other's at the
//     check, pass it, and find their conflict afterwards: each then
//     leaves the other out of that source's map (apply), says so in its
//     log and in Conflicts, and keeps relaying.
//
// A source whose identity is unknown (its role may not read the server's
// control data), and a peer that gossips none (a node older than
// identities), conflict with nothing.

// vet checks the sources this node lists and has not checked yet against
// the identities its live peers gossip. It returns whether any source
// passed, and a *ConflictError when one conflicts. Only Run calls it.
func (m *Membership) vet() (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	live := make(map[string]Health, len(m.view))
	for name, x := range m.view {
		if name != m.cfg.NodeName && (x.State == "alive" || x.State == "suspect") {
			live[name] = x.Health
		}
	}
	conflicts := findConflicts(m.health, live)
	var bad []Conflict
	var passed []string
	for _, s := range m.health.identities() {
		if m.vetted[s.name] {
			continue
		}
		mine := slices.DeleteFunc(slices.Clone(conflicts), func(c Conflict) bool { return c.Source != s.name })
		// A peer that agrees shows the conflict is older than this
		// node: it joins that peer's side, and sees the conflict as
		// the running nodes do (apply).
		if len(mine) > 0 && !agrees(live, s.name, s.id) {
			bad = append(bad, mine...)
			continue
		}
		passed = append(passed, s.name)
	}
	if len(bad) > 0 {
		return false, &ConflictError{Conflicts: bad}
	}
	for _, name := range passed {
		m.vetted[name] = true
	}
	if len(passed) > 0 && m.joined.Load() {
		m.cfg.Logger.Info("source's database identity checked against the cluster; relaying it", "sources", passed)
	}
	return len(passed) > 0, nil
}

// advertised returns h as this node gossips it, with m.mu held: before
// the join's check (nothing checked yet), with no identity; after it,
// without the sources not checked yet (vet).
func (m *Membership) advertised(h Health) Health {
	if h.IDs == "" {
		return h
	}
	own := h.identities()
	if h.Sources == "" {
		if !m.vetted[wire.DefaultSource] {
			h.IDs = ""
		}
		return h
	}
	fields := strings.Fields(h.Sources)
	var names []string
	var ids strings.Builder
	for i, s := range own {
		if m.vetted[s.name] {
			names = append(names, fields[i])
			ids.WriteString(tokenOrUnknown(s.id))
		}
	}
	switch {
	case len(names) == len(own):
		return h
	case len(names) == 0:
		// Before the join's check: every source listed, no identity.
		// (After it, the sources listed at the join were checked; an
		// empty list would read as wire.DefaultSource.)
		h.IDs = ""
		return h
	}
	h.Sources, h.IDs = strings.Join(names, " "), ids.String()
	return h
}

// readvertise gossips this node's health anew: what advertised returns
// has changed.
func (m *Membership) readvertise() {
	m.mu.Lock()
	adv := m.advertised(m.health)
	m.mu.Unlock()
	m.meta.Store(encodeMeta(adv))
	select {
	case m.metaSig <- struct{}{}:
	default:
	}
}

// Conflicts returns the live peers that disagree with this node on a
// source's database, as of the last membership change: each is left out
// of that source's map on this node (EligibleFor). Safe for concurrent
// use.
func (m *Membership) Conflicts() []Conflict {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.conflicts)
}

// peersOf returns health without self.
func peersOf(health map[string]Health, self string) map[string]Health {
	out := make(map[string]Health, len(health))
	for name, h := range health {
		if name != self {
			out[name] = h
		}
	}
	return out
}

// withoutConflicting returns health (for source) without the peers in a
// conflict with this node on source.
func withoutConflicting(health map[string]Health, source string, conflicts []Conflict) map[string]Health {
	for _, c := range conflicts {
		if c.Source == source {
			delete(health, c.Peer)
		}
	}
	return health
}

// diffConflicts returns the conflicts of now not in before, and those of
// before not in now.
func diffConflicts(before, now []Conflict) (appeared, resolved []Conflict) {
	for _, c := range now {
		if !slices.Contains(before, c) {
			appeared = append(appeared, c)
		}
	}
	for _, c := range before {
		if !slices.Contains(now, c) {
			resolved = append(resolved, c)
		}
	}
	return appeared, resolved
}

// logConflicts logs the conflicts that appeared (an error each) and
// those resolved (the peer left, or gossips what this node does).
func (m *Membership) logConflicts(appeared, resolved []Conflict) {
	for _, c := range appeared {
		m.cfg.Logger.Error("a peer disagrees on a source's database; it is left out of the source's map on this node: fix the configuration of one of the two",
			"conflict", c.String(), "source", c.Source, "peer", c.Peer, "peer_source", c.PeerSource,
			"identity", c.Identity, "peer_identity", c.PeerIdentity)
	}
	for _, c := range resolved {
		m.cfg.Logger.Info("a conflict on a source's database is over", "conflict", c.String(), "source", c.Source, "peer", c.Peer)
	}
}
