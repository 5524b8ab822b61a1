package lease_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ordo-relay/ordo/lease"
)

func TestConfigDefaultsAreValid(t *testing.T) {
	for _, ttl := range []time.Duration{300 * time.Millisecond, lease.DefaultTTL, time.Minute} {
		c := lease.ConfigWithTTL(ttl)
		c.Node, c.Want = "n1", func() []int { return nil }
		c.Connect = func(context.Context) (*pgx.Conn, error) { return nil, nil }
		if err := c.Validate(); err != nil {
			t.Errorf("ConfigWithTTL(%v): %v", ttl, err)
		}
	}
	if d := lease.DefaultConfig(); d.TTL != lease.DefaultTTL || d.Margin != d.TTL/4 || d.RenewEvery != d.TTL/3 || d.HandoffTimeout != d.TTL/2 {
		t.Fatalf("DefaultConfig() = %+v", d)
	}
}

// TestConfigValidateReportsEveryProblem: Validate names every unusable
// setting at once, not the first one it meets.
func TestConfigValidateReportsEveryProblem(t *testing.T) {
	tests := []struct {
		name string
		edit func(*lease.Config)
		want []string
	}{
		{"zero", func(c *lease.Config) { *c = lease.Config{} }, []string{
			"node name is required", "TTL 0s must be positive", "margin 0s", "renewal period 0s",
			"handoff timeout 0s", "Want is required", "Connect is required"}},
		{"margin too large", func(c *lease.Config) { c.Margin = c.TTL }, []string{"margin 2s must be positive and below the TTL 2s", "renewal period"}},
		{"renewal too slow", func(c *lease.Config) { c.RenewEvery = c.TTL - c.Margin }, []string{"renewal period 1.5s"}},
		{"no handoff timeout", func(c *lease.Config) { c.HandoffTimeout = 0 }, []string{"handoff timeout 0s must be positive"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := lease.DefaultConfig()
			c.Node, c.Want = "n1", func() []int { return nil }
			c.Connect = func(context.Context) (*pgx.Conn, error) { return nil, nil }
			tc.edit(&c)
			err := c.Validate()
			if err == nil {
				t.Fatal("Validate accepted it")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not say %q:\n%v", w, err)
				}
			}
			if got, want := strings.Count(err.Error(), "\n")+1, len(tc.want); got != want {
				t.Errorf("%d problems reported, want %d:\n%v", got, want, err)
			}
			if _, nerr := lease.New(c); nerr == nil {
				t.Error("New accepted a Config that Validate refuses")
			}
		})
	}
}
