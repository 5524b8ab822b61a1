package node_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ordo-relay/ordo/internal/confcheck"
	"github.com/ordo-relay/ordo/node"
)

// TestConfigValidate: the defaults are valid; Validate reports the node's
// own problems, the cross-field ones and the nested configs' (re-rooted
// under Relay, AMQP, Gossip) at once; gossip settings are checked only
// when the node gossips.
func TestConfigValidate(t *testing.T) {
	if err := node.DefaultConfig().Validate(); err != nil {
		t.Fatalf("defaults refused: %v", err)
	}
	c := node.DefaultConfig()
	c.NodeName, c.Partitions, c.DBMaxConns = "", 0, 2
	c.Relay.Window, c.Relay.MaxAttempts = 0, 0
	c.AMQP.URL = "amqp://u:p%zz@h/"
	c.Gossip.Join = []string{"a:1"}
	c.Gossip.Keys = [][]byte{[]byte("short")} // not checked: no gossip address
	want := []string{"NodeName", "Partitions", "DBMaxConns", "Gossip.Join", "Relay.Window", "Relay.MaxAttempts", "AMQP.URL"}
	if got := confcheck.Fields(c.Validate()); !slices.Equal(got, want) {
		t.Fatalf("problems %v, want %v\n%v", got, want, c.Validate())
	}

	c = node.DefaultConfig()
	c.Gossip.BindAddr, c.Gossip.Keys = "127.0.0.1:7946", [][]byte{[]byte("short")}
	if got := confcheck.Fields(c.Validate()); !slices.Equal(got, []string{"Gossip.Keys"}) {
		t.Fatalf("gossiping node with a bad key: problems %v, want [Gossip.Keys]", got)
	}
}

// TestConfigDerivedReportedAtSource: a value the node derives for a
// component (Relay.Node and Gossip.NodeName from NodeName; the relay's
// read timeout, the publisher's stall timeout and the gossip health hold
// from LeaseTTL; the publisher's window from Relay.Window) is never
// reported under a field the user cannot set: its problem is its
// source's, reported once.
func TestConfigDerivedReportedAtSource(t *testing.T) {
	for _, c := range []struct {
		name string
		edit func(*node.Config)
		want []string
	}{
		{"node name", func(c *node.Config) { c.NodeName = "" }, []string{"NodeName"}},
		{"lease TTL", func(c *node.Config) { c.LeaseTTL = -time.Second }, []string{"LeaseTTL"}},
		{"window", func(c *node.Config) { c.Relay.Window = 70000 }, []string{"Relay.Window"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := node.DefaultConfig()
			cfg.Gossip.BindAddr, cfg.Gossip.Insecure = "127.0.0.1:7946", true
			c.edit(&cfg)
			err := cfg.Validate()
			if got := confcheck.Fields(err); !slices.Equal(got, c.want) {
				t.Fatalf("problems %v, want %v\n%v", got, c.want, err)
			}
		})
	}
}

// TestConfigGossipNeedsKey: a gossiping node needs a key or an explicit
// Gossip.Insecure, and not both; a node alone needs neither. The rule is
// the node's, so a program calling Run gets it as cmd/node does.
func TestConfigGossipNeedsKey(t *testing.T) {
	key := [][]byte{[]byte("0123456789abcdef")}
	for _, c := range []struct {
		name     string
		bind     string
		keys     [][]byte
		insecure bool
		want     []string
	}{
		{"alone", "", nil, false, nil},
		{"keyed", "127.0.0.1:7946", key, false, nil},
		{"insecure", "127.0.0.1:7946", nil, true, nil},
		{"no key", "127.0.0.1:7946", nil, false, []string{"Gossip.Keys"}},
		{"both", "127.0.0.1:7946", key, true, []string{"Gossip.Insecure"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := node.DefaultConfig()
			cfg.Gossip.BindAddr, cfg.Gossip.Keys, cfg.Gossip.Insecure = c.bind, c.keys, c.insecure
			err := cfg.Validate()
			if got := confcheck.Fields(err); !slices.Equal(got, c.want) {
				t.Fatalf("problems %v, want %v\n%v", got, c.want, err)
			}
			if c.name == "no key" && !strings.Contains(err.Error(), "Gossip.Insecure") {
				t.Fatalf("the refusal does not name the way out (Gossip.Insecure): %v", err)
			}
		})
	}
}

// TestConfigLeaseTimingRule: the node keeps the lease timing rule
// (lease.Timing). Its default reconnect cap is the rule's (a quarter of
// the TTL); a cap the user sets past it is refused at AMQP.ReconnectMax,
// the cap the node had before the rule (1 s with the 2 s default TTL)
// included, and a TTL whose cap is below AMQP.ReconnectMin at LeaseTTL,
// each saying what would do.
func TestConfigLeaseTimingRule(t *testing.T) {
	for _, c := range []struct {
		name string
		edit func(*node.Config)
		want []string
		says string
	}{
		{"defaults", func(*node.Config) {}, nil, ""},
		{"a 1s cap with the default TTL", func(c *node.Config) { c.AMQP.ReconnectMax = time.Second },
			[]string{"AMQP.ReconnectMax"}, "TTL of at least 4s"},
		{"a 1s cap with a 4s TTL", func(c *node.Config) { c.AMQP.ReconnectMax, c.LeaseTTL = time.Second, 4*time.Second }, nil, ""},
		{"a 300ms TTL", func(c *node.Config) { c.LeaseTTL = 300 * time.Millisecond }, []string{"LeaseTTL"}, "use at least 400ms"},
		{"a 300ms TTL, reconnects from 50ms", func(c *node.Config) {
			c.LeaseTTL, c.AMQP.ReconnectMin = 300*time.Millisecond, 50*time.Millisecond
		}, nil, ""},
		{"a cap below its minimum", func(c *node.Config) { c.AMQP.ReconnectMax = 50 * time.Millisecond },
			[]string{"AMQP.ReconnectMax"}, "below ReconnectMin"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := node.DefaultConfig()
			cfg.Gossip.BindAddr, cfg.Gossip.Insecure = "127.0.0.1:7946", true
			c.edit(&cfg)
			err := cfg.Validate()
			if got := confcheck.Fields(err); !slices.Equal(got, c.want) {
				t.Fatalf("problems %v, want %v\n%v", got, c.want, err)
			}
			if err != nil && !strings.Contains(err.Error(), c.says) {
				t.Fatalf("the refusal does not say %q: %v", c.says, err)
			}
		})
	}
}
