package inbox_test

import (
	"strings"
	"testing"
	"time"

	"github.com/ordo-relay/ordo/inbox"
)

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name    string
		edit    func(*inbox.Config)
		wantErr string
	}{
		{"defaults", func(*inbox.Config) {}, ""},
		{"name with upper case", func(c *inbox.Config) { c.Name = "Shipping" }, "Name"},
		{"empty instance", func(c *inbox.Config) { c.Instance = "" }, "Instance"},
		{"no attempts", func(c *inbox.Config) { c.MaxAttempts = 0 }, "MaxAttempts"},
		{"retry min above max", func(c *inbox.Config) { c.RetryMin, c.RetryMax = time.Second, time.Millisecond }, "RetryMin"},
		{"no shards", func(c *inbox.Config) { c.Shards = 0 }, "Shards"},
		{"short lease", func(c *inbox.Config) { c.LeaseTTL = 100 * time.Millisecond }, "LeaseTTL"},
		{"short heartbeat", func(c *inbox.Config) { c.Heartbeat = 100 * time.Millisecond }, "Heartbeat"},
		{"unknown mode", func(c *inbox.Config) { c.Mode = 7 }, "Mode(7)"},
		{"retention without interval", func(c *inbox.Config) { c.RetentionAge, c.RetentionInterval = time.Hour, 0 }, "RetentionInterval"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := inbox.DefaultConfig("shipping")
			tc.edit(&c)
			err := c.Validate()
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("Validate: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("Validate: %v, want an error naming %s", err, tc.wantErr)
			}
		})
	}
}

func TestParseMode(t *testing.T) {
	for _, m := range []inbox.Mode{inbox.Ordered, inbox.Bootstrap, inbox.Partial} {
		if got, err := inbox.ParseMode(m.String()); err != nil || got != m {
			t.Fatalf("ParseMode(%q) = %v, %v", m.String(), got, err)
		}
	}
	if _, err := inbox.ParseMode("strict"); err == nil {
		t.Fatal("ParseMode accepted an unknown mode")
	}
}
