package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ordo-relay/ordo/bench/internal/harness"
	"github.com/ordo-relay/ordo/internal/testkit"
)

// rig is one scenario's private world: the harness's database (outbox
// installed, a pool on it) plus a topic exchange of the same name, and the
// bench's options. Everything a rig creates (consumers, nodes, proxies
// too) is registered with OnClose and removed by Close, last created
// first.
type rig struct {
	*harness.Rig
	o        options
	exchange string
	// durableQueue makes the consumer's queue durable (and not exclusive),
	// so that a persistent message's confirm waits for the broker's fsync.
	durableQueue bool
	nodes        int // nodes started, for unique names
}

// harness returns the options the harness needs.
func (o options) harness() harness.Config {
	return harness.Config{PostgresURL: o.PostgresURL, AMQPURL: o.AMQPURL, Partitions: o.Partitions,
		ConfirmWindow: o.ConfirmWindow, NodeBin: o.NodeBin, Timeout: o.Timeout}
}

// newRig creates the database (migrated, with a pool of poolConns
// connections) and the exchange. On error, whatever was created is removed.
func newRig(ctx context.Context, o options, scenario string, poolConns int32) (*rig, error) {
	h, err := harness.New(ctx, o.harness(), scenario, poolConns)
	if err != nil {
		return nil, err
	}
	r := &rig{Rig: h, o: o}
	if err := r.declareExchange(ctx); err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

// declareExchange declares the rig's topic exchange. It is auto-delete, so
// RabbitMQ removes it with the consumer's queue even if the bench dies
// before its cleanup.
func (r *rig) declareExchange(ctx context.Context) error {
	r.exchange = r.Name
	err := testkit.Channel(ctx, r.o.AMQPURL, func(ch *amqp.Channel) error {
		return ch.ExchangeDeclare(r.exchange, "topic", false, true, false, false, nil)
	})
	if err != nil {
		return fmt.Errorf("declare exchange %s: %w", r.exchange, err)
	}
	r.OnClose("delete exchange "+r.exchange, func(ctx context.Context) error {
		err := testkit.Channel(ctx, r.o.AMQPURL, func(ch *amqp.Channel) error {
			return ch.ExchangeDelete(r.exchange, false, false)
		})
		var aerr *amqp.Error
		if errors.As(err, &aerr) && aerr.Code == amqp.NotFound {
			return nil // auto-deleted with the queue already
		}
		return err
	})
	return nil
}

// startConsumer starts the rig's consumer, stopped at close.
func (r *rig) startConsumer(ctx context.Context) (*consumer, error) {
	c, err := startConsumer(ctx, r.o.AMQPURL, r.exchange, r.Name, r.durableQueue)
	if err != nil {
		return nil, err
	}
	r.OnClose("stop consumer", func(context.Context) error { return c.close() })
	return c, nil
}

// startNode starts a relay node on the rig's database, publishing to
// amqpURL (the broker, or a proxy in front of it). It is stopped at close
// if the scenario has not stopped it.
func (r *rig) startNode(ctx context.Context, amqpURL string) (*harness.Node, error) {
	r.nodes++
	return r.StartNode(ctx, fmt.Sprintf("%s-%d", r.Name, r.nodes), amqpURL)
}

// waitPending waits until no outbox row is pending and returns when that
// was first seen. abort (a relay that died, say) is checked on every poll.
func (r *rig) waitPending(ctx context.Context, abort func() error) (time.Time, error) {
	var at time.Time
	err := harness.WaitUntil(ctx, r.o.Timeout, 50*time.Millisecond, "no pending rows", func() (bool, error) {
		if err := abort(); err != nil {
			return false, err
		}
		p, err := r.Pending(ctx)
		at = time.Now()
		return p == 0, err
	})
	return at, err
}

// waitPendingWhere is waitPending for the rows whose key starts with none
// of skip (the poison groups' prefixes, whose rows stay pending).
func (r *rig) waitPendingWhere(ctx context.Context, abort func() error, skip []string) (time.Time, error) {
	if len(skip) == 0 {
		return r.waitPending(ctx, abort)
	}
	var at time.Time
	err := harness.WaitUntil(ctx, r.o.Timeout, 50*time.Millisecond, "no pending rows but the parked keys'", func() (bool, error) {
		if err := abort(); err != nil {
			return false, err
		}
		var n int
		err := r.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE processed_at IS NULL
AND NOT correlation_id LIKE ANY (SELECT p || '%' FROM unnest($1::text[]) AS p)`, skip).Scan(&n)
		if err != nil {
			return false, fmt.Errorf("count pending rows: %w", err)
		}
		at = time.Now()
		return n == 0, nil
	})
	return at, err
}

// parked returns how many outbox rows are parked.
func (r *rig) parked(ctx context.Context) (int, error) {
	var n int
	if err := r.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE parked_at IS NOT NULL AND processed_at IS NULL`).Scan(&n); err != nil {
		return 0, fmt.Errorf("count parked rows: %w", err)
	}
	return n, nil
}
