package membership

import (
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/ordo-relay/ordo/internal/confcheck"
	"github.com/ordo-relay/ordo/wire"
)

// Config configures a Membership. Start from DefaultConfig, set NodeName
// and BindAddr, change what needs changing, and hand it to New, which
// gives every zero field its DefaultConfig value and then calls Validate.
type Config struct {
	// NodeName is this node's name; it must be unique in the cluster and
	// stay the same across restarts. Required; there is no default.
	NodeName string

	// BindAddr is the host:port gossip listens on (TCP and UDP), e.g.
	// 0.0.0.0:7946. Required; there is no default. A specific host is
	// also the address advertised to peers; for 0.0.0.0 memberlist picks
	// this host's private address (set AdvertiseAddr behind NAT or in a
	// container).
	BindAddr string

	// AdvertiseAddr is the host:port other nodes reach this one at. The
	// default, empty, means BindAddr.
	AdvertiseAddr string

	// Join lists seed addresses (host:port). Run joins them at start and
	// again every RejoinInterval, so the two sides of a healed split find
	// each other again (memberlist never rejoins a peer it declared dead).
	// The default, empty, starts a cluster of one that others join.
	Join []string

	// RejoinInterval is how often the seeds are joined again. The default
	// is 10 s; at least 1 s. Shorter heals a split sooner, at the cost of
	// a TCP push-pull with a seed each time.
	RejoinInterval time.Duration

	// JoinTimeout bounds the first join: if seeds are configured and none
	// answers within it, Run fails. The default is one minute; at least
	// 1 s. Raise it when nodes start long before their seeds.
	JoinTimeout time.Duration

	// Keys are gossip encryption keys (16, 24 or 32 bytes each); the first
	// encrypts, all decrypt, which allows rotation. The default, empty,
	// gossips unencrypted: any host that reaches BindAddr can join.
	Keys [][]byte

	// ProbeInterval and SuspicionMult set failure detection: a silent node
	// is suspected after a failed probe and declared dead after about
	// SuspicionMult * max(1, log10(N)) * ProbeInterval more. The defaults,
	// 200 ms and 3, notice a dead node in about a second in a small
	// cluster (memberlist's LAN defaults take 5-6 s). Raise them on a
	// lossy network, where a slow probe would otherwise move partitions.
	ProbeInterval time.Duration
	SuspicionMult int

	// HealthHold is how long a member must stay less healthy than the
	// healthiest before partitions are no longer assigned to it (see
	// Eligible). A fault every node sees, noticed a little apart by each,
	// moves nothing; a fault of one node moves its partitions after it.
	// The default is 1 s; the node sets it to half its lease TTL.
	HealthHold time.Duration

	// Sources are the names of the sources whose eligibility is kept
	// (Membership.EligibleFor); empty means wire.DefaultSource alone.
	Sources []string

	// Transport replaces memberlist's network transport, as memberlist's
	// own Config.Transport does (a custom network; the node's tests split
	// a cluster with internal/gossipfilter). The default, nil, is UDP+TCP
	// on BindAddr.
	Transport memberlist.Transport

	// Logger receives membership events and memberlist's own warnings;
	// nil means slog.Default().
	Logger *slog.Logger
}

// DefaultConfig returns settings tuned for Ordo's failover target: a dead
// node is noticed in about a second in a small cluster. NodeName and
// BindAddr are left empty: they are required.
func DefaultConfig() Config {
	return Config{
		RejoinInterval: 10 * time.Second,
		JoinTimeout:    time.Minute,
		ProbeInterval:  200 * time.Millisecond,
		SuspicionMult:  3,
		HealthHold:     time.Second,
	}
}

// withDefaults returns c with every zero field set to its DefaultConfig
// value.
func (c Config) withDefaults() Config {
	d := DefaultConfig()
	confcheck.Fill(&c.RejoinInterval, d.RejoinInterval)
	confcheck.Fill(&c.JoinTimeout, d.JoinTimeout)
	confcheck.Fill(&c.ProbeInterval, d.ProbeInterval)
	confcheck.Fill(&c.HealthHold, d.HealthHold)
	confcheck.Fill(&c.SuspicionMult, d.SuspicionMult)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Validate reports every unusable setting of c as it stands, joined; each
// is a *confcheck.Problem naming its field.
func (c Config) Validate() error {
	ck := confcheck.New("membership")
	ck.Require(c.NodeName != "", "NodeName", "is empty; the node's name is required")
	_, _, err := splitHostPort(c.BindAddr)
	ck.Require(err == nil, "BindAddr", "%q is not a host:port: %v", c.BindAddr, err)
	if c.AdvertiseAddr != "" {
		_, _, err := splitHostPort(c.AdvertiseAddr)
		ck.Require(err == nil, "AdvertiseAddr", "%q is not a host:port: %v", c.AdvertiseAddr, err)
	}
	for i, k := range c.Keys {
		n := len(k)
		ck.Require(n == 16 || n == 24 || n == 32, "Keys", "key %d has %d bytes; want 16, 24 or 32", i, n)
	}
	ck.Require(c.RejoinInterval >= time.Second, "RejoinInterval", "%v is below 1s", c.RejoinInterval)
	ck.Require(c.JoinTimeout >= time.Second, "JoinTimeout", "%v is below 1s", c.JoinTimeout)
	ck.Require(c.ProbeInterval >= 10*time.Millisecond, "ProbeInterval", "%v is below 10ms", c.ProbeInterval)
	ck.Require(c.SuspicionMult >= 1, "SuspicionMult", "%d is below 1", c.SuspicionMult)
	ck.Require(c.HealthHold > 0, "HealthHold", "%v is not positive", c.HealthHold)
	return ck.Err()
}

// splitHostPort splits a host:port whose port is a number.
func splitHostPort(addr string) (host string, port int, err error) {
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, err
	}
	port, err = strconv.Atoi(p)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("port %q is not a number in 0..65535", p)
	}
	return host, port, nil
}

// sources returns Sources, or wire.DefaultSource alone.
func (c Config) sources() []string {
	if len(c.Sources) == 0 {
		return []string{wire.DefaultSource}
	}
	return c.Sources
}
