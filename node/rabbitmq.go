package node

import (
	"errors"
	"log/slog"
	"time"

	"github.com/ordo-relay/ordo/internal/confcheck"
	"github.com/ordo-relay/ordo/relay/rabbitmq"
)

// The node's RabbitMQ wiring: its settings, how the publisher is built
// from them, and the publisher as the node's broker. No other file of
// the package names relay/rabbitmq.

// AMQPConfig is what a node's user sets of the RabbitMQ publisher
// (rabbitmq.Config, same names). The node derives the rest: the window
// (Relay.Window) and the stall timeout (the lease timing rule's,
// lease.Timing).
type AMQPConfig struct {
	// URL is the broker, or a comma-separated list of broker nodes tried
	// in turn. The default is the local broker's.
	URL string

	// ReconnectMin and ReconnectMax bound the backoff between connection
	// attempts. ReconnectMin defaults to 100 ms. ReconnectMax defaults to
	// 0, which means the lease timing rule's cap, a quarter of LeaseTTL
	// (lease.Timing): nodes coming back from a broker outage they all saw
	// must say so within the health hold of each other, or one hands its
	// partitions off. A ReconnectMax above that cap is refused, and so is
	// a LeaseTTL whose cap is below ReconnectMin.
	ReconnectMin, ReconnectMax time.Duration

	// StableAfter is how long a connection must stay up, with a publish
	// confirmed, before the reconnect backoff starts over. The default is
	// 1 s.
	StableAfter time.Duration

	// ExchangeCheckTTL is how long a check that an exchange exists is
	// trusted. The default is 10 s.
	ExchangeCheckTTL time.Duration

	// Heartbeat is the AMQP heartbeat interval. The default is 5 s.
	Heartbeat time.Duration

	// ConfirmTimeout is how long a publish may wait for its confirm on an
	// open channel before it counts as a failed attempt. The default is
	// 30 s.
	ConfirmTimeout time.Duration

	// CallTimeout bounds every call that waits for the broker's answer.
	// The default is 5 s.
	CallTimeout time.Duration

	// ConnectionName is the connection_name the broker shows for the
	// node's connection; empty means "ordo node " + NodeName, as the
	// node's PostgreSQL sessions are named.
	ConnectionName string

	// CloudEvents publishes every message as a CloudEvent too (AMQP
	// binding, binary content mode); CloudEventsSource is its source
	// attribute, required with it. Off by default.
	CloudEvents       bool
	CloudEventsSource string
}

// amqpDerived are the fields of rabbitmq.Config the node sets from its
// own.
var amqpDerived = []confcheck.From{{Field: "Window", Source: "Relay.Window"}, {Field: "StallTimeout", Source: "LeaseTTL"}}

// amqpSettings returns what a user may set of ac.
func amqpSettings(ac rabbitmq.Config) AMQPConfig {
	return AMQPConfig{
		URL: ac.URL, ReconnectMin: ac.ReconnectMin, ReconnectMax: ac.ReconnectMax, StableAfter: ac.StableAfter,
		ExchangeCheckTTL: ac.ExchangeCheckTTL, Heartbeat: ac.Heartbeat, ConfirmTimeout: ac.ConfirmTimeout,
		CallTimeout: ac.CallTimeout, ConnectionName: ac.ConnectionName,
		CloudEvents: ac.CloudEvents, CloudEventsSource: ac.CloudEventsSource,
	}
}

// amqpConfig returns the publisher's config as the node runs it: its
// window is the relay's, a link that confirms nothing for a lease TTL is
// taken for dead, so the node stops counting on it long before the
// heartbeat would, and its reconnect cap is the timing rule's unless the
// user set one.
func (c Config) amqpConfig(logger *slog.Logger) rabbitmq.Config {
	a, t := c.AMQP, c.timing()
	name := a.ConnectionName
	if name == "" {
		name = "ordo node " + c.NodeName // as the PostgreSQL sessions' application_name
	}
	return rabbitmq.Config{
		Window: c.Relay.Window, StallTimeout: t.StallTimeout, Logger: logger, ConnectionName: name,
		URL: a.URL, ReconnectMin: a.ReconnectMin, ReconnectMax: t.ReconnectMax, StableAfter: a.StableAfter,
		ExchangeCheckTTL: a.ExchangeCheckTTL, Heartbeat: a.Heartbeat, ConfirmTimeout: a.ConfirmTimeout,
		CallTimeout: a.CallTimeout, CloudEvents: a.CloudEvents, CloudEventsSource: a.CloudEventsSource,
	}
}

// defaultAMQP is what DefaultConfig sets of the publisher.
func defaultAMQP() AMQPConfig {
	a := amqpSettings(rabbitmq.DefaultConfig())
	a.URL = "amqp://guest:guest@127.0.0.1:5672/"
	a.ReconnectMax = 0 // the lease timing rule's cap for LeaseTTL
	return a
}

// rabbitBroker is the RabbitMQ publisher as the node's broker.
type rabbitBroker struct{ *rabbitmq.Publisher }

// newBroker builds the node's broker from c.
func (c Config) newBroker(logger *slog.Logger) (broker, error) {
	p, err := rabbitmq.New(c.amqpConfig(logger))
	if err != nil {
		return nil, err
	}
	return rabbitBroker{p}, nil
}

func (b rabbitBroker) State() BrokerState {
	s := b.Status()
	return BrokerState{Connected: s.Connected, Blocked: s.Blocked, BlockedSeconds: s.BlockedSeconds,
		ChannelsOpened: s.ChannelsOpened, Stalls: s.Stalls}
}

func (rabbitBroker) TimedOut(err error) bool { return errors.Is(err, rabbitmq.ErrConfirmTimeout) }
