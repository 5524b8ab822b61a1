package lease_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ordo-relay/ordo/internal/confcheck"
	"github.com/ordo-relay/ordo/lease"
)

func usable(c lease.Config) lease.Config {
	c.Node, c.Want = "n1", func() []int { return nil }
	c.Connect = func(context.Context) (*pgx.Conn, error) { return nil, nil }
	return c
}

func TestConfigDefaultsAreValid(t *testing.T) {
	for _, ttl := range []time.Duration{300 * time.Millisecond, lease.DefaultTTL, time.Minute} {
		if err := usable(lease.ConfigWithTTL(ttl)).Validate(); err != nil {
			t.Errorf("ConfigWithTTL(%v): %v", ttl, err)
		}
	}
	if d := lease.DefaultConfig(); d.TTL != lease.DefaultTTL || d.Margin != d.TTL/4 || d.RenewEvery != d.TTL/3 || d.HandoffTimeout != d.TTL/2 {
		t.Fatalf("DefaultConfig() = %+v", d)
	}
	// New fills the durations a Config leaves zero, from its TTL.
	if _, err := lease.New(usable(lease.Config{TTL: 10 * time.Second})); err != nil {
		t.Fatalf("New with only the TTL set: %v", err)
	}
}

// TestConfigValidateReportsEveryProblem: Validate names every unusable
// setting at once, each by its field, not the first one it meets.
func TestConfigValidateReportsEveryProblem(t *testing.T) {
	tests := []struct {
		name string
		edit func(*lease.Config)
		want []string
	}{
		{"zero", func(c *lease.Config) { *c = lease.Config{} },
			[]string{"Node", "TTL", "Margin", "RenewEvery", "HandoffTimeout", "Want", "Connect"}},
		{"margin too large", func(c *lease.Config) { c.Margin = c.TTL }, []string{"Margin", "RenewEvery"}},
		{"renewal too slow", func(c *lease.Config) { c.RenewEvery = c.TTL - c.Margin }, []string{"RenewEvery"}},
		{"negative handoff timeout", func(c *lease.Config) { c.HandoffTimeout = -time.Second }, []string{"HandoffTimeout"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := usable(lease.DefaultConfig())
			tc.edit(&c)
			err := c.Validate()
			if got := confcheck.Fields(err); !slices.Equal(got, tc.want) {
				t.Fatalf("problems with %v, want %v:\n%v", got, tc.want, err)
			}
			if tc.name != "zero" {
				if _, nerr := lease.New(c); nerr == nil {
					t.Error("New accepted a Config that Validate refuses")
				}
			}
		})
	}
}
