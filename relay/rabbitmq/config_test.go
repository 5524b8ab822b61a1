package rabbitmq

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ordo-relay/ordo/internal/confcheck"
)

// TestConfigValidate: the defaults need only a URL, and Validate reports
// every unusable field at once, a URL that does not parse with its
// password masked.
func TestConfigValidate(t *testing.T) {
	c := DefaultConfig()
	if got := confcheck.Fields(c.Validate()); !slices.Equal(got, []string{"URL"}) {
		t.Fatalf("defaults without a URL: problems %v, want [URL]", got)
	}
	c.URL = "amqp://guest:guest@127.0.0.1:5672/, amqps://h2:5671/"
	if err := c.Validate(); err != nil {
		t.Fatalf("defaults refused: %v", err)
	}
	bad := Config{URL: "amqp://guest:guest@h/,amqp://u:s3cr%zz@h/", Window: 0, ReconnectMin: time.Second,
		ReconnectMax: time.Millisecond, Heartbeat: -1, StallTimeout: -1}
	want := []string{"URL", "Window", "StableAfter", "ExchangeCheckTTL", "Heartbeat", "ConfirmTimeout", "CallTimeout",
		"ReconnectMax", "StallTimeout"}
	err := bad.Validate()
	if got := confcheck.Fields(err); !slices.Equal(got, want) {
		t.Fatalf("problems %v, want %v\n%v", got, want, err)
	}
	if strings.Contains(err.Error(), "s3cr") || !strings.Contains(err.Error(), "amqp://u:xxxxx@h/ does not parse") {
		t.Fatalf("the URL problem shows the password or not the URL: %v", err)
	}
}

// TestNewFillsDefaults: New gives zero fields their defaults (and keeps
// StallTimeout 0, "off"), and refuses what Validate refuses: a negative
// value is an error, not a default.
func TestNewFillsDefaults(t *testing.T) {
	p, err := New(Config{URL: "amqp://h/"})
	if err != nil {
		t.Fatal(err)
	}
	if n := p.cfg; n.Window != 512 || n.StallTimeout != 0 || n.CallTimeout != 5*time.Second {
		t.Fatalf("New did not fill the defaults: %+v", n)
	}
	for _, bad := range []Config{{URL: "amqp://h/", Window: -1}, {URL: "amqp://h/", Heartbeat: -time.Second}, {}} {
		if _, err := New(bad); err == nil {
			t.Errorf("New(%+v) accepted", bad)
		}
	}
}
