package membership

import (
	"encoding/json"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/ordo-relay/ordo/wire"
)

// Health is what a node says of its own dependencies, and of the
// databases of its sources. It travels as the node's memberlist metadata
// (JSON within memberlist's 512-byte limit: see encodeMeta), so every
// member knows every other's.
type Health struct {
	// Broker: the node can publish (connected, not blocked by an alarm).
	Broker bool `json:"broker"`
	// Database: the node reaches PostgreSQL (it can renew its leases);
	// with several sources, every source's database.
	Database bool `json:"db"`
	// Sources lists the sources the node relays, space-separated, each
	// prefixed with "!" while its database is unreachable: "default
	// !billing". Empty, as the one-source form and nodes older than
	// sources send it, means wire.DefaultSource alone, reachable as
	// Database says (see For). Built by SourcesHealth.
	Sources string `json:"src,omitempty"`
	// IDs holds the database identity token (DatabaseIdentity) of each
	// source listed, in Sources' order (of wire.DefaultSource when
	// Sources is empty), concatenated, all of one width; a token of '.'s
	// is unknown. Empty, as nodes older than identities send it, is
	// every token unknown. Built by SourcesHealth; in the one-source
	// form, the token of wire.DefaultSource's database.
	IDs string `json:"id,omitempty"`
}

// Healthy is a node with every dependency reachable; a member whose
// metadata is missing or unreadable (an older version) counts as this.
var Healthy = Health{Broker: true, Database: true}

// Score ranks health: the number of dependencies reachable.
func (h Health) Score() int {
	n := 0
	if h.Broker {
		n++
	}
	if h.Database {
		n++
	}
	return n
}

// metaVersion is the version of the metadata encoding.
const metaVersion = 1

// nodeMeta is Health as memberlist metadata.
type nodeMeta struct {
	V int `json:"v"`
	Health
}

// encodeMeta encodes h as metadata of at most memberlist.MetaMaxSize
// bytes, whatever the reachability of its sources: the identity tokens
// are cut as needed (fitIDs). MaxSources (the node's: 12) names of
// wire.MaxSourceLen bytes leave MinIdentityLen characters a token (24
// bits); 12 names of up to 28 bytes leave the whole IdentityLen (48
// bits); TestMetaIdentityFits.
func encodeMeta(h Health) []byte {
	b, _ := json.Marshal(nodeMeta{V: metaVersion, Health: fitIDs(h, memberlist.MetaMaxSize)}) // cannot fail
	return b
}

// decodeMeta reads a member's metadata; anything it cannot read counts as
// Healthy, so a node that gossips no health is treated as before.
func decodeMeta(b []byte) Health {
	var m nodeMeta
	if len(b) == 0 || json.Unmarshal(b, &m) != nil || m.V != metaVersion {
		return Healthy
	}
	return m.Health
}

// eligibility decides which live members partitions are assigned to:
// every one, except a member less healthy than the healthiest for at least
// hold. The hold keeps a fault that every node sees (the broker or the
// database down for all) from moving partitions: nodes notice it a few
// hundred milliseconds apart, and none of them is excluded for that long.
// It also waits out flaps. Not safe for concurrent use.
type eligibility struct {
	hold   time.Duration
	behind map[string]time.Time // member -> since when it is less healthy than the best
}

// update takes the live members' health at now and returns the eligible
// ones, sorted, and the earliest later time at which that may change
// without any new health (zero: none).
func (e *eligibility) update(now time.Time, health map[string]Health) (eligible []string, recheck time.Time) {
	best := 0
	for _, h := range health {
		best = max(best, h.Score())
	}
	if e.behind == nil {
		e.behind = map[string]time.Time{}
	}
	for name := range e.behind {
		if h, ok := health[name]; !ok || h.Score() >= best {
			delete(e.behind, name)
		}
	}
	for name, h := range health {
		since, ok := e.behind[name]
		if h.Score() < best && !ok {
			since = now
			e.behind[name] = since
		}
		if h.Score() < best && now.Sub(since) >= e.hold {
			continue // stepped aside
		}
		eligible = append(eligible, name)
		if h.Score() < best && (recheck.IsZero() || since.Add(e.hold).Before(recheck)) {
			recheck = since.Add(e.hold)
		}
	}
	slices.Sort(eligible)
	return eligible, recheck
}

// SourceState is one source's database reachability, as a node with
// several sources (or one not named wire.DefaultSource) reports it.
type SourceState struct {
	Name      string
	Reachable bool
	// Identity is the token of the source's database (DatabaseIdentity);
	// "" unknown.
	Identity string
}

// SourcesHealth returns the Health a node relaying sources says of
// itself: Broker as given, Database true when every source is reachable,
// and Sources listing each (see Health.Sources).
func SourcesHealth(broker bool, sources []SourceState) Health {
	h := Health{Broker: broker, Database: true}
	parts := make([]string, len(sources))
	var ids strings.Builder
	known := false
	for i, s := range sources {
		parts[i] = s.Name
		if !s.Reachable {
			parts[i] = "!" + s.Name
			h.Database = false
		}
		ids.WriteString(tokenOrUnknown(s.Identity))
		known = known || len(s.Identity) == IdentityLen
	}
	h.Sources = strings.Join(parts, " ")
	if known {
		h.IDs = ids.String()
	}
	return h
}

// tokenOrUnknown returns id, a token, or one of '.'s when id is not one
// ("": unknown).
func tokenOrUnknown(id string) string {
	if len(id) != IdentityLen {
		return unknownID()
	}
	return id
}

// For returns the member's health as far as source concerns it (Broker,
// and Database for that source's database alone), and whether the member
// relays source at all. A member that lists no sources (the one-source
// form, or a node older than sources) relays wire.DefaultSource only,
// with Database as its health says.
func (h Health) For(source string) (Health, bool) {
	if h.Sources == "" {
		return Health{Broker: h.Broker, Database: h.Database}, source == wire.DefaultSource
	}
	for _, s := range strings.Fields(h.Sources) {
		name, down := strings.CutPrefix(s, "!")
		if name == source {
			return Health{Broker: h.Broker, Database: !down}, true
		}
	}
	return Health{}, false
}
