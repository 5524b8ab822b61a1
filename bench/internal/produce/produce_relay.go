package produce

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ordo-relay/ordo/bench/internal/measure"

	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ordo-relay/ordo/bench/internal/harness"
	"github.com/ordo-relay/ordo/internal/testkit"
)

// The relayed variants run a relay on the run's database while the
// producers write: the producers' figures then include what the relay's
// reads and marks cost them (locks, WAL, CPU of a shared server), and the
// relay's own backends are measured apart (pg_relay_us_per_msg).
// ordo-sql-relay runs one Ordo node; classic-relay one classic relay
// instance (classic.go) on classic_outbox, as one API instance of the
// article would; adopted-relay one Ordo node relaying classic_outbox as it
// is (classicLayout). Either publishes to an exchange of the run's own, bound
// to a queue that keeps only its newest produceRelayQueueLen messages, so
// nothing needs consuming.

// produceRelayQueueLen bounds the run's queue (x-max-length, oldest
// dropped): the broker's memory stays small, and every message is routed.
const produceRelayQueueLen = 1000

// The classic relay's read and mark on classic_outbox: the oldest pending
// rows by occurred_at (the table's one index), in the columns of
// sqlClassicSelect. The table has no key, so each message is its own key
// (correlation id = id, key_seq 0); the exchange is the run's.
const (
	sqlClassicTableSelect = `
SELECT id, 0::int, id::text, 0::bigint, '', '` + RoutingKey + `', type, payload, NULL::jsonb, occurred_at
FROM classic_outbox
WHERE processed_at IS NULL
ORDER BY occurred_at
LIMIT $1
FOR UPDATE SKIP LOCKED`
	sqlClassicTableMark = `UPDATE classic_outbox SET processed_at = clock_timestamp() WHERE id = ANY($1::uuid[])`
)

// produceRelay is a relay started for one run.
type produceRelay struct {
	stop func() // stops the relay and removes the exchange and queue
}

// startProduceRelay declares the run's exchange and queue (both named
// name), starts v's relay on dbURL and waits until it is running and has
// published every row already in the table (the prefill), so that the
// window measures producers and relay in step.
func startProduceRelay(ctx context.Context, o Options, v *produceVariant, dbURL, name string,
	pending func(context.Context) (int, error)) (*produceRelay, error) {
	removeBroker, err := declareProduceBroker(ctx, o, name)
	if err != nil {
		return nil, err
	}
	var failed func() error
	r := &produceRelay{}
	if v.relay == relayClassic {
		r.stop, failed = startProduceClassic(o, dbURL, name)
	} else {
		var env []string
		if v.relay == relayAdopted {
			env = []string{"ORDO_TABLE_LAYOUT=" + classicLayout, "ORDO_TABLE_EXCHANGE=" + name}
		}
		node, err := harness.StartProcess(ctx, o.Harness(), name, dbURL, o.AMQPURL, env...)
		if err != nil {
			removeBroker()
			return nil, err
		}
		r.stop = func() {
			if _, err := node.Stop(harness.NodeStopTimeout); err != nil {
				fmt.Printf("bench: produce: stop node %s: %v\n", name, err)
			}
		}
		failed = node.Failed
		if err := node.WaitReady(ctx, o.Timeout); err != nil {
			r.stop()
			removeBroker()
			return nil, err
		}
	}
	stopRelay := r.stop
	r.stop = func() { stopRelay(); removeBroker() }
	err = harness.WaitUntil(ctx, o.Timeout, 50*time.Millisecond, "the relay published the prefill", func() (bool, error) {
		if err := failed(); err != nil {
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

// startProduceClassic runs one classic relay instance on classic_outbox
// until the returned stop.
func startProduceClassic(o Options, dbURL, name string) (stop func(), failed func() error) {
	poll := measure.DefaultClassicPolling() // the article's batch and interval
	c := &measure.ClassicRelay{Cfg: measure.ClassicConfig{
		Name: name, DBURL: dbURL, AMQPURL: o.AMQPURL, Batch: poll.ClassicBatch, Interval: poll.ClassicEvery,
		Select: sqlClassicTableSelect, Mark: sqlClassicTableMark, Exchange: name,
	}}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_ = c.Run(ctx) // nil once ctx ends; it retries errors itself
	}()
	return func() { cancel(); wg.Wait() }, func() error { return nil }
}

// declareProduceBroker declares the run's exchange and queue, both named
// name, and returns their removal.
func declareProduceBroker(ctx context.Context, o Options, name string) (remove func(), err error) {
	err = testkit.UseChannel(ctx, o.AMQPURL, func(ch *amqp.Channel) error {
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
	return func() {
		dctx, cancel := context.WithTimeout(context.Background(), harness.SetupTimeout)
		defer cancel()
		err := testkit.UseChannel(dctx, o.AMQPURL, func(ch *amqp.Channel) error {
			_, qerr := ch.QueueDelete(name, false, false, false)
			return errors.Join(qerr, ch.ExchangeDelete(name, false, false))
		})
		if err != nil {
			fmt.Printf("bench: produce: delete exchange and queue %s: %v\n", name, err)
		}
	}, nil
}

// classicLayout is classic_outbox's layout spec for a node adopting it:
// the article's table with snake-case names.
const classicLayout = "article;table=classic_outbox;id=id;type=type;routing_key=routing_key;payload=payload;" +
	"correlation_id=correlation_id;occurred_at=occurred_at;processed_at=processed_at"

// pendingRows counts the pending rows of v's table.
func pendingRows(ctx context.Context, q *pgxpool.Pool, v *produceVariant) (int, error) {
	table := "outbox"
	if v.relay == relayClassic || v.relay == relayAdopted {
		table = "classic_outbox"
	}
	var n int
	if err := q.QueryRow(ctx, `SELECT count(*) FROM `+table+` WHERE processed_at IS NULL`).Scan(&n); err != nil {
		return 0, fmt.Errorf("count pending rows: %w", err)
	}
	return n, nil
}
