package node_test

import (
	"slices"
	"testing"

	"github.com/ordo-relay/ordo/internal/confcheck"
	"github.com/ordo-relay/ordo/node"
)

// TestConfigValidate: the defaults are valid; Validate reports the node's
// own problems, the cross-field ones and the nested configs' (re-rooted
// under Relay, AMQP, Gossip) at once; a field the node sets from another
// (Relay.Node, Gossip.NodeName from NodeName) is reported once, at its
// source; gossip settings are checked only when the node gossips.
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
