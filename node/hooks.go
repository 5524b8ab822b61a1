package node

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ordo-relay/ordo/internal/nodehook"
	"github.com/ordo-relay/ordo/internal/relayhook"
	"github.com/ordo-relay/ordo/relay"
)

// The test hooks of a node (internal/nodehook) travel in the context
// given to Run, so that neither Config nor Options holds a knob no user
// may set. The zero Hooks is the node as it runs everywhere else.

// relayRun returns r's Run as a component runs it, with the per-key limit
// the hooks set (internal/relayhook).
func relayRun(h nodehook.Hooks, r *relay.Relay) func(context.Context) error {
	return func(ctx context.Context) error { return r.Run(relayhook.WithPerKeyLimit(ctx, h.PerKeyLimit)) }
}

// leaseConnect returns the leasers' connect function of source s: its
// own, unless the hooks give the leasers a database URL of their own.
func leaseConnect(h nodehook.Hooks, s *source) (func(context.Context) (*pgx.Conn, error), error) {
	if h.LeaseURL == "" {
		return s.connect, nil
	}
	cc, err := pgx.ParseConfig(h.LeaseURL)
	if err != nil {
		return nil, fmt.Errorf("lease URL (test hook): %w", err)
	}
	cc.RuntimeParams["synchronous_commit"] = "on"
	return func(ctx context.Context) (*pgx.Conn, error) {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		return pgx.ConnectConfig(cctx, cc.Copy())
	}, nil
}

// parts returns the built node's components, for nodehook.Hooks.Built.
func (b *built) parts() nodehook.Parts {
	p := nodehook.Parts{Publisher: b.broker}
	for _, s := range b.srcs {
		p.Sources = append(p.Sources, nodehook.SourceParts{Name: s.name, Relay: s.relay, Leaser: s.leaser})
	}
	return p
}
