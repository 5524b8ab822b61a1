package inbox_test

import (
	"context"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ordo-relay/ordo/inbox"
	"github.com/ordo-relay/ordo/internal/confcheck"
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
		{"no lanes", func(c *inbox.Config) { c.Lanes = -1 }, "Lanes"},
		{"lanes above prefetch", func(c *inbox.Config) { c.Prefetch, c.Lanes = 4, 5 }, "Lanes"},
		{"lanes at prefetch", func(c *inbox.Config) { c.Prefetch, c.Lanes = 4, 4 }, ""},
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

// TestConfigValidateReportsEveryProblem: Validate names every unusable
// field at once, each a *confcheck.Problem, and leaves its receiver as it
// was.
func TestConfigValidateReportsEveryProblem(t *testing.T) {
	c := inbox.DefaultConfig("shipping")
	c.Logger = nil
	c.MaxAttempts, c.Shards, c.LeaseTTL, c.Mode = 0, 0, time.Millisecond, 9
	before := c
	err := c.Validate()
	want := []string{"Mode", "MaxAttempts", "Shards", "LeaseTTL"}
	if !reflect.DeepEqual(c, before) {
		t.Errorf("Validate changed its receiver: Logger %v, was %v", c.Logger, before.Logger)
	}
	if got := confcheck.Fields(err); !slices.Equal(got, want) {
		t.Errorf("Validate: problems with %v (%v), want %v", got, err, want)
	}
}

// TestConfigValidateDoesNotFill: Validate of a usable config with no
// Logger leaves it nil (New fills it, in one place).
func TestConfigValidateDoesNotFill(t *testing.T) {
	c := inbox.DefaultConfig("shipping")
	c.Logger = nil
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if c.Logger != nil {
		t.Fatal("Validate set the Logger")
	}
}

// TestNewFillsZeroFields: New fills what a caller left zero from
// DefaultConfig, and reports every problem of the rest, Consumer-only
// fields included.
func TestNewFillsZeroFields(t *testing.T) {
	h := func(context.Context, pgx.Tx, *inbox.Message) error { return nil }
	if _, err := inbox.New(inbox.Config{Name: "shipping", Exchange: "bookstore.ordering"}, nil, h); err != nil {
		t.Fatalf("New with only Name and Exchange: %v", err)
	}
	_, err := inbox.New(inbox.Config{Name: "Shipping", AMQPConfig: amqp.Config{Heartbeat: time.Second}}, nil, h)
	if got, want := confcheck.Fields(err), []string{"Name", "AMQPConfig.Heartbeat", "Exchange"}; !slices.Equal(got, want) {
		t.Fatalf("New: problems with %v (%v), want %v", got, err, want)
	}
}
