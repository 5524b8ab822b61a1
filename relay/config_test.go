package relay_test

import (
	"slices"
	"testing"
	"time"

	"github.com/ordo-relay/ordo/internal/confcheck"
	"github.com/ordo-relay/ordo/relay"
)

// TestConfigValidate: the defaults need only a node name, and Validate
// reports every unusable field at once, each by name.
func TestConfigValidate(t *testing.T) {
	c := relay.DefaultConfig()
	if got := confcheck.Fields(c.Validate()); !slices.Equal(got, []string{"Node"}) {
		t.Fatalf("defaults without a node: problems %v, want [Node]", got)
	}
	c.Node = "n1"
	if err := c.Validate(); err != nil {
		t.Fatalf("defaults refused: %v", err)
	}
	bad := relay.Config{Node: "n1", Window: 70000, BatchSize: -1, ReadAheadBytes: 0,
		PollInterval: 0, ReadTimeout: -time.Second, RetryMin: time.Second, RetryMax: time.Millisecond,
		SettleTimeout: 0, MaxAttempts: 0, RetentionAge: -time.Hour, RetentionInterval: 0, RetentionChunk: 0}
	want := []string{"Window", "BatchSize", "ReadAheadBytes", "PollInterval", "ReadTimeout",
		"SettleTimeout", "RetentionInterval", "RetryMax", "MaxAttempts", "RetentionAge", "RetentionChunk"}
	if got := confcheck.Fields(bad.Validate()); !slices.Equal(got, want) {
		t.Fatalf("problems %v, want %v\n%v", got, want, bad.Validate())
	}
}

// TestNewFillsDefaults: New gives zero fields their defaults (and keeps
// RetentionAge 0, "forever"), and refuses what Validate refuses.
func TestNewFillsDefaults(t *testing.T) {
	if _, err := relay.New(relay.Config{Node: "n1"}, nil, nil, nil); err != nil {
		t.Fatalf("New with zero fields: %v", err)
	}
	if _, err := relay.New(relay.Config{Node: "n1", Window: -1}, nil, nil, nil); err == nil {
		t.Fatal("New accepted a negative window")
	}
	if _, err := relay.New(relay.Config{}, nil, nil, nil); err == nil {
		t.Fatal("New accepted a config without a node")
	}
}
