package main

import (
	"context"

	"github.com/ordo-relay/ordo/bench/internal/harness"
)

// harness returns the options the harness needs.
func (c common) harness() harness.Config {
	return harness.Config{PostgresURL: c.PostgresURL, AMQPURL: c.AMQPURL, Partitions: c.Partitions,
		ConfirmWindow: c.ConfirmWindow, NodeBin: c.NodeBin, Timeout: c.Timeout}
}

// newRig creates a scenario's rig (harness.New: the database, migrated,
// with a pool of poolConns connections) and its topic exchange. On error,
// whatever was created is removed.
func newRig(ctx context.Context, c common, scenario string, poolConns int32) (*harness.Rig, error) {
	r, err := harness.New(ctx, c.harness(), scenario, poolConns)
	if err != nil {
		return nil, err
	}
	if err := r.DeclareExchange(ctx); err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

// startRigConsumer starts a consumer on r's exchange, stopped at r's
// close. durable makes its queue durable (and not exclusive), so that a
// persistent message's confirm waits for the broker's fsync.
func startRigConsumer(ctx context.Context, r *harness.Rig, durable bool) (*consumer, error) {
	c, err := startConsumer(ctx, r.Config.AMQPURL, r.Exchange, r.Name, durable)
	if err != nil {
		return nil, err
	}
	r.OnClose("stop consumer", func(context.Context) error { return c.close() })
	return c, nil
}
