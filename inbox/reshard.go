package inbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ordo-relay/ordo/wire"
)

// ErrInstancesRunning is returned by Reshard when an instance of the
// consumer is alive (a member row or a shard lease not expired): every
// instance must be stopped first.
var ErrInstancesRunning = errors.New("consumer instances are running: stop them all before changing the shard count")

// ReshardReport says what Reshard did.
type ReshardReport struct {
	From, To  int // shard counts
	Rebound   int // partitions whose shard changed
	Rerouted  int // messages moved from the old queues through the new bindings
	Deleted   int // queues deleted (shrinking)
	StoredMsg int // stored messages whose shard column changed
}

// Reshard changes consumer cfg.Name's shard count to cfg.Shards; the rest
// of cfg must match the installed topology. It is the documented
// drain-then-rebind operation (docs/consumer.md, "Changing S"):
//
//  1. refuse unless every instance is stopped (ErrInstancesRunning);
//  2. declare the new queues and bind every partition to its new shard,
//     then remove the old bindings that differ (between the two steps a
//     message may reach both queues: the inbox drops the second copy);
//  3. re-route the old queues' backlog through the new bindings, one
//     message at a time with a publisher confirm before its ack, and delete
//     the queues beyond the new count;
//  4. record the new count in the database and move the lease rows and
//     stored messages to their new shards.
//
// Producers may keep publishing throughout. A key whose messages end up in
// two queues (its backlog in the old one, newer messages in the new one)
// sees a gap, which the inbox stores until the older message arrives:
// order is kept by the inbox's key rows, not by the queues. If Reshard
// fails midway, run it again with the same cfg: every step is idempotent.
func Reshard(ctx context.Context, db DB, conn *amqp.Connection, cfg Config) (ReshardReport, error) {
	if err := cfg.Validate(); err != nil {
		return ReshardReport{}, err
	}
	to := TopologyOf(cfg)
	from, err := installed(ctx, db, to.Name)
	if err != nil {
		return ReshardReport{}, err
	}
	rep := ReshardReport{From: from.Shards, To: to.Shards}
	same := from
	same.Shards = to.Shards
	if !slices.Equal(same.Bindings, to.Bindings) || same.Exchange != to.Exchange || same.Partitions != to.Partitions {
		return rep, &TopologyMismatchError{Installed: from, Configured: to}
	}
	if err := refuseRunning(ctx, db, to.Name); err != nil {
		return rep, err
	}
	if err := rebind(conn, from, to, &rep); err != nil {
		return rep, err
	}
	if err := reroute(ctx, conn, from, to, &rep); err != nil {
		return rep, err
	}
	err = pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error { return recordShards(ctx, tx, to, &rep) })
	return rep, err
}

func installed(ctx context.Context, db DB, name string) (Topology, error) {
	t := Topology{Name: name}
	var mapping string
	err := db.QueryRow(ctx, sqlReadTopology, name).Scan(&t.Shards, &t.Partitions, &mapping, &t.Exchange, &t.Bindings)
	if errors.Is(err, pgx.ErrNoRows) {
		return t, fmt.Errorf("reshard %s: no topology installed (start the consumer once first)", name)
	}
	if err != nil {
		return t, fmt.Errorf("read installed topology: %w", err)
	}
	return t, nil
}

func refuseRunning(ctx context.Context, db DB, name string) error {
	var live int
	err := db.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM ordo_inbox_members WHERE consumer = $1 AND expires_at > now()) +
		(SELECT count(*) FROM ordo_inbox_leases WHERE consumer = $1 AND owner IS NOT NULL AND expires_at > now())`,
		name).Scan(&live)
	if err != nil {
		return fmt.Errorf("check for running instances: %w", err)
	}
	if live > 0 {
		return ErrInstancesRunning
	}
	return nil
}

// rebind binds each partition to its new shard, then unbinds it from the
// old one.
func rebind(conn *amqp.Connection, from, to Topology, rep *ReshardReport) error {
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("reshard: open channel: %w", err)
	}
	defer func() { _ = ch.Close() }()
	if err := to.Declare(ch); err != nil {
		return fmt.Errorf("reshard: %w", err)
	}
	for p := range to.Partitions {
		if from.ShardOf(p) == to.ShardOf(p) {
			continue
		}
		rep.Rebound++
		args := amqp.Table{"x-match": "all-with-x", wire.HeaderPartition: int32(p)}
		if err := ch.QueueUnbind(from.ShardQueue(from.ShardOf(p)), "", from.ShardsExchange(), args); err != nil {
			return fmt.Errorf("reshard: unbind partition %d: %w", p, err)
		}
	}
	return nil
}

// reroute moves every message that was in an old queue when it started
// through the shards exchange again, and deletes the queues past the new
// count once empty.
func reroute(ctx context.Context, conn *amqp.Connection, from, to Topology, rep *ReshardReport) error {
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("reshard: open channel: %w", err)
	}
	defer func() { _ = ch.Close() }()
	if err := ch.Confirm(false); err != nil {
		return fmt.Errorf("reshard: confirm mode: %w", err)
	}
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, 1))
	for i := range from.Shards {
		q, err := ch.QueueDeclarePassive(from.ShardQueue(i), true, false, false, false, nil)
		if err != nil {
			return fmt.Errorf("reshard: inspect %s: %w", from.ShardQueue(i), err)
		}
		for range q.Messages {
			moved, err := moveOne(ctx, ch, confirms, q.Name, to.ShardsExchange())
			if err != nil {
				return err
			}
			if !moved {
				break
			}
			rep.Rerouted++
		}
		if i >= to.Shards {
			if _, err := ch.QueueDelete(q.Name, false, true, false); err != nil {
				return fmt.Errorf("reshard: delete %s: %w", q.Name, err)
			}
			rep.Deleted++
		}
	}
	return nil
}

// moveOne republishes the head of queue to exchange and acks it once the
// broker confirmed the copy. It reports false when the queue was empty.
func moveOne(ctx context.Context, ch *amqp.Channel, confirms chan amqp.Confirmation, queue, exchange string) (bool, error) {
	d, ok, err := ch.Get(queue, false)
	if err != nil || !ok {
		return false, err
	}
	err = ch.PublishWithContext(ctx, exchange, d.RoutingKey, false, false, amqp.Publishing{
		Headers: d.Headers, ContentType: d.ContentType, DeliveryMode: amqp.Persistent, CorrelationId: d.CorrelationId,
		MessageId: d.MessageId, Timestamp: d.Timestamp, Type: d.Type, Body: d.Body,
	})
	if err != nil {
		return false, fmt.Errorf("reshard: republish %s: %w", d.MessageId, err)
	}
	select {
	case c := <-confirms:
		if !c.Ack {
			return false, fmt.Errorf("reshard: republish %s: nacked", d.MessageId)
		}
	case <-time.After(30 * time.Second):
		return false, fmt.Errorf("reshard: republish %s: no confirm within 30s", d.MessageId)
	}
	if err := d.Ack(false); err != nil {
		return false, fmt.Errorf("reshard: ack %s: %w", d.MessageId, err)
	}
	return true, nil
}

func recordShards(ctx context.Context, tx pgx.Tx, to Topology, rep *ReshardReport) error {
	if _, err := tx.Exec(ctx, `UPDATE ordo_inbox_topology SET shards = $2 WHERE consumer = $1`, to.Name, to.Shards); err != nil {
		return fmt.Errorf("record shard count: %w", err)
	}
	if _, err := tx.Exec(ctx, `DELETE FROM ordo_inbox_leases WHERE consumer = $1 AND shard >= $2`, to.Name, to.Shards); err != nil {
		return fmt.Errorf("drop lease rows: %w", err)
	}
	if _, err := tx.Exec(ctx, sqlSeedLeases, to.Name, to.Shards); err != nil {
		return fmt.Errorf("create lease rows: %w", err)
	}
	tag, err := tx.Exec(ctx, `UPDATE ordo_inbox_messages SET shard = partition % $2
		WHERE consumer = $1 AND shard <> partition % $2`, to.Name, to.Shards)
	if err != nil {
		return fmt.Errorf("move stored messages: %w", err)
	}
	rep.StoredMsg = int(tag.RowsAffected())
	return nil
}
