package membership

import (
	"encoding/json"
	"slices"
	"time"
)

// Health is what a node says of its own dependencies. It travels as the
// node's memberlist metadata (a few dozen bytes of JSON, well under
// memberlist's 512-byte limit), so every member knows every other's.
type Health struct {
	// Broker: the node can publish (connected, not blocked by an alarm).
	Broker bool `json:"broker"`
	// Database: the node reaches PostgreSQL (it can renew its leases).
	Database bool `json:"db"`
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

func encodeMeta(h Health) []byte {
	b, _ := json.Marshal(nodeMeta{V: metaVersion, Health: h}) // cannot fail
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
