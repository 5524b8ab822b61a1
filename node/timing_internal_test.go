package node

import (
	"testing"
	"time"

	"github.com/ordo-relay/ordo/lease"
)

// TestComponentsFollowTheTiming: every interval the node hands its
// components comes from the one rule (lease.Timing), so with the
// defaults the broker's reconnect cap, a health look and the rule's slack
// fit in the health hold the gossip applies; a cap the user sets reaches
// the publisher and the health pings alike.
func TestComponentsFollowTheTiming(t *testing.T) {
	c := DefaultConfig()
	c.Gossip.BindAddr, c.Gossip.Insecure = "127.0.0.1:7946", true
	tm := lease.TimingFor(c.LeaseTTL)
	rc, ac, mc := c.relayConfig(nil), c.amqpConfig(nil), c.membershipConfig(nil, nil)
	if rc.ReadTimeout != tm.ReadTimeout || ac.StallTimeout != tm.StallTimeout || ac.ReconnectMax != tm.ReconnectMax ||
		mc.HealthHold != tm.HealthHold {
		t.Fatalf("read %v, stall %v, reconnect cap %v, hold %v; the timing says %+v",
			rc.ReadTimeout, ac.StallTimeout, ac.ReconnectMax, mc.HealthHold, tm)
	}
	if spread := ac.ReconnectMax + tm.HealthEvery + c.LeaseTTL/8; spread > mc.HealthHold {
		t.Fatalf("nodes back from a shared outage up to %v apart (cap %v, look %v, slack %v), past the hold %v",
			spread, ac.ReconnectMax, tm.HealthEvery, c.LeaseTTL/8, mc.HealthHold)
	}
	c.AMQP.ReconnectMax = 300 * time.Millisecond
	if got := c.amqpConfig(nil).ReconnectMax; got != 300*time.Millisecond {
		t.Fatalf("the publisher's cap is %v, the user set 300ms", got)
	}
	if got := c.timing().ReconnectMax; got != 300*time.Millisecond {
		t.Fatalf("the health pings' cap is %v, the user set 300ms", got)
	}
}
