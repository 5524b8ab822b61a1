// Package nodehook carries a node's test hooks: what tests change in a
// node.Run (fault injection, a view of its parts), which no user may set.
// They travel in the context given to node.Run, as relayhook's travel in
// the one given to relay.Relay.Run: node's public Config and Options hold
// only what a user may set, and no program outside this module can import
// this package. Node's own tests and relay's real-server tests (which run
// the relay through node's build, not a copy of it) both use it.
package nodehook

import (
	"context"

	"github.com/hashicorp/memberlist"

	"github.com/ordo-relay/ordo/lease"
	"github.com/ordo-relay/ordo/relay"
)

// Hooks are the test hooks of one node. The zero value is the node as it
// runs everywhere else.
type Hooks struct {
	// GossipTransport, if set, replaces memberlist's network transport
	// (tests drop gossip between groups with it).
	GossipTransport memberlist.Transport
	// WrapPublisher wraps the AMQP publisher (fault injection).
	WrapPublisher func(relay.Publisher) relay.Publisher
	// WrapStore wraps each source's relay store (fault injection,
	// counting calls).
	WrapStore func(relay.Store) relay.Store
	// WrapOwnership wraps each source's leaser as its relay sees it (a
	// view that does not notice a lost lease, say).
	WrapOwnership func(relay.Ownership) relay.Ownership
	// LeaseURL, if set, is the database URL the leasers connect to
	// instead of their source's (through a proxy, so that a test can cut
	// the leases' link alone).
	LeaseURL string
	// PerKeyLimit, when above 1, replaces the relay's per-key limit of 1
	// (internal/relayhook): per-key order is lost under nacks and
	// returns, and the tests that show it set this.
	PerKeyLimit int
	// UnsharedBudget, with several sources, gives each source's relay
	// the node's full confirm window and read-ahead instead of a share
	// of one relay.Budget: the A side of the bench's A/B of the Budget
	// (cmd/node sets it from ORDO_BENCH_UNSHARED_BUDGET, which only the
	// bench's sources scenario sets).
	UnsharedBudget bool
	// Built, if set, is called once the node is built and before it
	// starts, with its parts (a test reads the relay's stats, the
	// publisher's state and the leases from them).
	Built func(Parts)
}

// Parts are a built node's components.
type Parts struct {
	Publisher relay.Publisher
	// Sources are the node's sources, in Config order.
	Sources []SourceParts
}

// SourceParts are what a node builds for one source.
type SourceParts struct {
	Name   string
	Relay  *relay.Relay
	Leaser *lease.Leaser
}

type hooksKey struct{}

// With returns ctx carrying h for the node run with it.
func With(ctx context.Context, h Hooks) context.Context {
	return context.WithValue(ctx, hooksKey{}, h)
}

// From returns the hooks ctx carries: the zero Hooks unless With set
// some.
func From(ctx context.Context) Hooks {
	h, _ := ctx.Value(hooksKey{}).(Hooks)
	return h
}

// Publisher returns pub as the relay gets it.
func (h Hooks) Publisher(pub relay.Publisher) relay.Publisher {
	if h.WrapPublisher != nil {
		return h.WrapPublisher(pub)
	}
	return pub
}

// Store returns s as the relay gets it.
func (h Hooks) Store(s relay.Store) relay.Store {
	if h.WrapStore != nil {
		return h.WrapStore(s)
	}
	return s
}

// Ownership returns own as the relay gets it.
func (h Hooks) Ownership(own relay.Ownership) relay.Ownership {
	if h.WrapOwnership != nil {
		return h.WrapOwnership(own)
	}
	return own
}
