package node

import (
	"context"

	"github.com/hashicorp/memberlist"

	"github.com/ordo-relay/ordo/internal/relayhook"
	"github.com/ordo-relay/ordo/relay"
)

// testHooks are what tests change in a node, through Options (set by
// export_test.go, so no program outside the package's tests can). The
// zero value is the node as it runs everywhere else.
type testHooks struct {
	// GossipTransport, if set, replaces memberlist's network transport
	// (tests drop gossip between groups with it).
	GossipTransport memberlist.Transport
	// WrapPublisher wraps the AMQP publisher (fault injection).
	WrapPublisher func(relay.Publisher) relay.Publisher
	// PerKeyLimit, when above 1, replaces the relay's per-key limit of 1
	// (internal/relayhook): per-key order is lost under nacks and
	// returns, and the tests that show it set this.
	PerKeyLimit int
}

// publisher returns pub as the relay gets it.
func (h testHooks) publisher(pub relay.Publisher) relay.Publisher {
	if h.WrapPublisher != nil {
		return h.WrapPublisher(pub)
	}
	return pub
}

// relayRun returns r's Run as a component runs it.
func (h testHooks) relayRun(r *relay.Relay) func(context.Context) error {
	return func(ctx context.Context) error { return r.Run(relayhook.WithPerKeyLimit(ctx, h.PerKeyLimit)) }
}
