package lease

import (
	"time"

	"github.com/ordo-relay/ordo/internal/confcheck"
)

// Timing is the lease timing rule: every interval a node derives from its
// lease TTL, in one place, and the invariants that hold between them.
// TimingFor computes it; a node that lets its user set ReconnectMax
// replaces that field and checks the result with Validate.
//
// The intervals serve three ends:
//
//   - The lease itself (Margin, RenewEvery, HandoffTimeout): a node
//     publishes under a lease until the time it sent its last renewal plus
//     TTL − Margin, renews often enough that one failed renewal can be
//     retried before then, and releases a revoked lease within
//     HandoffTimeout.
//   - Work done under a lease (ReadTimeout, StallTimeout): a read ends
//     before the leases it reads for lapse, and a broker link that
//     confirms nothing for a TTL is taken for dead.
//   - Health in the map (HealthEvery, DatabaseWindow, BrokerGrace,
//     HealthHold, ReconnectMax): a node cut off from a dependency steps
//     aside once it has been less healthy than its peers for HealthHold,
//     and a fault every node sees moves nothing. The last needs nodes
//     that come back from a shared outage to say so within HealthHold of
//     each other: each reconnects up to ReconnectMax after the server is
//     back (a backoff sleep), reports it at its next look, up to
//     HealthEvery later, and gossip spreads the news. Hence the rule
//     ReconnectMax + HealthEvery + TTL/8 ≤ HealthHold, the TTL/8 left
//     for a connect, gossip (a few rounds of 100 ms) and a loaded
//     machine's scheduling. A reconnect cap of 1 s with the 2 s default
//     TTL (a hold of 1 s) breaks it: after a broker outage nodes can come
//     back 1.1 s apart, and one then hands its partitions off.
//
// With the rule's slack proportional to the TTL, a TTL below about 1 s
// leaves less for gossip than gossip takes; such a cluster may still move
// partitions after an outage that every node saw.
type Timing struct {
	// TTL is the lease lifetime in the database (Config.TTL).
	TTL time.Duration

	// Margin is taken off the local lease deadline (Config.Margin):
	// TTL/4.
	Margin time.Duration

	// RenewEvery is the renewal period (Config.RenewEvery): TTL/3, below
	// TTL − Margin.
	RenewEvery time.Duration

	// HandoffTimeout bounds a handoff (Config.HandoffTimeout): TTL/2.
	HandoffTimeout time.Duration

	// ReadTimeout bounds one read of the relay (relay.Config.ReadTimeout):
	// TTL/2, below TTL − Margin, so a read ends well inside the leases
	// it reads for.
	ReadTimeout time.Duration

	// StallTimeout is how long a broker link may confirm nothing, with
	// publishes waiting, before it is taken for dead and replaced
	// (rabbitmq.Config.StallTimeout): TTL.
	StallTimeout time.Duration

	// HealthEvery is how often a node pings each database and looks at
	// its broker link, so the most a change waits before the node reports
	// it: TTL/8, at least 20 ms.
	HealthEvery time.Duration

	// DatabaseWindow is how long a database stays reachable after the
	// last ping that succeeded was sent: TTL − Margin, so a node reports
	// its database lost no later than its leases lapse.
	DatabaseWindow time.Duration

	// BrokerGrace is how long a change of the broker link must last
	// before it counts (a channel reopened after a 404 moves nothing):
	// TTL/4, at least HealthEvery.
	BrokerGrace time.Duration

	// HealthHold is how long a member must stay less healthy than the
	// healthiest before it is left out of the map
	// (membership.Config.HealthHold): TTL/2.
	HealthHold time.Duration

	// ReconnectMax caps the reconnect backoff of every link whose health
	// is gossiped: the broker's (rabbitmq.Config.ReconnectMax) and each
	// database's health ping. TTL/4, the most the rule allows.
	ReconnectMax time.Duration
}

// TimingFor returns the timing of a lease TTL of ttl; it satisfies
// Validate for every ttl of at least 160 ms.
func TimingFor(ttl time.Duration) Timing {
	margin := ttl / 4
	return Timing{
		TTL: ttl, Margin: margin, RenewEvery: ttl / 3, HandoffTimeout: ttl / 2,
		ReadTimeout: ttl / 2, StallTimeout: ttl,
		HealthEvery: max(ttl/8, 20*time.Millisecond), DatabaseWindow: ttl - margin, BrokerGrace: ttl / 4,
		HealthHold: ttl / 2, ReconnectMax: ttl / 4,
	}
}

// Config returns a leaser's Config with t's TTL, Margin, RenewEvery and
// HandoffTimeout; the caller sets Node, Want and Connect.
func (t Timing) Config() Config {
	return Config{TTL: t.TTL, Margin: t.Margin, RenewEvery: t.RenewEvery, HandoffTimeout: t.HandoffTimeout}
}

// outageSlack is what the shared-outage rule leaves, besides the
// reconnect cap and a health look, for a connect, gossip and scheduling.
func (t Timing) outageSlack() time.Duration { return t.TTL / 8 }

// MaxReconnect returns the largest reconnect cap the rule allows with t's
// other intervals: HealthHold − HealthEvery − TTL/8.
func (t Timing) MaxReconnect() time.Duration {
	return t.HealthHold - t.HealthEvery - t.outageSlack()
}

// Validate reports every invariant t breaks, joined; each is a
// *confcheck.Problem naming the field that breaks it.
func (t Timing) Validate() error {
	ck := confcheck.New("lease timing")
	checkLease(ck, t.TTL, t.Margin, t.RenewEvery, t.HandoffTimeout)
	window := t.TTL - t.Margin
	ck.Require(t.ReadTimeout > 0 && t.ReadTimeout < window, "ReadTimeout",
		"%v is not between 0 and TTL − Margin (%v): a read would outlast the leases it reads for", t.ReadTimeout, window)
	ck.Require(t.StallTimeout > 0, "StallTimeout", "%v is not positive", t.StallTimeout)
	ck.Require(t.HealthEvery > 0 && t.HealthEvery < t.DatabaseWindow, "HealthEvery",
		"%v is not between 0 and DatabaseWindow (%v): a database would be lost between two pings", t.HealthEvery, t.DatabaseWindow)
	ck.Require(t.DatabaseWindow > 0 && t.DatabaseWindow <= window, "DatabaseWindow",
		"%v is not between 0 and TTL − Margin (%v): a node would report its database lost after its leases lapsed", t.DatabaseWindow, window)
	ck.Require(t.BrokerGrace >= t.HealthEvery, "BrokerGrace", "%v is below HealthEvery (%v)", t.BrokerGrace, t.HealthEvery)
	ck.Require(t.HealthHold > 0, "HealthHold", "%v is not positive", t.HealthHold)
	ck.Require(t.ReconnectMax > 0 && t.ReconnectMax <= t.MaxReconnect(), "ReconnectMax",
		"%v is more than a lease TTL of %v allows (%v): after an outage every node saw, nodes would come back up to %v "+
			"(the reconnect cap and a health look) apart, and the health hold (%v) less slack for gossip (%v) would not cover it, "+
			"so one would hand its partitions off; lower the cap, or use a TTL of at least %v",
		t.ReconnectMax, t.TTL, max(t.MaxReconnect(), 0), t.ReconnectMax+t.HealthEvery, t.HealthHold, t.outageSlack(), 4*t.ReconnectMax)
	return ck.Err()
}

// checkLease checks the invariants of a lease's own intervals, for
// Config.Validate and Timing.Validate alike.
func checkLease(ck *confcheck.Checker, ttl, margin, renewEvery, handoff time.Duration) {
	ck.Require(ttl > 0, "TTL", "%v is not positive", ttl)
	ck.Require(margin > 0 && margin < ttl, "Margin", "%v is not between 0 and the TTL (%v)", margin, ttl)
	ck.Require(renewEvery > 0 && renewEvery < ttl-margin, "RenewEvery",
		"%v is not between 0 and TTL − Margin (%v): a failed renewal could not be retried before the deadline", renewEvery, ttl-margin)
	ck.Require(handoff > 0, "HandoffTimeout", "%v is not positive", handoff)
}
