package nemesis

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/ordo-relay/ordo/bench/internal/harness"
	"github.com/ordo-relay/ordo/partition"
)

// The scenarios: what the faults are aimed at and what the checker judges.
const (
	// ScenarioRelay: three nodes and the order API; the checker judges
	// the relay from the deliveries.
	ScenarioRelay = "relay"
	// ScenarioConsumers: three cmd/shipping instances consume what one
	// node relays; the checker judges them from the shipping database.
	ScenarioConsumers = "consumers"
)

// Config is one nemesis run's settings; DefaultConfig fills them the way
// the command's flags default.
type Config struct {
	PostgresURL   string        // admin URL: the run creates and drops its own database through it
	AMQPURL       string        // RabbitMQ
	Out           string        // directory for the JSON result
	Partitions    int           // P
	ConfirmWindow int           // the nodes' W: also the bound on stale publishes per node a step acts on
	NodeBin       string        // a prebuilt node binary; empty builds ./cmd/node
	Timeout       time.Duration // bound on the harness's waits
	Rate          int           // order API requests a second (0: 100)
	Seed          int64         // the schedule's seed (0: drawn and printed)
	Scenario      string        // ScenarioRelay or ScenarioConsumers
	Profile       string        // ProfileShort or ProfileLong
	Kinds         []Kind        // the kinds of fault to run (the others' steps are left out of the plan); nil: every kind of the scenario
	// Sources is how many outbox databases the relay scenario's nodes
	// relay: 1 (the source default) or 2 (default and billing;
	// source-link runs only then). 0 is the scenario's default: 2 for
	// the relay, 1 for the consumers (which have only 1).
	Sources int
	// Lean drops the producers' key_seq trigger from every source once
	// the nodes run (outbox.DropKeySeqTrigger): rows arrive without
	// key_seq and the partition owners number them (docs/outbox-table.md,
	// "Who numbers a key's rows"). The relay scenario only.
	Lean bool
}

// DefaultConfig returns the settings of a short run on the local servers.
func DefaultConfig() Config {
	return Config{
		PostgresURL:   "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable",
		AMQPURL:       "amqp://guest:guest@127.0.0.1:5672/",
		Out:           "bench/results",
		Partitions:    partition.DefaultCount,
		ConfirmWindow: 512,
		Timeout:       10 * time.Minute,
		Scenario:      ScenarioRelay,
		Profile:       ProfileShort,
	}
}

// Validate reports every setting out of range.
func (c Config) Validate() error {
	var errs []error
	if c.ConfirmWindow < 1 || c.ConfirmWindow > 65535 {
		errs = append(errs, fmt.Errorf("confirm-window %d out of range 1..65535", c.ConfirmWindow))
	}
	if c.Rate < 0 {
		errs = append(errs, fmt.Errorf("rate %d must not be negative", c.Rate))
	}
	if c.Timeout <= 0 {
		errs = append(errs, fmt.Errorf("timeout %v must be positive", c.Timeout))
	}
	if c.Profile != ProfileShort && c.Profile != ProfileLong {
		errs = append(errs, fmt.Errorf("profile %q: want %s or %s", c.Profile, ProfileShort, ProfileLong))
	}
	if c.Sources < 0 || c.Sources > len(sourceNames) || (c.Scenario == ScenarioConsumers && c.Sources > 1) {
		errs = append(errs, fmt.Errorf("sources %d: want 1 or %d for scenario relay, 1 for consumers (0: the scenario's default)", c.Sources, len(sourceNames)))
	}
	if c.Lean && c.Scenario != ScenarioRelay {
		errs = append(errs, fmt.Errorf("lean: scenario %s keeps the key_seq trigger; only %s runs without it", c.Scenario, ScenarioRelay))
	}
	switch c.Scenario {
	case ScenarioRelay, ScenarioConsumers:
		for _, k := range c.Kinds {
			if !slices.Contains(c.scenarioKinds(), k) {
				errs = append(errs, fmt.Errorf("kind %s is not one of scenario %s's with %d sources (%s)", k, c.Scenario, c.Sources, joinKinds(c.scenarioKinds())))
			}
		}
	default:
		errs = append(errs, fmt.Errorf("scenario %q: want %s or %s", c.Scenario, ScenarioRelay, ScenarioConsumers))
	}
	if err := partition.ValidateCount(c.Partitions); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// scenarioKinds returns every kind of c's scenario: source-link only with
// two sources.
func (c Config) scenarioKinds() []Kind {
	if c.Scenario == ScenarioConsumers {
		return consumerKinds
	}
	if c.sourceCount() > 1 {
		return append(slices.Clone(allKinds), sourceKinds...)
	}
	return allKinds
}

// sourceCount returns Sources, or the scenario's default when it is 0.
func (c Config) sourceCount() int {
	switch {
	case c.Sources > 0:
		return c.Sources
	case c.Scenario == ScenarioConsumers:
		return 1
	default:
		return len(sourceNames)
	}
}

// harness returns what the harness needs of c.
func (c Config) harness() harness.Config {
	return harness.Config{PostgresURL: c.PostgresURL, AMQPURL: c.AMQPURL, Partitions: c.Partitions,
		ConfirmWindow: c.ConfirmWindow, NodeBin: c.NodeBin, Timeout: c.Timeout}
}

// rateOr returns Rate, or def when it is 0.
func (c Config) rateOr(def int) int {
	if c.Rate > 0 {
		return c.Rate
	}
	return def
}
