package membership

import (
	"slices"
	"testing"
	"time"

	"github.com/ordo-relay/ordo/internal/confcheck"
)

// TestConfigValidate: the defaults need a name and an address, and
// Validate reports every unusable field at once; New refuses what
// Validate refuses, before it opens a socket.
func TestConfigValidate(t *testing.T) {
	c := DefaultConfig()
	if got := confcheck.Fields(c.Validate()); !slices.Equal(got, []string{"NodeName", "BindAddr"}) {
		t.Fatalf("defaults: problems %v, want [NodeName BindAddr]", got)
	}
	c.NodeName, c.BindAddr, c.AdvertiseAddr = "a", "127.0.0.1:7946", "10.0.0.1:7946"
	if err := c.Validate(); err != nil {
		t.Fatalf("defaults refused: %v", err)
	}
	bad := Config{NodeName: "a", BindAddr: "127.0.0.1:x", AdvertiseAddr: "nohost", Keys: [][]byte{[]byte("short")},
		RejoinInterval: time.Millisecond, JoinTimeout: 0, ProbeInterval: time.Millisecond, SuspicionMult: 0, HealthHold: -1}
	want := []string{"BindAddr", "AdvertiseAddr", "Keys", "RejoinInterval", "JoinTimeout", "ProbeInterval", "SuspicionMult", "HealthHold"}
	if got := confcheck.Fields(bad.Validate()); !slices.Equal(got, want) {
		t.Fatalf("problems %v, want %v\n%v", got, want, bad.Validate())
	}
	if _, err := New(Config{NodeName: "a", BindAddr: "127.0.0.1:0", RejoinInterval: time.Millisecond}); err == nil {
		t.Fatal("New accepted a rejoin interval of 1ms")
	}
}
