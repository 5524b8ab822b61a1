package node

import (
	"context"

	"github.com/ordo-relay/ordo/relay"
)

// broker is all the node knows of its message broker: the relay's
// Publisher, a Run that keeps the connection for the node's lifetime, and
// the state that health, /status and /metrics report. RabbitMQ's
// (rabbitmq.go) is the only one built; docs/design.md, "Another broker",
// says what a second one would need.
type broker interface {
	relay.Publisher
	// Run keeps the broker connection until ctx ends, settling what is
	// unconfirmed then as relay.Unsent, and retries outages itself.
	Run(ctx context.Context) error
	// State is the connection's state now. Safe for concurrent use.
	State() BrokerState
	// URL is the broker of the current or last connection, its
	// password masked.
	URL() string
	// TimedOut reports whether err, a relay.Failed result's, means the
	// broker did not confirm within its timeout.
	TimedOut(err error) bool
}

// BrokerState is the broker connection's state in /status ("broker").
type BrokerState struct {
	// Connected: a channel that confirms publishes is open.
	Connected bool `json:"connected"`
	// Blocked is the broker's reason while it blocks the connection
	// (e.g. "low on memory"), empty otherwise; BlockedSeconds is for how
	// long.
	Blocked        string  `json:"blocked,omitempty"`
	BlockedSeconds float64 `json:"blockedSeconds,omitempty"`
	// ChannelsOpened and Stalls count channels opened and links closed
	// because they stopped confirming, since the start.
	ChannelsOpened int64 `json:"channelsOpened"`
	Stalls         int64 `json:"stalls"`
}
