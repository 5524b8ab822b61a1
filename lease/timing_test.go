package lease_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ordo-relay/ordo/internal/confcheck"
	"github.com/ordo-relay/ordo/lease"
)

// TestTimingForKeepsTheRule: every TTL a node accepts yields a timing
// that keeps every invariant, and the default's intervals are those
// docs/operations.md ("Sizing") lists.
func TestTimingForKeepsTheRule(t *testing.T) {
	for _, ttl := range []time.Duration{160 * time.Millisecond, 300 * time.Millisecond, time.Second, lease.DefaultTTL,
		3 * time.Second, 10 * time.Second, time.Hour} {
		tm := lease.TimingFor(ttl)
		if err := tm.Validate(); err != nil {
			t.Errorf("TimingFor(%v): %v", ttl, err)
		}
		if got := tm.ReconnectMax + tm.HealthEvery + ttl/8; got > tm.HealthHold {
			t.Errorf("TimingFor(%v): reconnect cap + health look + slack = %v, past the hold %v", ttl, got, tm.HealthHold)
		}
		if c := lease.ConfigWithTTL(ttl); c.TTL != ttl || c.Margin != tm.Margin || c.RenewEvery != tm.RenewEvery ||
			c.HandoffTimeout != tm.HandoffTimeout {
			t.Errorf("ConfigWithTTL(%v) = %+v, not the timing's %+v", ttl, c, tm)
		}
	}
	ms := time.Millisecond
	want := lease.Timing{TTL: 2000 * ms, Margin: 500 * ms, RenewEvery: 666666666, HandoffTimeout: 1000 * ms,
		ReadTimeout: 1000 * ms, StallTimeout: 2000 * ms, HealthEvery: 250 * ms, DatabaseWindow: 1500 * ms,
		BrokerGrace: 500 * ms, HealthHold: 1000 * ms, ReconnectMax: 500 * ms}
	if got := lease.TimingFor(lease.DefaultTTL); got != want {
		t.Fatalf("TimingFor(%v) = %+v, want %+v", lease.DefaultTTL, got, want)
	}
}

// TestTimingRefusesAReconnectCapPastTheHold: the reconnect cap the node
// had before the rule, 1 s with the 2 s default TTL (a hold of 1 s), is
// refused: nodes could come back from an outage every one saw more than
// the hold apart, and one would hand its partitions off. The refusal
// says which TTL the cap needs, and that TTL takes it.
func TestTimingRefusesAReconnectCapPastTheHold(t *testing.T) {
	tm := lease.TimingFor(lease.DefaultTTL)
	tm.ReconnectMax = time.Second
	err := tm.Validate()
	if got := confcheck.Fields(err); !slices.Equal(got, []string{"ReconnectMax"}) {
		t.Fatalf("problems %v, want [ReconnectMax]: %v", got, err)
	}
	if !strings.Contains(err.Error(), "at least 4s") || !strings.Contains(err.Error(), "(500ms)") {
		t.Fatalf("the refusal names neither the cap allowed (500ms) nor the TTL needed (4s): %v", err)
	}
	tm = lease.TimingFor(4 * time.Second)
	tm.ReconnectMax = time.Second
	if err := tm.Validate(); err != nil {
		t.Fatalf("a 1s cap with a 4s TTL: %v", err)
	}
	tm.ReconnectMax = time.Second + time.Millisecond
	if err := tm.Validate(); err == nil {
		t.Fatal("a cap just past a quarter of the TTL accepted")
	}
}

// TestTimingValidateReportsEveryProblem: each invariant is checked, and
// reported at the field that breaks it.
func TestTimingValidateReportsEveryProblem(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*lease.Timing)
		want []string
	}{
		{"zero", func(tm *lease.Timing) { *tm = lease.Timing{} }, []string{"TTL", "Margin", "RenewEvery", "HandoffTimeout",
			"ReadTimeout", "StallTimeout", "HealthEvery", "DatabaseWindow", "HealthHold", "ReconnectMax"}},
		{"renewal too slow", func(tm *lease.Timing) { tm.RenewEvery = tm.TTL - tm.Margin }, []string{"RenewEvery"}},
		{"read outlasting its leases", func(tm *lease.Timing) { tm.ReadTimeout = tm.TTL }, []string{"ReadTimeout"}},
		{"database lost after the leases", func(tm *lease.Timing) { tm.DatabaseWindow = tm.TTL }, []string{"DatabaseWindow"}},
		{"looks rarer than the window", func(tm *lease.Timing) { tm.HealthEvery = tm.DatabaseWindow },
			[]string{"HealthEvery", "BrokerGrace", "ReconnectMax"}},
		{"grace shorter than a look", func(tm *lease.Timing) { tm.BrokerGrace = tm.HealthEvery / 2 }, []string{"BrokerGrace"}},
		{"hold shorter than a reconnect", func(tm *lease.Timing) { tm.HealthHold = tm.ReconnectMax }, []string{"ReconnectMax"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tm := lease.TimingFor(lease.DefaultTTL)
			tc.edit(&tm)
			err := tm.Validate()
			if got := confcheck.Fields(err); !slices.Equal(got, tc.want) {
				t.Fatalf("problems %v, want %v:\n%v", got, tc.want, err)
			}
		})
	}
}
