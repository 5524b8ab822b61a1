package measure

import (
	"context"
	"time"

	"github.com/ordo-relay/ordo/bench/internal/harness"
	"github.com/ordo-relay/ordo/outbox"
)

// Harness returns the options the harness needs.
func (c Common) Harness() harness.Config {
	return harness.Config{PostgresURL: c.PostgresURL, AMQPURL: c.AMQPURL, Partitions: c.Partitions,
		ConfirmWindow: c.ConfirmWindow, NodeBin: c.NodeBin, Timeout: c.Timeout}
}

// NewRig creates a scenario's rig (harness.New: the database, migrated,
// with a pool of poolConns connections) and its topic exchange. On error,
// whatever was created is removed.
func NewRig(ctx context.Context, c Common, scenario string, poolConns int32) (*harness.Rig, error) {
	r, err := harness.New(ctx, c.Harness(), scenario, poolConns)
	if err != nil {
		return nil, err
	}
	if err := r.DeclareExchange(ctx); err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

// StartRigConsumer starts a consumer on r's exchange, stopped at r's
// close. durable makes its queue durable (and not exclusive), so that a
// persistent message's confirm waits for the broker's fsync.
func StartRigConsumer(ctx context.Context, r *harness.Rig, durable bool) (*Consumer, error) {
	c, err := startConsumer(ctx, r.Config.AMQPURL, r.Exchange, r.Name, durable)
	if err != nil {
		return nil, err
	}
	r.OnClose("stop consumer", func(context.Context) error { return c.Close() })
	return c, nil
}

// DropKeySeqTrigger drops the producers' key_seq trigger on r's database
// once the nodes run (outbox.DropKeySeqTrigger, which refuses while a
// node holding a lease has not recorded that it numbers rows), trying for
// up to 30 s: the rows then arrive without key_seq and the partition
// owners number them.
func DropKeySeqTrigger(ctx context.Context, r *harness.Rig) error {
	return harness.WaitUntil(ctx, 30*time.Second, 50*time.Millisecond, "the key_seq trigger dropped", func() (bool, error) {
		return outbox.DropKeySeqTrigger(ctx, r.Pool) == nil, nil
	})
}
