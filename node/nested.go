package node

import (
	"log/slog"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/ordo-relay/ordo/internal/confcheck"
	"github.com/ordo-relay/ordo/membership"
	"github.com/ordo-relay/ordo/relay"
)

// RelayConfig is what a node's user sets of the relay (relay.Config,
// where each field is documented at length; the names are the same). The
// node derives the rest: the node name, and the read timeout (the lease
// timing rule's, lease.Timing).
type RelayConfig struct {
	// Window is W, the most messages published and not yet marked; the
	// AMQP publisher's window is the same. 1..65535; the default is 512.
	Window int

	// BatchSize is the most rows one read returns for one partition. The
	// default is 512.
	BatchSize int

	// ReadAheadBytes bounds the rows held in memory, read ahead or
	// awaiting their mark. The default is 16 MiB.
	ReadAheadBytes int64

	// PollInterval is how often the relay reads without a notification.
	// The default is 1 s.
	PollInterval time.Duration

	// RetryMin and RetryMax bound the backoff of a key whose head failed.
	// The defaults are 100 ms and 30 s.
	RetryMin, RetryMax time.Duration

	// SettleTimeout bounds the wait for outstanding confirms when the
	// node stops. The default is 5 s.
	SettleTimeout time.Duration

	// MaxAttempts is how many failed attempts park a message. The default
	// is 5.
	MaxAttempts int

	// RetentionAge is how long processed rows are kept; 0 keeps them
	// forever. The default is 24 h.
	RetentionAge time.Duration

	// RetentionInterval is how often retention runs (default 1 min);
	// RetentionChunk the most rows one DELETE removes (default 1000).
	RetentionInterval time.Duration
	RetentionChunk    int
}

// relayDerived are the fields of relay.Config the node sets from its own
// (the Budget, which several sources' relays share, in build).
var relayDerived = []confcheck.From{{Field: "Node", Source: "NodeName"}, {Field: "ReadTimeout", Source: "LeaseTTL"},
	{Field: "Budget", Source: "Sources"}}

// relaySettings returns what a user may set of rc.
func relaySettings(rc relay.Config) RelayConfig {
	return RelayConfig{
		Window: rc.Window, BatchSize: rc.BatchSize, ReadAheadBytes: rc.ReadAheadBytes, PollInterval: rc.PollInterval,
		RetryMin: rc.RetryMin, RetryMax: rc.RetryMax, SettleTimeout: rc.SettleTimeout, MaxAttempts: rc.MaxAttempts,
		RetentionAge: rc.RetentionAge, RetentionInterval: rc.RetentionInterval, RetentionChunk: rc.RetentionChunk,
	}
}

// relayConfig returns the relay's config as the node runs it: a read
// stays well inside the leases it reads for.
func (c Config) relayConfig(logger *slog.Logger) relay.Config {
	r := c.Relay
	return relay.Config{
		Node: c.NodeName, ReadTimeout: c.timing().ReadTimeout, Logger: logger,
		Window: r.Window, BatchSize: r.BatchSize, ReadAheadBytes: r.ReadAheadBytes, PollInterval: r.PollInterval,
		RetryMin: r.RetryMin, RetryMax: r.RetryMax, SettleTimeout: r.SettleTimeout, MaxAttempts: r.MaxAttempts,
		RetentionAge: r.RetentionAge, RetentionInterval: r.RetentionInterval, RetentionChunk: r.RetentionChunk,
	}
}

// GossipConfig is what a node's user sets of gossip membership
// (membership.Config, same names), and whether the node may gossip
// unencrypted. The node derives the rest: the gossip name (NodeName) and
// the health hold (the lease timing rule's, lease.Timing).
type GossipConfig struct {
	// BindAddr is the host:port gossip listens on. The default, empty,
	// runs the node alone, without gossip: it wants every partition.
	BindAddr string

	// AdvertiseAddr is the host:port peers reach this node at; empty
	// means BindAddr.
	AdvertiseAddr string

	// Join lists seed addresses, joined at start and every
	// RejoinInterval (default 10 s) again, which heals splits.
	Join           []string
	RejoinInterval time.Duration

	// JoinTimeout bounds the first join. The default is one minute.
	JoinTimeout time.Duration

	// Keys are the gossip encryption keys (16, 24 or 32 bytes each); the
	// first encrypts, all decrypt. A gossiping node needs one, unless
	// Insecure says otherwise.
	Keys [][]byte

	// Insecure lets a gossiping node run without Keys: unencrypted, any
	// host that reaches BindAddr can join the cluster and take
	// partitions. Run logs a warning at every start. Off by default;
	// setting it with Keys is refused.
	Insecure bool

	// ProbeInterval and SuspicionMult set failure detection. The defaults,
	// 200 ms and 3, notice a dead node in about a second.
	ProbeInterval time.Duration
	SuspicionMult int
}

// gossipDerived are the fields of membership.Config the node sets from
// its own.
var gossipDerived = []confcheck.From{{Field: "NodeName", Source: "NodeName"}, {Field: "HealthHold", Source: "LeaseTTL"},
	{Field: "Sources", Source: "Sources"}}

// gossipSettings returns what a user may set of mc.
func gossipSettings(mc membership.Config) GossipConfig {
	return GossipConfig{
		BindAddr: mc.BindAddr, AdvertiseAddr: mc.AdvertiseAddr, Join: mc.Join, RejoinInterval: mc.RejoinInterval,
		JoinTimeout: mc.JoinTimeout, Keys: mc.Keys, ProbeInterval: mc.ProbeInterval, SuspicionMult: mc.SuspicionMult,
	}
}

// membershipConfig returns the membership config as the node runs it; tr,
// if not nil, replaces memberlist's network transport (a test hook). A
// node less healthy than a peer for the health hold steps aside; nodes
// that notice a shared outage within that of each other stay.
func (c Config) membershipConfig(logger *slog.Logger, tr memberlist.Transport) membership.Config {
	g := c.Gossip
	return membership.Config{
		NodeName: c.NodeName, HealthHold: c.timing().HealthHold, Logger: logger, Transport: tr, Sources: sourceNames(c.sources()),
		BindAddr: g.BindAddr, AdvertiseAddr: g.AdvertiseAddr, Join: g.Join, RejoinInterval: g.RejoinInterval,
		JoinTimeout: g.JoinTimeout, Keys: g.Keys, ProbeInterval: g.ProbeInterval, SuspicionMult: g.SuspicionMult,
	}
}
