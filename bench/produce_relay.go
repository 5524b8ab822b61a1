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

// The ordo-sql-relay variant runs one relay node on the run's database
// while the producers write: the producers' figures then include what the
// relay's reads and marks cost them (locks, WAL, CPU of a shared server),
// and the relay's own backends are measured apart (pg_relay_us_per_msg).
// The node publishes to an exchange of the run's own, bound to a queue
// that keeps only its newest produceRelayQueueLen messages, so nothing
// needs consuming.

// produceRelayQueueLen bounds the run's queue (x-max-length, oldest
// dropped): the broker's memory stays small, and every message is routed.
const produceRelayQueueLen = 1000

// produceRelay is a relay node started for one run.
type produceRelay struct {
	node *harness.Node
	stop func() // stops the node and removes the exchange and queue
}

// startProduceRelay declares the run's exchange and queue (both named
// name), starts a node on dbURL and waits until it is ready and has
// published every row already in the outbox (the prefill), so that the
// window measures producers and relay in step.
func startProduceRelay(ctx context.Context, o options, dbURL, name string, pending func(context.Context) (int, error)) (*produceRelay, error) {
	err := testkit.Channel(ctx, o.AMQPURL, func(ch *amqp.Channel) error {
		if err := ch.ExchangeDeclare(name, "topic", false, false, false, false, nil); err != nil {
			return err
		}
		args := amqp.Table{"x-max-length": int32(produceRelayQueueLen), "x-overflow": "drop-head"}
		if _, err := ch.QueueDeclare(name, false, false, false, false, args); err != nil {
			return err
		}
		return ch.QueueBind(name, "#", name, false, nil)
	})
	if err != nil {
		return nil, fmt.Errorf("declare the relay's exchange and queue %s: %w", name, err)
	}
	removeBroker := func() {
		dctx, cancel := context.WithTimeout(context.Background(), harness.SetupTimeout)
		defer cancel()
		err := testkit.Channel(dctx, o.AMQPURL, func(ch *amqp.Channel) error {
			_, qerr := ch.QueueDelete(name, false, false, false)
			return errors.Join(qerr, ch.ExchangeDelete(name, false, false))
		})
		if err != nil {
			fmt.Printf("bench: produce: delete exchange and queue %s: %v\n", name, err)
		}
	}
	node, err := harness.StartProcess(ctx, o.harness(), name, dbURL, o.AMQPURL)
	if err != nil {
		removeBroker()
		return nil, err
	}
	r := &produceRelay{node: node, stop: func() {
		if _, err := node.Stop(harness.NodeStopTimeout); err != nil {
			fmt.Printf("bench: produce: stop node %s: %v\n", name, err)
		}
		removeBroker()
	}}
	if err := node.WaitReady(ctx, o.Timeout); err != nil {
		r.stop()
		return nil, err
	}
	err = harness.WaitUntil(ctx, o.Timeout, 50*time.Millisecond, "the relay published the prefill", func() (bool, error) {
		if err := node.Failed(); err != nil {
			return false, err
		}
		n, err := pending(ctx)
		return n == 0, err
	})
	if err != nil {
		r.stop()
		return nil, err
	}
	return r, nil
}
